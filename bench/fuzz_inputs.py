"""Adversarial inputs for every command: each must give a one-line error (exit 64+), never a
traceback, a hang, or exit 0 (issue 15).

A small but complete world (a tiny-ladder runs directory, a points CSV, a fitted law.json, a
target spec, a pre-registration, a watch source) is built once; every case copies it, breaks one
thing (a file, a field, an argument) and runs the command in-process through ``ladder.cli.main``
under an alarm. The verdicts:

- ``error``: exit 64+ with a one-line message that names the file or the field (good);
- ``unnamed``: exit 64+, but the message names neither the file nor the field;
- ``traceback``: an exception escaped ``main``;
- ``accepted``: exit below 64 for a bad input;
- ``hang``: still running after the alarm.

``tests/test_inputs_fuzz.py`` runs the issue's cases and a sample of the corpus, and a
hypothesis-driven search, in the default suite; this script runs the whole corpus and prints the
table (exit 1 if any case is a traceback, a hang, accepted or unnamed):

    /work/main/.venv/bin/python bench/fuzz_inputs.py [--only SUBSTRING] [-v]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ALARM_S = 20  # a command on the tiny world takes well under a second; 20 s is a hang


class Hang(Exception):
    pass


@dataclass
class Outcome:
    verdict: str  # error | unnamed | traceback | accepted | hang
    code: int | None
    message: str  # the last stderr line (or the traceback's last line)
    seconds: float


# ----------------------------------------------------------------------------- the world


def build_world(root: Path) -> Path:
    """Write the valid world under ``root`` and return it (about 2 s, mostly the fit)."""
    from predict.forecast import Target
    from tests.helpers import KNOWN_LAW, write_law_runs

    E, A, alpha = KNOWN_LAW   # the runs' law (tests/test_fit_cli.py's too)
    runs = root / "runs"
    lad = write_law_runs(runs)
    code, _, err = run_cli(["fit", str(runs), "--form", "compute", "--bootstrap", "20",
                            "--out", str(root / "law.json")])
    assert code == 0, err
    target = Target.from_rung(lad.target)
    (root / "target.json").write_text(json.dumps(target.to_dict()))
    code, _, err = run_cli(["preregister", str(root / "law.json"), "--target-spec",
                            str(root / "target.json"), "--out", str(root / "pre" / "prereg.json"),
                            "--eval-noise", "0.003"])
    assert code == 0, err
    # the target's own run, healthy, as the watch source
    t = lad.target
    rows = []
    for step in t.eval_steps():
        tokens = step * t.tokens_per_step
        C = t.compute(tokens)
        rows.append({"step": step, "tokens": tokens, "progress": step / t.steps, "time": 0.0,
                     "eval_dropless/loss": E + A * C ** -alpha, "train/loss": 2.0})
    (root / "live.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    points = root / "points.csv"
    points.write_text("run,params,active_params,tokens,compute,fraction,loss\n" + "".join(
        f"r{i},{1e6 * 2 ** i},{1e5 * 2 ** i},{2e7 * 2 ** i},{1e15 * 4 ** i},1.0,"
        f"{E + A * (1e15 * 4 ** i) ** -alpha}\n" for i in range(5)))
    return root


def run_cli(argv: list[str], alarm: float = ALARM_S) -> tuple[int | None, str, str]:
    """``ladder.cli.main(argv)`` in-process; (exit code, stdout, stderr). Exceptions escape."""
    from ladder.cli import main
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, alarm)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                code = main(argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return code, out.getvalue(), err.getvalue()


def _on_alarm(signum, frame):
    raise Hang()


def judge(argv: list[str], names: tuple[str, ...] = (), *, bad: bool = True,
          alarm: float = ALARM_S) -> Outcome:
    """Run one case and classify it. ``names``: strings of which the error line must hold one
    (the file's name, the field); ``bad=False``: a tolerated input (exit status free, but no
    traceback or hang)."""
    t0 = time.perf_counter()
    try:
        code, _, err = run_cli(argv, alarm)
    except Hang:
        return Outcome("hang", None, "", time.perf_counter() - t0)
    except BaseException as e:  # noqa: BLE001 - the point: anything escaping is a finding
        return Outcome("traceback", None, f"{type(e).__name__}: {e}"[:300],
                       time.perf_counter() - t0)
    dt = time.perf_counter() - t0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if "Traceback (most recent call last)" in err:
        return Outcome("traceback", code, last, dt)
    if not bad:
        return Outcome("error" if code and code >= 64 else "tolerated", code, last, dt)
    if code is None or code < 64:
        return Outcome("accepted", code, last, dt)
    if names and not any(alias in last for n in names for alias in _aliases(n)):
        return Outcome("unnamed", code, last, dt)
    return Outcome("error", code, last, dt)


def _aliases(name: str) -> tuple[str, ...]:
    """An option is named as given (``--max-seconds``) or as its field (``max_seconds``)."""
    if name.startswith("--"):
        bare = name[2:]
        return (name, f"'{bare}'", f"'{bare.replace('-', '_')}'")
    return (name,)


# ----------------------------------------------------------------------------- the corpus

# Values that must never pass where a number is expected.
BAD_NUMBERS = ["nan", "inf", "-inf", "1e400", "-1", "0", "1e30", "9" * 5000, "1.5", "abc", ""]
BAD_JSON_VALUES = ['"NaN"', "1e400", "-1", "0", "9" * 5000, "true", "null", '"x"', "[]", "{}",
                   "[" * 100_000 + "]" * 100_000, "-1e308", "1e308"]


@dataclass
class Case:
    name: str
    build: Callable[[Path], list[str]]  # world copy -> argv (may edit files first)
    names: tuple[str, ...] = ()
    bad: bool = True


def _edit_json(path: Path, dotted: str, raw: str) -> None:
    """Set ``dotted`` in the JSON file to the raw JSON text ``raw`` (written textually, so
    overlong integers and deep nesting survive)."""
    obj = json.loads(path.read_text())
    marker = "__FUZZ__"
    cur = obj
    parts = dotted.split(".")
    for p in parts[:-1]:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    if isinstance(cur, list):
        cur[int(parts[-1])] = marker
    else:
        cur[parts[-1]] = marker
    text = json.dumps(obj).replace(f'"{marker}"', raw)
    path.chmod(0o644)
    path.write_text(text)


def _del_json(path: Path, key: str) -> None:
    obj = json.loads(path.read_text())
    obj.pop(key, None)
    path.write_text(json.dumps(obj))


def _rung_dir(w: Path) -> Path:
    return sorted((w / "runs" / "tiny").iterdir())[0]


def corpus() -> list[Case]:
    """The named cases: every failure issue 15 lists, and their neighbours."""
    C: list[Case] = []
    add = C.append
    law, tgt, pre = "law.json", "target.json", "prereg.json"

    def prereg(w):
        return str(w / "pre" / pre)

    # a directory, a missing file, an empty file, binary junk, where a file is expected
    for what, make in (("dir", lambda p: p.mkdir()), ("empty", lambda p: p.write_text("")),
                       ("junk", lambda p: p.write_bytes(b"\xff\xfe\x00garbage")),
                       ("missing", lambda p: None), ("deep", lambda p: p.write_text(
                           "[" * 200_000 + "]" * 200_000)), ("list", lambda p: p.write_text("[]")),
                       ("bigint", lambda p: p.write_text('{"schema": ' + "9" * 5000 + "}"))):
        def mk(w, make=make):
            p = w / "bad" / "x.json"
            p.parent.mkdir(exist_ok=True)
            make(p)
            return p
        add(Case(f"predict law {what}", lambda w, mk=mk: ["predict", str(mk(w)), "--compute",
                                                          "1e20"], ("x.json",)))
        add(Case(f"preregister law {what}", lambda w, mk=mk: [
            "preregister", str(mk(w)), "--target-spec", str(w / tgt), "--out",
            str(w / "new.json")], ("x.json",)))
        add(Case(f"preregister target-spec {what}", lambda w, mk=mk: [
            "preregister", str(w / law), "--target-spec", str(mk(w)), "--out",
            str(w / "new.json")], ("x.json",)))
        add(Case(f"verify {what}", lambda w, mk=mk: ["verify", str(mk(w))], ("x.json",)))
        add(Case(f"watch prereg {what}", lambda w, mk=mk: [
            "watch", str(mk(w)), "--source", str(w / "live.jsonl")], ("x.json",)))
        add(Case(f"watch state {what}", lambda w, mk=mk: [
            "watch", prereg(w), "--source", str(w / "live.jsonl"), "--state", str(mk(w))],
            ("x.json",), bad=what != "missing"))  # a missing state is a first start
        add(Case(f"report law {what}", lambda w, mk=mk: [
            "report", "--law", str(mk(w)), "--out", str(w / "rep")], ("x.json",)))
        add(Case(f"report prereg {what}", lambda w, mk=mk: [
            "report", "--prereg", str(mk(w)), "--out", str(w / "rep")], ("x.json",)))
        add(Case(f"run config {what}", lambda w, mk=mk: [
            "run", "tiny", "--config", str(mk(w)), "--out", str(w / "train")], ("x.json",)))
        add(Case(f"fit csv {what}", lambda w, mk=mk: [
            "fit", str(_as(mk(w), ".csv")), "--bootstrap", "0"], ("x.csv",)))
        add(Case(f"watch source {what}", lambda w, mk=mk: [
            "watch", prereg(w), "--source", str(_as(mk(w), ".jsonl"))], ("x.jsonl", "source"),
            bad=what in ("dir", "missing")))

    # one bad line in a metrics.jsonl: tolerated (skipped with a note), never a crash
    for what, line in (("bigint", '{"step": ' + "9" * 5000 + "}"),
                       ("deep", "[" * 100_000 + "]" * 100_000),
                       ("deepobj", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"),
                       ("junk", "\xff garbage"), ("step1e30", '{"step": 1e30, "eval_dropless/loss'
                                                   '": 2.0}'),
                       ("negstep", '{"step": -5, "eval_dropless/loss": 2.0}'),
                       ("bigloss", '{"step": 7, "eval_dropless/loss": ' + "9" * 5000 + "}")):
        def poison(w, line=line):
            for d in (w / "runs" / "tiny").iterdir():
                with open(d / "metrics.jsonl", "a", encoding="utf-8",
                          errors="surrogateescape") as f:
                    f.write(line + "\n")
            with open(w / "live.jsonl", "a", encoding="utf-8", errors="surrogateescape") as f:
                f.write(line + "\n")
            return w
        add(Case(f"fit runs line {what}", lambda w, p=poison: [
            "fit", str(p(w) / "runs"), "--form", "compute", "--bootstrap", "0"], bad=False))
        add(Case(f"report runs line {what}", lambda w, p=poison: [
            "report", "--runs", str(p(w) / "runs"), "--out", str(w / "rep")], bad=False))
        add(Case(f"preregister runs line {what}", lambda w, p=poison: [
            "preregister", str(p(w) / law), "--target-spec", str(w / tgt), "--runs",
            str(w / "runs"), "--out", str(w / "new.json")], bad=False))
        add(Case(f"watch source line {what}", lambda w, p=poison: [
            "watch", prereg(p(w)), "--source", str(w / "live.jsonl")], bad=False))
        add(Case(f"report target-run line {what}", lambda w, p=poison: [
            "report", "--target-run", str(_rung_dir(p(w))), "--prereg", prereg(w), "--out",
            str(w / "rep")], bad=False))

    # a bad *.json beside the pre-registration: verify and watch go on (it is not in the chain)
    for what, text in (("junk", "{nope"), ("deep", "[" * 100_000 + "]" * 100_000),
                       ("bigint", '{"schema": "prereg/1", "amends": {"sha256": ' + "9" * 5000
                        + "}}")):
        def beside(w, text=text):
            (w / "pre" / "other.json").write_text(text)
            return w
        add(Case(f"verify beside {what}", lambda w, b=beside: ["verify", prereg(b(w))],
                 bad=False))
        add(Case(f"watch beside {what}", lambda w, b=beside: [
            "watch", prereg(b(w)), "--source", str(w / "live.jsonl")], bad=False))

    # an output that cannot be written (found before the work, not after it)
    for what, make in (("dir", lambda p: p.mkdir(parents=True)),
                       ("under-file", lambda p: (p.parent.parent.mkdir(exist_ok=True),
                                                 p.parent.write_text("a file")))):
        def out(w, make=make):
            p = w / "o" / "sub" / "out.json"
            make(p)
            return str(p)
        add(Case(f"fit --out {what}", lambda w, o=out: [
            "fit", str(w / "points.csv"), "--bootstrap", "0", "--out", o(w)], ("out.json", "sub")))
        add(Case(f"preregister --out {what}", lambda w, o=out: [
            "preregister", str(w / law), "--target-spec", str(w / tgt), "--out", o(w)],
            ("out.json", "sub")))
        add(Case(f"report --out {what}", lambda w, o=out: [
            "report", "--law", str(w / law), "--out", o(w)], ("out.json", "sub"),
            bad=what != "dir"))  # a report's --out is a directory
        add(Case(f"watch --alerts {what}", lambda w, o=out: [
            "watch", prereg(w), "--source", str(w / "live.jsonl"), "--alerts", o(w)],
            ("out.json", "sub")))
        add(Case(f"watch --state {what}", lambda w, o=out: [
            "watch", prereg(w), "--source", str(w / "live.jsonl"), "--state", o(w)],
            ("out.json", "sub")))

    # write-once: an ordinary write onto the pre-registration
    add(Case("fit --out prereg", lambda w: ["fit", str(w / "points.csv"), "--bootstrap", "0",
                                            "--out", prereg(w)], (pre,)))
    add(Case("report --out onto prereg dir file", lambda w: [
        "report", "--law", str(w / law), "--out", prereg(w)], (pre,)))
    add(Case("preregister --out existing", lambda w: [
        "preregister", str(w / law), "--target-spec", str(w / tgt), "--out", prereg(w)], (pre,)))

    # a tampered pre-registration: report and watch verify before they use it
    def tamper(w):
        p = w / "pre" / pre
        p.chmod(0o644)
        doc = json.loads(p.read_text())
        doc["final"]["loss"] = 1.0
        p.write_text(json.dumps(doc))
        return str(p)
    add(Case("report tampered prereg", lambda w: ["report", "--prereg", tamper(w), "--out",
                                                  str(w / "rep")], (pre,)))
    add(Case("watch tampered prereg", lambda w: ["watch", tamper(w), "--source",
                                                 str(w / "live.jsonl")], (pre,)))

    # numbers in a law
    for field_, vals in (("uncertainty.level", ["1.5", "0", "-1", '"x"', "1e400", "null"]),
                         ("uncertainty.sigma_log", ["-0.1", "1e400", '"x"']),
                         # fit.u holds the law's parameters (logs of coefficients, exponents)
                         ("fit.u.0", ["1e308", "1e400", "9" * 5000, '"x"', "null"]),
                         ("fit.u.1", ["1e308", "-1e308", "1e400", "800"]),
                         ("fit.u.2", ["1e308", "-1e308", "-800"])):
        for v in vals:
            def lw(w, field_=field_, v=v):
                _edit_json(w / law, field_, v)
                return str(w / law)
            add(Case(f"predict law {field_}={v[:12]}", lambda w, lw=lw: [
                "predict", lw(w), "--compute", "1e20"], (law, field_)))
            add(Case(f"preregister law {field_}={v[:12]}", lambda w, lw=lw: [
                "preregister", lw(w), "--target-spec", str(w / tgt), "--out",
                str(w / "new.json")], (law, field_)))
    # numbers in a target spec
    for field_, vals in (("steps", ["0", "-1", "1.5", "1e30", "9" * 5000, '"x"', "null"]),
                         ("tokens", ["0", "-1", "1e400", '"x"']),
                         ("params", ["0", "-1", "1e400"]), ("compute", ["0", "1e400"]),
                         ("seq_len", ["0", "1.5", "-3"]), ("batch", ["0", "-1", "1.5", '"x"']),
                         ("eval_steps", ['"x"', "[-1]", "[1.5]", "[1e30]", '["a"]', "5"]),
                         ("schedule", ['{"kind": "nonsense"}', "5", '"nonsense"'])):
        for v in vals:
            def ts(w, field_=field_, v=v):
                _edit_json(w / tgt, field_, v)
                return str(w / tgt)
            add(Case(f"preregister target {field_}={v[:12]}", lambda w, ts=ts: [
                "preregister", str(w / law), "--target-spec", ts(w), "--out",
                str(w / "new.json")], (tgt, field_)))
    for field_ in ("eval_steps", "batch", "steps"):
        def dl(w, field_=field_):
            _del_json(w / tgt, field_)
            return str(w / tgt)
        add(Case(f"preregister target without {field_}", lambda w, dl=dl: [
            "preregister", str(w / law), "--target-spec", dl(w), "--out", str(w / "new.json")],
            (tgt, field_), bad=field_ == "steps"))

    # command-line numbers
    def cli(argv_of, names, bad=True):
        return argv_of, names, bad
    opts = [
        ("predict --level", lambda w, v: ["predict", str(w / law), "--compute", "1e20", "--level",
                                          v], ("--level",)),
        ("predict --compute", lambda w, v: ["predict", str(w / law), "--compute", v],
         ("--compute",)),
        ("predict --fraction", lambda w, v: ["predict", str(w / law), "--compute", "1e20",
                                             "--fraction", v], ("--fraction",)),
        ("fit --level", lambda w, v: ["fit", str(w / "points.csv"), "--level", v, "--bootstrap",
                                      "0"], ("--level",)),
        ("fit --bootstrap", lambda w, v: ["fit", str(w / "points.csv"), "--bootstrap", v],
         ("--bootstrap",)),
        ("preregister --level", lambda w, v: ["preregister", str(w / law), "--target-spec",
                                              str(w / tgt), "--level", v, "--out",
                                              str(w / "n.json")], ("--level",)),
        ("preregister --eval-noise", lambda w, v: ["preregister", str(w / law), "--target-spec",
                                                   str(w / tgt), "--eval-noise", v, "--out",
                                                   str(w / "n.json")], ("--eval-noise",)),
        ("watch --poll", lambda w, v: ["watch", prereg(w), "--source", str(w / "live.jsonl"),
                                       "--follow", "--poll", v, "--max-seconds", "0.5"],
         ("--poll",)),
        ("watch --max-seconds", lambda w, v: ["watch", prereg(w), "--source",
                                              str(w / "live.jsonl"), "--follow",
                                              "--max-seconds", v], ("--max-seconds",)),
        ("plan --devices", lambda w, v: ["plan", "tiny", "--devices", v], ("--devices",)),
        ("plan --peak-flops", lambda w, v: ["plan", "tiny", "--peak-flops", v],
         ("--peak-flops",)),
        ("plan --mfu", lambda w, v: ["plan", "tiny", "--mfu", v], ("--mfu",)),
        ("run --lr", lambda w, v: ["run", "tiny", "--out", str(w / "train"), f"--lr={v}"],
         ("lr",)),
        ("run --max-steps", lambda w, v: ["run", "tiny", "--out", str(w / "train"),
                                          "--max-steps", v], ("--max-steps",)),
    ]
    # values that are fine for some options (0 steps of bootstrap, a 0 fraction...) are skipped
    big = "999999999999999999999"  # 1e21: finite, a valid count of FLOPs
    allowed = {"fit --bootstrap": {"0"},
               # a deadline of 1e30 s or 1e21 s is "forever": valid, and would follow forever
               "watch --max-seconds": {"0", "1.5", "1e30", big}, "watch --poll": {"1.5"},
               "predict --compute": {"1e30", "1.5", big},
               "plan --peak-flops": {"1e30", "1.5", big},
               "preregister --eval-noise": {"0", "1.5"}}
    for name, argv_of, names in opts:
        for v in BAD_NUMBERS + ["999999999999999999999"]:
            if v in allowed.get(name, set()):
                continue
            if name.startswith("run ") and v not in ("nan", "inf", "1e400", "-1", "abc", ""):
                continue  # the others are valid (a large lr diverges, and says so) and train
            add(Case(f"{name} {v[:12]!r}", lambda w, a=argv_of, v=v: a(w, v), names))
    add(Case("watch --webhook http://", lambda w: [
        "watch", prereg(w), "--source", str(w / "live.jsonl"), "--webhook", "http://"],
        ("--webhook",)))
    add(Case("watch --webhook ftp://", lambda w: [
        "watch", prereg(w), "--source", str(w / "live.jsonl"), "--webhook", "ftp://x/y"],
        ("--webhook",)))
    add(Case("watch corrupt .wandb", lambda w: [
        "watch", prereg(w), "--source", str(_corrupt_wandb(w))], ("run-x.wandb", "source")))
    add(Case("fit all-NaN loss", lambda w: [
        "fit", str(_points_with_loss(w, "nan.csv", "nan")), "--bootstrap", "0"],
        ("nan.csv", "loss")))
    add(Case("fit drops every row", lambda w: [
        "fit", str(_points_with_loss(w, "neg.csv", "-1")), "--bootstrap", "0"],
        ("neg.csv", "loss")))
    add(Case("watch --state of another kind", lambda w: [
        "watch", prereg(w), "--source", str(w / "live.jsonl"), "--state", str(w / law)],
        (law, "schema")))
    return C


def _as(p: Path, suffix: str) -> Path:
    q = p.with_name("x" + suffix)
    if p.exists() or p.is_dir():
        p.rename(q)
    return q


def _corrupt_wandb(w: Path) -> Path:
    p = w / "wb" / "run-x.wandb"
    p.parent.mkdir()
    p.write_bytes(b":W&B\x00\x00\x01" + bytes(range(256)) * 50)
    return p


def _points_with_loss(w: Path, name: str, loss: str) -> Path:
    """points.csv as ``name`` with every row's loss (the last column) replaced by ``loss``."""
    p = w / name
    lines = (w / "points.csv").read_text().splitlines()
    p.write_text(lines[0] + "\n" + "".join(",".join(ln.split(",")[:-1] + [loss]) + "\n"
                                           for ln in lines[1:]))
    return p


