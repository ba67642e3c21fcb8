"""docs/commands.md, the command reference, has a section for every subcommand that names every
one of its options and says its exit statuses (so an option added to the parser and left out of
the reference fails here). The README points to it."""

from __future__ import annotations

import argparse
import itertools
import re
from pathlib import Path

from ladder.cli.main import build_parser
from ladder.predict.watch.alerts import exit_code_for

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "commands.md"
GLOBAL = {"--help", "--verbose", "--quiet"}  # documented once, under "Everywhere"


def sections(text: str) -> dict[str, str]:
    """'## `ladder NAME`' -> the text up to the next '## '."""
    parts = re.split(r"^## `ladder (\w+)`\n", text, flags=re.M)
    return {name: body.split("\n## ", 1)[0] for name, body in zip(parts[1::2], parts[2::2])}


def long_options(sub: argparse.ArgumentParser) -> set[str]:
    return {o for a in sub._actions for o in a.option_strings if o.startswith("--")} - GLOBAL


def subparsers() -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in build_parser()._actions
                if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_subcommand_and_option_is_in_the_reference():
    found = sections(DOC.read_text())
    subs = subparsers()
    assert set(subs) == set(found), (sorted(subs), sorted(found))
    missing = {name: sorted(o for o in long_options(sub) if f"`{o}" not in found[name])
               for name, sub in subs.items()}
    assert not any(missing.values()), {k: v for k, v in missing.items() if v}
    for name, body in found.items():
        assert "Exit status:" in body, name


def test_watch_reference_gives_each_exit_status():
    line = next(par for par in sections(DOC.read_text())["watch"].split("\n\n")
                if par.startswith("Exit status:"))
    codes = {exit_code_for(w, na) for w, na in
             itertools.product([None, "info", "warn", "critical"], [False, True])}
    for code in codes | {64}:
        assert re.search(rf"\b{code}\b", line), code


def test_the_checker_sees_a_missing_option():
    text = "## `ladder a`\nOptions: `--x`.\n## `ladder b`\nOptions: none.\n"
    assert sections(text) == {"a": "Options: `--x`.\n", "b": "Options: none.\n"}
    assert "`--y" not in sections(text)["a"]


def test_the_readme_points_to_the_reference():
    assert "docs/commands.md" in (ROOT / "README.md").read_text()


PATH_REF = re.compile(r"\b((?:ladder|bench|tests|docs)/[\w./-]*\w\.(?:py|toml|md|png))\b")


def test_the_files_the_reference_and_the_readme_name_exist():
    """A module moved or renamed leaves no stale path in either document."""
    for doc in (DOC, ROOT / "README.md"):
        named = set(PATH_REF.findall(doc.read_text()))
        assert len(named) >= 10, (doc, sorted(named))
        missing = sorted(p for p in named if not (ROOT / p).exists())
        assert not missing, f"{doc.name} names files that do not exist: {missing}"
