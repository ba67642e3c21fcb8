"""Every subcommand's --help opens with a one-line description and ends with an example that
parses; `watch --help` lists the exit statuses the watcher can return (issue 36, item 5)."""

from __future__ import annotations

import argparse
import itertools
import shlex

import pytest

from ladder.cli.main import build_parser
from ladder.predict.watch.alerts import exit_code_for


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def examples(epilog: str) -> list[str]:
    """The command lines after the epilog's last 'example' heading (a line ending in a
    backslash goes on on the next one)."""
    text = epilog[epilog.rindex("example"):].split("\n", 1)[1]
    text = text.replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip()]


def test_every_subcommand_has_a_description_and_an_example():
    found = subparsers()
    assert len(found) >= 13, sorted(found)
    for name, sub in found.items():
        desc = sub.description or ""
        assert desc.strip() and "\n" not in desc and desc.endswith("."), (name, desc)
        assert sub.epilog and "example" in sub.epilog, name
        lines = examples(sub.epilog)
        assert lines and all(line.startswith(f"ladder {name} ") for line in lines), (name, lines)
        # the help a user sees ends with the example
        assert sub.format_help().rstrip().endswith(lines[-1].split()[-1]), name


@pytest.mark.parametrize("name", sorted(subparsers()))
def test_the_examples_parse(name):
    for line in examples(subparsers()[name].epilog):
        argv = shlex.split(line)[1:]
        args, extra = build_parser().parse_known_args(argv)
        assert args.command == name and not extra, (line, extra)


def test_watch_help_lists_every_exit_status_the_watcher_returns():
    epilog = subparsers()["watch"].epilog
    listed = {line.split()[0] for line in epilog.splitlines() if line.startswith("  ")
              and line.split()[0].rstrip("+").isdigit()}
    codes = {exit_code_for(worst, na) for worst, na in
             itertools.product([None, "info", "warn", "critical"], [False, True])}
    assert {str(c) for c in codes} | {"64+"} == listed, listed


def test_a_broken_example_would_be_caught():
    with pytest.raises(SystemExit):
        build_parser().parse_known_args(["watch", "prereg.json"])  # --source is required
    assert examples("x\nexample:\n  ladder a b \\\n      c\n") == ["ladder a b        c"]
