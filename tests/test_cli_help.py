"""Every subcommand's --help opens with a one-line description and ends with an example that
parses; `watch --help` lists the exit statuses the watcher can return; the first day's commands in
`ladder --help` and in the README's walk-through parse, and train the target only after its
forecast is registered (issue 36, item 5)."""

from __future__ import annotations

import argparse
import itertools
import shlex
from pathlib import Path

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


def command_lines(text: str, prompt: bool) -> list[str]:
    """The `ladder` command lines of a text (with ``prompt``, only those after a shell prompt
    '$ '), continuations joined, comments dropped."""
    text = text.replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        if prompt:
            line = line.split("$ ", 1)[1] if "$ ladder " in line else ""
        line = line.strip()
        if line.startswith("ladder "):
            found.append(line.split("#", 1)[0].strip())
    return found


def test_the_first_day_in_the_main_help_and_the_readme_parses():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    walk = readme[readme.index("## The first day"):readme.index("\n## ", readme.index(
        "## The first day") + 1)]
    for where, prompt in ((build_parser().epilog, False), (walk, True)):
        lines = command_lines(where, prompt)
        assert len(lines) >= 6, lines
        for line in lines:
            args, extra = build_parser().parse_known_args(shlex.split(line)[1:])
            assert not extra, (line, extra)
    # the rungs are trained without the target, and the target only after it is registered
    steps = command_lines(walk, prompt=True)
    order = [ln.split()[1] for ln in steps]
    assert order.index("preregister") < max(i for i, c in enumerate(order) if c == "run")
    assert all("--rung" in ln for ln in steps if ln.startswith("ladder run "))