def run_case(world: Path, case: Case, scratch: Path) -> Outcome:
    """Copy the world into ``scratch``, build the case there, judge it."""
    w = scratch / "w"
    if w.exists():
        _rmtree(w)
    shutil.copytree(world, w)
    cwd = os.getcwd()
    try:
        argv = case.build(w)
        os.chdir(w)  # relative defaults (law.json, prereg.json) land in the copy
        return judge(argv, case.names, bad=case.bad)
    finally:
        os.chdir(cwd)


def _rmtree(p: Path) -> None:
    for q in p.rglob("*"):
        try:
            q.chmod(0o755 if q.is_dir() else 0o644)
        except OSError:
            pass
    shutil.rmtree(p, ignore_errors=True)


def table(results: list[tuple[Case, Outcome]]) -> str:
    n = Counter(o.verdict for _, o in results)
    bad = [o for c, o in results if c.bad]
    rows = [("inputs tried", len(results)),
            ("bad inputs", len(bad)),
            ("  one-line errors naming file/field", sum(o.verdict == "error" for o in bad)),
            ("  one-line errors naming neither", n["unnamed"]),
            ("  accepted bad inputs (exit < 64)", n["accepted"]),
            ("tolerated inputs (skipped with a note)", len(results) - len(bad)),
            ("tracebacks", n["traceback"]),
            ("hangs", n["hang"])]
    return "\n".join(f"| {k:<40} | {v:>5} |" for k, v in rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="run the cases whose name contains this")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every case")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        world = build_world(Path(tmp) / "world")
        results = []
        t0 = time.perf_counter()
        for case in corpus():
            if args.only and args.only not in case.name:
                continue
            o = run_case(world, case, Path(tmp))
            results.append((case, o))
            if args.verbose or o.verdict not in ("error", "tolerated"):
                print(f"{o.verdict:<10} {o.code!s:>4} {o.seconds:5.2f}s  {case.name}: "
                      f"{o.message[:150]}")
        print(f"\n{len(results)} cases in {time.perf_counter() - t0:.1f} s\n")
        print(table(results))
    worst = sum(o.verdict in ("traceback", "hang", "accepted", "unnamed") for _, o in results)
    return 1 if worst else 0


if __name__ == "__main__":
    sys.exit(main())
