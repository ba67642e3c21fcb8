"""Command-line conventions: every option documents its default, `python -m ladder`, --json on fit,
verify and watch, `fit` writes law.json by default and says where, artifacts readable by the team
(0644; the pre-registration 0444), quiet on a closed pipe, -q/-v, the browser-test rule of CI."""

import argparse
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ladder.cli.main import _Formatter, build_parser, main
from tests import synthetic as sy

ROOT = Path(__file__).resolve().parents[1]


def _subparsers(parser):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return a.choices
    return {}


def test_every_option_has_help_that_shows_its_default():
    parser = build_parser()
    fmt = _Formatter("ladder")
    missing = []
    for name, sub in {"": parser, **_subparsers(parser)}.items():
        for a in sub._actions:
            if not a.option_strings or a.dest in ("help", "version"):
                continue
            text = fmt._get_help_string(a) % {"default": a.default}
            if not a.help or not ("default" in text or "(required)" in text):
                missing.append(f"{name} {a.option_strings[0]}")
    assert missing == []


def test_key_value_overrides_are_not_a_positional_argument():
    usage = _subparsers(build_parser())["run"].format_usage()
    assert "--key=value" not in usage and "LADDER[:RUNG]" in usage
    assert "--key=value" in _subparsers(build_parser())["run"].format_help()  # the epilog


@pytest.mark.heavy  # 19 s on 2 busy cores
def test_python_dash_m_ladder_and_a_closed_pipe():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "ladder", "--version"], capture_output=True,
                       text=True, cwd=ROOT, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("ladder ")
    # the reader is gone before the first line is written (`| true`; `| head` once it has its
    # lines): no traceback, no "Exception ignored" at exit, the status of a SIGPIPE
    for reader in ("true", "head -1"):
        r = subprocess.run(f"'{sys.executable}' -m ladder list | {reader}; "
                           f"echo \"rc=${{PIPESTATUS[0]}}\"", shell=True, executable="/bin/bash",
                           capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
        assert "Traceback" not in r.stderr and "Exception" not in r.stderr, r.stderr
        assert r.stdout.strip().endswith(("rc=141", "rc=0")), r.stdout
    assert "rc=141" in subprocess.run(f"'{sys.executable}' -m ladder list | true; echo "
                                      f"\"rc=${{PIPESTATUS[0]}}\"", shell=True,
                                      executable="/bin/bash", capture_output=True, text=True,
                                      cwd=ROOT, env=env, timeout=60).stdout


@pytest.fixture
def points_csv(tmp_path):
    pts = sy.points_table([sy.make_run(sy.Truth(), t, seed=i)
                           for i, t in enumerate(sy.ladder_targets(5, steps0=60))])
    path = tmp_path / "pts.csv"
    pts.to_csv(path, index=False)
    return path


@pytest.mark.heavy  # 6 s on 2 busy cores
def test_fit_writes_law_json_by_default_readable_by_the_team(points_csv, tmp_path, monkeypatch,
                                                             capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["fit", str(points_csv), "--form", "compute", "--bootstrap", "5"]) == 0
    out = capsys.readouterr().out
    assert "wrote law.json" in out
    law = tmp_path / "law.json"
    assert stat.S_IMODE(law.stat().st_mode) == 0o644
    assert main(["fit", str(points_csv), "--form", "compute", "--bootstrap", "5", "--json",
                 "--out", "law2.json"]) == 0
    cap = capsys.readouterr()
    doc = json.loads(cap.out)  # stdout is the JSON alone; where it wrote goes to stderr
    assert doc["form"] == "compute" and "wrote law2.json" in cap.err
    assert json.loads((tmp_path / "law2.json").read_text())["params"] == doc["params"]

    prereg = tmp_path / "prereg.json"
    assert main(["preregister", "law.json", "--target", "tiny:12.8K-A3.8K",
                 "--out", str(prereg)]) == 0
    assert stat.S_IMODE(prereg.stat().st_mode) == 0o444
    capsys.readouterr()
    assert main(["verify", str(prereg), "--json"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert v["ok"] is True and v["computed"] == v["stored"]
    # watch --json: one object; -q: no informational lines on stderr
    rows = sy.make_run(sy.Truth(), sy.ladder_targets(4, steps0=150)[-1], seed=1).rows
    src = tmp_path / "m.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = main(["-q", "watch", str(prereg), "--source", str(src), "--json"])
    cap = capsys.readouterr()
    verdict = json.loads(cap.out)
    assert verdict["exit"] == code and verdict["schema"] == "watch-verdict/1"
    assert isinstance(verdict["alerts"], list) and "ladder watch: following" not in cap.err
    main(["watch", str(prereg), "--source", str(src)])
    assert "ladder watch: following" in capsys.readouterr().err


@pytest.mark.heavy  # 13 s on 2 busy cores
def test_browser_tests_fail_under_ci_when_chromium_is_missing(tmp_path):
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_b.py").write_text("def test_needs(chromium):\n    pass\n")
    bare = dict(os.environ, PATH=str(Path(sys.executable).parent))  # no chromium on PATH
    bare.pop("CI", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=bare, timeout=120)
    assert r.returncode == 0 and "1 skipped" in r.stdout, r.stdout
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path,
                       env=dict(bare, CI="true"), timeout=120)
    assert r.returncode == 1 and "must run" in r.stdout, r.stdout


async def _write():
    pass


def test_a_coroutine_dropped_unawaited_is_not_a_warning_of_the_command(monkeypatch, capsys):
    """CI once saw "ladder run: warning: coroutine '...write_fragment' was never awaited" after
    a one-line error: Orbax's writes of a save abandoned (a full disk) in an earlier test, reached
    by the garbage collector during this command. The command's own warnings still print, and
    the commands that record warnings to word them (fit, compare, demo) leave it out too."""
    import warnings

    import ladder.cli.main as cli
    from ladder.cli.output import recorded_warnings

    def run(args):
        _write()    # created and dropped at once: Python warns here that it was never awaited
        warnings.warn("compute law: the band holds none", UserWarning, stacklevel=2)
        with recorded_warnings() as caught:
            _write()
            warnings.warn("trajectory law: fractions extrapolated", UserWarning, stacklevel=2)
        assert [str(w.message) for w in caught] == ["trajectory law: fractions extrapolated"]
        return 0
    monkeypatch.setattr(cli, "_run", run)
    assert main(["list"]) == 0
    assert capsys.readouterr().err == "ladder list: warning: compute law: the band holds none\n"
