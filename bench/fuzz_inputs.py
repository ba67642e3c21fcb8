"""Adversarial inputs for every command: each must give a one-line error (exit 64+), never a
traceback, a hang, or exit 0 (issue 15).

A small but complete world (a tiny-ladder runs directory, a points CSV, a fitted law.json, a
target spec, a pre-registration, a watch source) is built once; every case copies it, breaks one
thing (a file, a field, an argument) and runs the command in-process through ``cli.main.main``
under an alarm. The verdicts:

- ``error``: exit 64+ with a one-line message that names the file or the field (good);
- ``unnamed``: exit 64+, but the message names neither the file nor the field;
- ``traceback``: an exception escaped ``main``;
- ``accepted``: exit below 64 for a bad input (or a check after it finds the input followed);
- ``hang``: still running after the alarm;
- ``lost``: data that was there before is gone (a user's file, an alert);
- ``leak``: a secret where it must not be (the command line W&B records, an output);
- ``exhausted``: memory ran out (each such case runs under a cap on the address space).

Cases belong to a surface (the issue that found them); the table is printed per surface. The
surfaces of issue 26 (names that become paths, special files, trust, our own files' fields,
ranges, durability, secrets, size) follow the inputs of issue 15, then the writers of issue 39
(:func:`corpus39_writers`: only what it wrote, pairs of writes, token ids, checkpoints and locks;
a case may run under a fault, a write that fails as on a full disk).

``tests/test_inputs_fuzz.py`` runs the issue's cases and a sample of the corpus, and a
hypothesis-driven search, in the default suite; this script runs the whole corpus and prints the
table (exit 1 if any case is a traceback, a hang, accepted or unnamed):

    nice python bench/fuzz_inputs.py [--only SUBSTRING] [--surface NAME] [--issue26] [-v]

``--tree DIR`` judges another checkout (e.g. main before a change) with this corpus: its
``ladder``, ``predict`` and ``tests.helpers`` are imported instead of this tree's.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT  # the checkout judged (``--tree``); its packages come first on sys.path
sys.path.insert(0, str(ROOT))

ALARM_S = 20  # a command on the tiny world takes well under a second; 20 s is a hang


class Hang(Exception):
    pass


@dataclass
class Outcome:
    verdict: str  # error | tolerated | unnamed | traceback | accepted | hang | lost | leak |
    #               exhausted
    code: int | None
    message: str  # the last stderr line (or the traceback's last line)
    seconds: float


# ----------------------------------------------------------------------------- the world


def build_world(root: Path) -> Path:
    """Write the valid world under ``root`` and return it (about 2 s, mostly the fit)."""
    from ladder.predict.forecast import Target
    from tests.helpers import KNOWN_LAW, write_law_runs

    E, A, alpha = KNOWN_LAW   # the runs' law (tests/test_fit_cli.py's too)
    runs = root / "runs"
    lad = write_law_runs(runs)
    # the world is not a case: no alarm worth the name (a loaded machine fits slowly)
    # form auto: the compute form with the asymptote rule, as before issue 35 made a named
    # --form the textbook estimator (3 runs, 3 free parameters: no residual dof, no band)
    code, _, err = run_cli(["fit", str(runs), "--form", "auto", "--bootstrap", "20",
                            "--out", str(root / "law.json")], alarm=900)
    assert code == 0, err
    target = Target.from_rung(lad.target)
    (root / "target.json").write_text(json.dumps(target.to_dict()))
    code, _, err = run_cli(["preregister", str(root / "law.json"), "--target-spec",
                            str(root / "target.json"), "--out", str(root / "pre" / "prereg.json"),
                            "--eval-noise", "0.003"], alarm=900)
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
    # the same run with a NaN train loss at its last eval: a critical alert to write
    bad = [dict(r) for r in rows]
    bad[-1]["train/loss"] = "NaN"
    (root / "live_nan.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad))
    # token shards as `ladder tokenize` writes them (uint16 ids of the tiny ladder's 256)
    import numpy as np
    shards = root / "shards"
    shards.mkdir()
    rng = np.random.default_rng(0)
    for name, n in (("train-00000.bin", 40_000), ("val-00000.bin", 4_000)):
        rng.integers(0, 255, n, dtype=np.uint16).tofile(shards / name)
    (shards / "manifest.json").write_text(json.dumps({
        "schema": "token-shards/1", "dtype": "uint16", "vocab_size": 256, "eos_id": 255,
        "tokenizer": {"sha256": "0" * 64}, "split_rule": "hash",
        "splits": {"train": {"shards": [{"file": "train-00000.bin", "tokens": 40_000}],
                             "tokens": 40_000},
                   "val": {"shards": [{"file": "val-00000.bin", "tokens": 4_000}],
                           "tokens": 4_000}}}))
    (root / "secret.bin").write_bytes(b"\x00\x01" * 30_000)  # outside every folder named
    return root


def run_cli(argv: list[str], alarm: float = ALARM_S) -> tuple[int | None, str, str]:
    """``ladder.cli.main.main(argv)`` in-process; (exit code, stdout, stderr). Exceptions escape.
    ``sys.argv`` is the command's for the while (what a process's own command line would be:
    W&B records it)."""
    from ladder.cli.main import main
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, alarm)
    saved_argv = sys.argv
    sys.argv = ["ladder", *argv]
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
        sys.argv = saved_argv
    return code, out.getvalue(), err.getvalue()


def _on_alarm(signum, frame):
    raise Hang()


@contextlib.contextmanager
def address_space_cap(extra: int | None):
    """While inside: the process may map at most ``extra`` more bytes (RLIMIT_AS soft limit);
    a read that would take the machine's memory ends in MemoryError instead."""
    if extra is None:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        used = int(f.read().split()[0]) * resource.getpagesize()
    cap = used + extra if hard == resource.RLIM_INFINITY else min(hard, used + extra)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def judge(argv: list[str], names: tuple[str, ...] = (), *, bad: bool = True,
          alarm: float = ALARM_S, mem_cap: int | None = None) -> Outcome:
    """Run one case and classify it. ``names``: strings of which the error line must hold one
    (the file's name, the field); ``bad=False``: a tolerated input (exit status free, but no
    traceback or hang). ``mem_cap``: bytes of address space the command may add (a case that
    would read /dev/zero or a huge table must not take a shared machine's memory)."""
    t0 = time.perf_counter()
    try:
        with address_space_cap(mem_cap):
            code, _, err = run_cli(argv, alarm)
    except Hang:
        return Outcome("hang", None, "", time.perf_counter() - t0)
    except MemoryError as e:
        return Outcome("exhausted", None, f"MemoryError: {e}"[:300], time.perf_counter() - t0)
    except BaseException as e:  # noqa: BLE001 - the point: anything escaping is a finding
        return Outcome("traceback", None, f"{type(e).__name__}: {e}"[:300],
                       time.perf_counter() - t0)
    dt = time.perf_counter() - t0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if "Traceback (most recent call last)" in err:
        return Outcome("traceback", code, last, dt)
    if "MemoryError" in err:
        return Outcome("exhausted", code, last, dt)
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
    surface: str = "inputs (issue 15)"
    # after the command, on the world copy: a verdict ("lost", "leak", "accepted") when what
    # the command did is wrong whatever its exit status, else None
    check: Callable[[Path, "Outcome"], str | None] | None = None
    alarm: float = ALARM_S
    mem_cap: int | None = None
    slow: bool = False  # trains a rung or fits a big table: left out of the default suite
    # around the command: a fault it meets (a full disk: a write monkeypatched to fail)
    during: Callable[[Path], contextlib.AbstractContextManager] | None = None


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
    return C + corpus26()


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
        if case.during is not None:
            with case.during(w):
                o = judge(argv, case.names, bad=case.bad, alarm=case.alarm)
        elif case.mem_cap is None:
            o = judge(argv, case.names, bad=case.bad, alarm=case.alarm)
        else:  # in a child process: running out of memory must not break this one's modules
            o = _judge_apart(argv, case)
        if case.check is not None and o.verdict not in ("traceback", "hang", "exhausted"):
            found = case.check(w, o)
            if found:
                o = Outcome(found, o.code, f"{found}: {o.message}", o.seconds)
        return o
    finally:
        os.chdir(cwd)
        _release(w)


def preload() -> None:
    """Import what the training cases import, outside any alarm (an alarm that fires inside
    ``import jax`` leaves a half-imported module behind for every later case)."""
    with contextlib.suppress(ImportError):
        import jax  # noqa: F401

        import ladder.trainer.train  # noqa: F401


def _judge_apart(argv: list[str], case: Case) -> Outcome:
    """:func:`judge` in a forked child under the case's memory cap; its Outcome comes back
    through a pipe (a child killed outright is a ``exhausted`` verdict)."""
    import pickle
    r, wfd = os.pipe()
    with warnings.catch_warnings():  # the child runs no JAX (it reads files): fork is safe
        warnings.simplefilter("ignore", RuntimeWarning)
        pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        try:
            o = judge(argv, case.names, bad=case.bad, alarm=case.alarm, mem_cap=case.mem_cap)
        except BaseException as e:  # noqa: BLE001
            o = Outcome("traceback", None, f"{type(e).__name__}: {e}"[:300], 0.0)
        with os.fdopen(wfd, "wb") as f:
            pickle.dump(o, f)
        os._exit(0)
    os.close(wfd)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        return Outcome("exhausted", None, f"child ended with status {status}", 0.0)
    return pickle.loads(data)


def _release(w: Path) -> None:
    """Stop what a case left running (a FIFO's writer, a socket's server)."""
    for t in _HELPERS.pop(str(w), []):
        t()


_HELPERS: dict[str, list] = {}


def _rmtree(p: Path) -> None:
    for q in p.rglob("*"):
        try:
            q.chmod(0o755 if q.is_dir() else 0o644)
        except OSError:
            pass
    shutil.rmtree(p, ignore_errors=True)


BAD_VERDICTS = ("traceback", "accepted", "hang", "lost", "leak", "exhausted", "unnamed")


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
            ("hangs", n["hang"]),
            ("data lost", n["lost"]),
            ("secrets leaked", n["leak"]),
            ("memory exhausted", n["exhausted"])]
    return "\n".join(f"| {k:<40} | {v:>5} |" for k, v in rows)


def surface_table(results: list[tuple[Case, Outcome]]) -> str:
    """Cases and bad verdicts per surface: the table the issues ask for."""
    cols = ("clean", "traceback", "accepted", "hang", "lost", "leak", "exhausted", "unnamed")
    head = "| surface | cases | " + " | ".join(cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 2)]
    surfaces = list(dict.fromkeys(c.surface for c, _ in results))
    for sfc in surfaces + ["all"]:
        got = [o for c, o in results if sfc in ("all", c.surface)]
        n = Counter(o.verdict for o in got)
        clean = sum(o.verdict in ("error", "tolerated") for o in got)
        lines.append(f"| {sfc} | {len(got)} | {clean} | "
                     + " | ".join(str(n[c]) for c in cols[1:]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="run the cases whose name contains this")
    ap.add_argument("--surface", default=None, help="run the cases of this surface only")
    ap.add_argument("--issue26", action="store_true", help="only the cases of issue 26")
    ap.add_argument("--fast", action="store_true",
                    help="leave out the slow cases (a rung trained, a big fit, W&B)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every case")
    ap.add_argument("--tree", default=None, metavar="DIR",
                    help="judge this checkout's code with this corpus (default: this tree)")
    args = ap.parse_args(argv)
    if args.tree:
        global TREE
        TREE = Path(args.tree).resolve()
        sys.path.insert(0, str(TREE))
    import ladder
    from ladder import predict
    print(f"judging {Path(ladder.__file__).parents[1]} (predict from "
          f"{Path(predict.__file__).parents[1]})", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        world = build_world(Path(tmp) / "world")
        if not args.fast:
            preload()
        results = []
        t0 = time.perf_counter()
        for case in corpus() + corpus39_writers():
            if args.only and args.only not in case.name:
                continue
            if args.surface and args.surface not in case.surface:
                continue
            if args.fast and case.slow:
                continue
            if args.issue26 and case.surface == "inputs (issue 15)":
                continue
            o = run_case(world, case, Path(tmp))
            results.append((case, o))
            if args.verbose or o.verdict not in ("error", "tolerated"):
                print(f"{o.verdict:<10} {o.code!s:>4} {o.seconds:5.2f}s  {case.name}: "
                      f"{o.message[:150]}")
        print(f"\n{len(results)} cases in {time.perf_counter() - t0:.1f} s\n")
        print(table(results))
        print()
        print(surface_table(results))
    worst = sum(o.verdict in BAD_VERDICTS for _, o in results)
    return 1 if worst else 0


# ----------------------------------------------------------------------------- issue 26
# Surfaces found by the second adversarial pass (issue 26): each case names its surface; the
# special-file cases run under a short alarm (a FIFO that blocks is a hang after 10 s).

S_NAMES, S_SPECIAL, S_TRUST, S_FIELDS = ("names -> paths", "special files", "trust",
                                         "our files' fields")
S_RANGES, S_DURABLE, S_SECRETS, S_SIZE = ("ranges", "durability", "secrets", "size")
SHORT_ALARM = 10
SECRET = "s3cr3t-t0ken"


def _tiny_toml(edit: Callable[[str], str] = lambda t: t) -> str:
    from importlib.resources import files
    return edit((files("ladder") / "ladders" / "tiny.toml").read_text())


def _ladder_file(w: Path, edit: Callable[[str], str], name: str = "lad.toml") -> Path:
    p = w / name
    p.write_text(_tiny_toml(edit))
    return p


def _first_rung() -> str:
    from ladder.specs import get_ladder
    return get_ladder("tiny").rungs[0].name


def _named_rung(name: str) -> Callable[[str], str]:
    """A tiny ladder whose first rung is named ``name`` (a TOML basic string)."""
    return lambda t: t.replace("[[rungs]]\nd = 16\nn_layers = 2",
                               f"[[rungs]]\nd = 16\nn_layers = 2\nname = {json.dumps(name)}", 1)


RUN_ALARM = 600  # a case that may train a rung (the version before issue 26 did): compile + 1 step


def _run_file(w: Path, f: Path, rung: str) -> list[str]:
    return ["run", "--ladder-file", str(f), "--rung", rung, "--out", str(w / "train"),
            "--max-steps", "1", "--peak_flops=1e11", "--progress=false"]


def _escaped(where: Callable[[Path], Path]):
    """A check: the command wrote ``where(w)`` (outside the folder it was given)."""
    def check(w: Path, o: Outcome) -> str | None:
        return "accepted" if where(w).exists() else None
    return check


def _fifo(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.exists():
        p.unlink()
    os.mkfifo(p)
    return p


def _zero(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.exists():
        p.unlink()
    p.symlink_to("/dev/zero")
    return p


def _socket_file(w: Path, p: Path) -> Path:
    if p.exists():
        p.unlink()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(p))
    s.listen(1)
    _HELPERS.setdefault(str(w), []).append(s.close)
    return p


def _state_of(w: Path) -> Path:
    """A valid watch state of the world's run (a first watch), to be broken field by field."""
    st = w / "st.json"
    code, _, err = run_cli(["watch", str(w / "pre" / "prereg.json"), "--source",
                            str(w / "live.jsonl"), "--state", str(st)], alarm=300)
    assert code == 0, err
    return st


def _edit_state(path: Path, edit: Callable[[dict], None]) -> Path:
    """Apply ``edit`` to the state's dict and write it back as text (so 1e400 stays 1e400)."""
    doc = json.loads(path.read_text())
    edit(doc)
    text = json.dumps(doc).replace('"__1e400__"', "1e400")
    path.write_text(text)
    return path


def _manifest(w: Path, edit: Callable[[dict], None]) -> Path:
    m = w / "shards" / "manifest.json"
    doc = json.loads(m.read_text())
    edit(doc)
    m.write_text(json.dumps(doc))
    return w / "shards"


def _run_data(w: Path, data: Path) -> list[str]:
    return ["run", "tiny", "--rung", _first_rung(), "--data", str(data), "--out",
            str(w / "train"), "--max-steps", "1", "--peak_flops=1e11", "--progress=false"]


def _forged_amendment(w: Path) -> Path:
    """A pre-registration sealed by hand beside the real one, claiming to amend it, dated 9999
    and saying the run is doing fine: written as a file, never recorded by `preregister`."""
    from ladder.predict import prereg as pr
    p = w / "pre" / "prereg.json"
    doc = pr.load(p)
    forged = {k: v for k, v in doc.items() if k not in ("sha256", "section_sha256")}
    forged["amends"] = {"sha256": doc["sha256"], "path": "prereg.json", "reason": "forged",
                        "created": doc.get("created"), "chain": [doc["sha256"]]}
    forged["created"] = "9999-01-01T00:00:00+00:00"
    forged["final"] = dict(doc["final"], lo=0.0, hi=100.0)
    sealed = pr.seal(forged)
    q = w / "pre" / "zz-forged.json"
    q.write_text(json.dumps(sealed))
    return q


def _followed(w: Path, o: Outcome) -> str | None:
    """A check: the watch's state names the forged amendment as the pre-registration it
    followed."""
    st = w / "st.json"
    if not st.exists():
        return None
    forged = json.loads((w / "pre" / "zz-forged.json").read_text())["sha256"]
    return "accepted" if json.loads(st.read_text()).get("prereg_sha256") == forged else None


def _resealed(w: Path) -> tuple[Path, str]:
    from ladder.predict import prereg as pr
    p = w / "pre" / "prereg.json"
    doc = pr.load(p)
    sha = doc["sha256"]
    doc = dict(doc, final=dict(doc["final"], hi=doc["final"]["hi"] + 1.0))
    p.chmod(0o644)
    p.write_text(json.dumps(pr.seal(doc)))
    return p, sha


def _no_anchor(w: Path, o: Outcome) -> str | None:
    return "accepted" if "unrecognized arguments" in o.message else None


def _other_law(w: Path) -> Path:
    doc = json.loads((w / "law.json").read_text())
    doc["fit"]["u"][0] = doc["fit"]["u"][0] + 0.05
    q = w / "law2.json"
    q.write_text(json.dumps(doc))
    return q


def _law_note_missing(w: Path, o: Outcome) -> str | None:
    md = w / "rep" / "summary.md"
    return "accepted" if md.exists() and "not the one the pre-registration" not in \
        md.read_text() else None


def _partial_alerts(w: Path) -> Path:
    a = w / "alerts.jsonl"
    a.write_text('{"time": "2026-01-01T00:00:00Z", "kind": "spi')  # a write cut by a full disk
    return a


def _alert_lost(w: Path, o: Outcome) -> str | None:
    kinds = []
    for line in (w / "alerts.jsonl").read_text().splitlines():
        try:
            kinds.append(json.loads(line).get("kind"))
        except ValueError:
            continue
    return None if "nan" in kinds else "lost"


def _killed_report(w: Path) -> Path:
    """A report, a user's file beside it, then a second report killed (SIGKILL-like: no
    cleanup) at the second rename of its swap."""
    rep = w / "rep"
    code, _, err = run_cli(["report", "--law", str(w / "law.json"), "--out", str(rep)],
                           alarm=300)
    assert code == 0, err
    (rep / "notes.txt").write_text("mine")
    # killed right after the swap's first rename that takes something out of the report folder
    # (the renames that build the new report in its staging folder do not count)
    code = ("import os, sys\n"
            "from pathlib import Path\n"
            f"sys.path.insert(0, {str(TREE)!r})\n"
            f"out = Path({str(rep)!r}).resolve()\n"
            "real = os.replace\n"
            "def replace(a, b):\n"
            "    src = Path(a).resolve()\n"
            "    real(a, b)\n"
            "    if src == out or out in src.parents:\n"
            "        os._exit(9)\n"
            "os.replace = replace\n"
            "from ladder.cli.main import main\n"
            f"main(['report', '--law', {str(w / 'law.json')!r}, '--out', {str(rep)!r}])\n")
    subprocess.run([sys.executable, "-c", code], cwd=w, capture_output=True, check=False)
    return rep


def _user_file_lost(w: Path, o: Outcome) -> str | None:
    f = w / "rep" / "notes.txt"
    return None if f.exists() and f.read_text() == "mine" else "lost"


class _Receiver:
    """A local webhook receiver: 200 to every POST; with ``endless``, an answer body that does
    not end (stopped at ``cap`` bytes); counts what it sent."""

    def __init__(self, endless: bool = False, cap: int = 192 << 20):
        import http.server
        rx = self
        self.sent, self.posts = 0, 0

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the http.server API
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                rx.posts += 1
                self.send_response(200)
                self.end_headers()
                if not endless:
                    return
                chunk = b"x" * 65536
                try:
                    while rx.sent < cap:
                        self.wfile.write(chunk)
                        rx.sent += len(chunk)
                except OSError:
                    pass

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://user:{SECRET}@127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _receiver(w: Path, endless: bool = False) -> _Receiver:
    rx = _Receiver(endless)
    _HELPERS.setdefault(str(w), []).append(rx.close)
    _RECEIVERS[str(w)] = rx
    return rx


_RECEIVERS: dict[str, _Receiver] = {}


def _read_whole(w: Path, o: Outcome) -> str | None:
    rx = _RECEIVERS.get(str(w))
    return "exhausted" if rx is not None and rx.sent > (32 << 20) else None


def _secret_anywhere(w: Path, o: Outcome) -> str | None:
    """A check: the secret is in a file the command wrote (W&B's run metadata, the state, the
    alerts) or the flag that keeps it off the command line does not exist."""
    if "unrecognized arguments" in o.message:
        return "leak"
    _settled(w)
    for q in w.rglob("*"):
        try:
            if q.is_file() and not q.is_symlink() and q.stat().st_size < (8 << 20) and \
                    SECRET.encode() in q.read_bytes() and q.name != "hook.txt":
                return "leak"
        except OSError:
            continue
    return None


def _settled(w: Path, quiet: float = 2.0, most: float = 60.0) -> None:
    """Wait until the W&B record logs under ``w`` stop growing (W&B's service writes them
    after the command returns)."""
    t_end = time.monotonic() + most
    last = None
    while time.monotonic() < t_end:
        now = sorted((str(q), q.stat().st_size) for q in w.rglob("*.wandb") if q.is_file())
        if not now or now == last:
            return
        last = now
        time.sleep(quiet)


def _big_table(w: Path, rows: int = 300_000) -> Path:
    import numpy as np

    from tests.helpers import KNOWN_LAW
    E, A, alpha = KNOWN_LAW
    rng = np.random.default_rng(0)
    runs = 50
    per = rows // runs
    out = ["run,params,active_params,tokens,compute,fraction,loss"]
    for i in range(runs):
        n = 1e6 * 1.2 ** i
        g = np.arange(1, per + 1) / per
        tok = 20 * n * g
        c = 6 * n * tok
        loss = E + A * c ** -alpha * np.exp(rng.normal(0, 0.005, per))
        out += [f"r{i},{n:.6g},{n / 10:.6g},{t:.6g},{cc:.6g},{gg:.6g},{ll:.6g}"
                for t, cc, gg, ll in zip(tok, c, g, loss)]
    p = w / "big.csv"
    p.write_text("\n".join(out) + "\n")
    return p


def corpus26() -> list[Case]:
    """The cases of issue 26, by surface."""
    C: list[Case] = []

    def add(*a, **kw):
        C.append(Case(*a, **kw))

    def pre(w):
        return str(w / "pre" / "prereg.json")

    def live(w):
        return str(w / "live.jsonl")

    # ------------------------------------------------------------------ names -> paths
    run = {"slow": True, "alarm": RUN_ALARM}
    add("run ladder named ../../escaped", lambda w: _run_file(
        w, _ladder_file(w, lambda t: t.replace('name = "tiny"', 'name = "../../escaped"')),
        _first_rung()), ("name",), surface=S_NAMES,
        check=_escaped(lambda w: w.parent / "escaped"), **run)
    add("run rung named ../../../pwned", lambda w: _run_file(
        w, _ladder_file(w, _named_rung("../../../pwned")), "../../../pwned"), ("name",),
        surface=S_NAMES, check=_escaped(lambda w: w.parent / "pwned"), **run)
    add("run rung named by an absolute path", lambda w: _run_file(
        w, _ladder_file(w, _named_rung(str(w.parent / "absrung"))), str(w.parent / "absrung")),
        ("name",), surface=S_NAMES, check=_escaped(lambda w: w.parent / "absrung"), **run)
    add("list rung name with a NUL", lambda w: [
        "list", "--ladder-file", str(_ladder_file(w, _named_rung("a\x00b")))], ("name",),
        surface=S_NAMES)
    add("run rung name with a newline", lambda w: _run_file(
        w, _ladder_file(w, _named_rung("a\nb")), "a\nb"), ("name",), surface=S_NAMES,
        check=_escaped(lambda w: w / "train" / "tiny" / "a\nb"), **run)
    add("run manifest shard ../secret.bin", lambda w: _run_data(w, _manifest(
        w, lambda m: m["splits"]["train"]["shards"][0].update(file="../secret.bin",
                                                               tokens=30_000))),
        ("manifest.json", "file"), surface=S_NAMES, **run)
    add("verify amends.path outside the folder", lambda w: [
        "verify", str(_amends_outside(w))], ("amends.path",), surface=S_NAMES)

    # ------------------------------------------------------------------ special files
    sp = {"surface": S_SPECIAL, "alarm": SHORT_ALARM}
    add("watch --state FIFO", lambda w: [
        "watch", pre(w), "--source", live(w), "--state", str(_fifo(w / "x.json"))],
        ("x.json",), **sp)
    add("watch --source FIFO", lambda w: [
        "watch", pre(w), "--source", str(_fifo(w / "x.jsonl"))], ("x.jsonl", "source"), **sp)
    add("fit points table FIFO", lambda w: [
        "fit", str(_fifo(w / "x.csv")), "--bootstrap", "0"], ("x.csv",), **sp)
    add("list --ladder-file FIFO", lambda w: [
        "list", "--ladder-file", str(_fifo(w / "x.toml"))], ("x.toml",), **sp)
    add("preregister --amend FIFO", lambda w: [
        "preregister", str(w / "law.json"), "--target-spec", str(w / "target.json"),
        "--amend", str(_fifo(w / "pre" / "x.json")), "--reason", "r", "--out",
        str(w / "pre" / "new.json")], ("x.json",), **sp)
    add("verify FIFO", lambda w: ["verify", str(_fifo(w / "x.json"))], ("x.json",), **sp)
    add("verify with a FIFO beside", lambda w: (_fifo(w / "pre" / "x.json"),
                                                ["verify", pre(w)])[1], bad=False, **sp)
    add("watch with a FIFO beside", lambda w: (_fifo(w / "pre" / "x.json"),
                                               ["watch", pre(w), "--source", live(w)])[1],
        bad=False, **sp)
    add("watch --alerts FIFO", lambda w: [
        "watch", pre(w), "--source", str(w / "live_nan.jsonl"), "--alerts",
        str(_fifo(w / "x.jsonl"))], ("x.jsonl",), **sp)
    add("report --alerts FIFO", lambda w: [
        "report", "--alerts", str(_fifo(w / "x.jsonl")), "--out", str(w / "rep")],
        ("x.jsonl",), **sp)
    add("report --law FIFO", lambda w: [
        "report", "--law", str(_fifo(w / "x.json")), "--out", str(w / "rep")], ("x.json",),
        **sp)
    add("run --config FIFO", lambda w: [
        "run", "tiny", "--config", str(_fifo(w / "x.json")), "--out", str(w / "train")],
        ("x.json",), **sp)
    add("fit runs metrics.jsonl FIFO", lambda w: [
        "fit", str(_fifo_metrics(w)), "--form", "compute", "--bootstrap", "0"],
        ("metrics.jsonl",), **sp)
    zp = {"surface": S_SPECIAL, "alarm": SHORT_ALARM, "mem_cap": 1 << 30}
    add("predict law /dev/zero", lambda w: [
        "predict", str(_zero(w / "x.json")), "--compute", "1e20"], ("x.json",), **zp)
    add("watch --state /dev/zero", lambda w: [
        "watch", pre(w), "--source", live(w), "--state", str(_zero(w / "x.json"))],
        ("x.json",), **zp)
    add("watch --source /dev/zero", lambda w: [
        "watch", pre(w), "--source", str(_zero(w / "x.jsonl"))], ("x.jsonl", "source"), **zp)
    add("list --ladder-file /dev/zero", lambda w: [
        "list", "--ladder-file", str(_zero(w / "x.toml"))], ("x.toml",), **zp)
    add("fit table /dev/zero", lambda w: [
        "fit", str(_zero(w / "x.csv")), "--bootstrap", "0"], ("x.csv",), **zp)
    add("watch --state socket", lambda w: [
        "watch", pre(w), "--source", live(w), "--state", str(_socket_file(w, w / "x.json"))],
        ("x.json",), **sp)
    add("predict law 600 MB", lambda w: [
        "predict", str(_sparse(w / "x.json", 600 << 20)), "--compute", "1e20"], ("x.json",),
        **zp)

    # ------------------------------------------------------------------ trust
    add("watch follows a hand-sealed amendment dated 9999", lambda w: (
        _forged_amendment(w), ["watch", pre(w), "--source", live(w), "--state",
                               str(w / "st.json")])[1], bad=False, surface=S_TRUST,
        check=_followed)
    add("verify a resealed file against its registered sha256", lambda w: (
        lambda p_sha: ["verify", str(p_sha[0]), "--expect", p_sha[1]])(_resealed(w)),
        surface=S_TRUST, check=_no_anchor)  # verify reports on stdout: no name to check
    add("report --law another law --prereg", lambda w: [
        "report", "--law", str(_other_law(w)), "--prereg", pre(w), "--out", str(w / "rep")],
        bad=False, surface=S_TRUST, check=_law_note_missing)

    # ------------------------------------------------------------------ our files' fields
    state_edits = {
        "source.offset=1e400": lambda d: d["source"].__setitem__("offset", "__1e400__"),
        'source.max_step="x"': lambda d: d["source"].__setitem__("max_step", "x"),
        "source.inode=-5": lambda d: d["source"].__setitem__("inode", -5),
        "outbox nested pending": lambda d: d.__setitem__("outbox", [{
            "id": "a", "pending": [["stdout"]], "alert": {"kind": "x", "severity": "info"}}]),
        'state.worst="bogus"': lambda d: d["state"].__setitem__("worst", "bogus"),
        'state.n_evals="many"': lambda d: d["state"].__setitem__("n_evals", "many"),
        "state.band.run_len=-1": lambda d: d["state"]["band"].__setitem__("run_len", -1),
        "state.trend.hist=[[1]]": lambda d: d["state"]["trend"].__setitem__("hist", [[1]]),
        "state.tails=[]": lambda d: d["state"].__setitem__("tails", []),
        "seq=-1": lambda d: d.__setitem__("seq", -1),
    }
    for label, edit in state_edits.items():
        add(f"watch state {label}", lambda w, e=edit: [
            "watch", pre(w), "--source", live(w), "--state",
            str(_edit_state(_state_of(w), e))], ("st.json",), surface=S_FIELDS)
    manifest_edits = {
        "splits a list": lambda m: m.__setitem__("splits", []),
        "shard file 123": lambda m: m["splits"]["train"]["shards"][0].__setitem__("file", 123),
        "shard tokens -1": lambda m: m["splits"]["train"]["shards"][0].__setitem__("tokens",
                                                                                   -1),
        'dtype "float64"': lambda m: m.__setitem__("dtype", "float64"),
        "eos_id 10**9": lambda m: m.__setitem__("eos_id", 10 ** 9),
        'vocab_size "x"': lambda m: m.__setitem__("vocab_size", "x"),
    }
    for label, edit in manifest_edits.items():
        add(f"run manifest {label}", lambda w, e=edit: _run_data(w, _manifest(w, e)),
            ("manifest.json",), surface=S_FIELDS, **run)

    # ------------------------------------------------------------------ ranges
    ladder_edits = {
        "d=10**200": lambda t: t.replace("d = 16", "d = " + "1" + "0" * 200),
        "vocab_size=2**62": lambda t: t.replace("vocab_size = 256", f"vocab_size = {2 ** 62}"),
        "batch_units=0": lambda t: t.replace("d = 16\nn_layers = 2",
                                             "d = 16\nn_layers = 2\nbatch_units = 0"),
        "tokens_per_active=1e300": lambda t: t.replace("tokens_per_active = 4",
                                                       "tokens_per_active = 1e300"),
        "n_layers=10**7": lambda t: t.replace("d = 16\nn_layers = 2", "d = 16\nn_layers = "
                                              "10000000"),
        "eval_every=1e-300": lambda t: t.replace("eval_every = 0.25", "eval_every = 1e-300"),
        "capacity_factor=inf": lambda t: t.replace("eval_every = 0.25",
                                                   "eval_every = 0.25\ncapacity_factor = inf"),
        "lr_coef=nan": lambda t: t.replace("lr_coef = 0.087571", "lr_coef = nan"),
    }
    for label, edit in ladder_edits.items():
        add(f"list --ladder-file {label}", lambda w, e=edit: [
            "list", "--ladder-file", str(_ladder_file(w, e))], ("lad.toml",), surface=S_RANGES,
            alarm=SHORT_ALARM)
    add("list --ladder-file JSON nested 100,000 deep", lambda w: [
        "list", "--ladder-file", str(_deep(w / "lad.json"))], ("lad.json",), surface=S_RANGES,
        alarm=SHORT_ALARM)
    config_edits = {"eval_every=1e-300": {"eval_every": 1e-300},
                    "model.d_model=10**200": {"model": {"d_model": 10 ** 200}},
                    "lr=1e308": {"lr": 1e308}, "eps=inf": {"eps": "__inf__"},
                    "checkpoint_every=10**30": {"checkpoint_every": 10 ** 30}}
    for label, cfg in config_edits.items():
        add(f"run --config {label}", lambda w, c=cfg: [
            "run", "tiny", "--rung", _first_rung(), "--config", str(_config(w, c)), "--out",
            str(w / "train"), "--max-steps", "1", "--peak_flops=1e11", "--progress=false"],
            ("cfg.json",) + tuple(k.split(".")[-1] for k in cfg), surface=S_RANGES, **run)

    # ------------------------------------------------------------------ durability
    add("watch --alerts after a partial last line", lambda w: (
        _partial_alerts(w), ["watch", pre(w), "--source", str(w / "live_nan.jsonl"),
                             "--alerts", str(w / "alerts.jsonl")])[1], bad=False,
        surface=S_DURABLE, check=_alert_lost)
    add("report after a report killed mid-swap", lambda w: (
        _killed_report(w), ["report", "--law", str(w / "law.json"), "--out",
                            str(w / "rep")])[1], bad=False, surface=S_DURABLE,
        check=_user_file_lost)

    # ------------------------------------------------------------------ secrets
    add("watch --webhook-file", lambda w: _webhook_file_case(w), bad=False, surface=S_SECRETS,
        check=_secret_anywhere)
    add("watch --webhook URL --wandb (offline)", lambda w: _wandb_webhook_case(w), bad=False,
        surface=S_SECRETS, check=_secret_anywhere, slow=True, alarm=120)
    add("watch --webhook answering an endless body", lambda w: [
        "watch", pre(w), "--source", str(w / "live_nan.jsonl"), "--webhook",
        _receiver(w, endless=True).url], bad=False, surface=S_SECRETS, check=_read_whole,
        alarm=60)

    # ------------------------------------------------------------------ size
    add("fit 300,000 rows, default form", lambda w: [
        "fit", str(_big_table(w)), "--out", str(w / "big-law.json")], ("big.csv", "rows"),
        bad=False, surface=S_SIZE, slow=True, alarm=1800, mem_cap=6 << 30)
    return C


def _amends_outside(w: Path) -> Path:
    """A pre-registration sealed by hand whose ``amends.path`` climbs out of its folder, to a
    valid pre-registration there."""
    from ladder.predict import prereg as pr
    doc = pr.load(w / "pre" / "prereg.json")
    outside = w.parent / "outside.json"
    outside.write_text(json.dumps(doc))
    d = {k: v for k, v in doc.items() if k not in ("sha256", "section_sha256")}
    d["amends"] = {"sha256": doc["sha256"], "path": "../../outside.json", "reason": "x",
                   "chain": [doc["sha256"]]}
    q = w / "pre" / "climb.json"
    q.write_text(json.dumps(pr.seal(d)))
    return q


def _fifo_metrics(w: Path) -> Path:
    d = _rung_dir(w)
    (d / "metrics.jsonl").unlink()
    _fifo(d / "metrics.jsonl")
    return w / "runs"


def _sparse(p: Path, size: int) -> Path:
    with open(p, "wb") as f:
        f.truncate(size)  # no disk used: a hole
    return p


def _deep(p: Path) -> Path:
    p.write_text("[" * 100_000 + "]" * 100_000)
    return p


def _config(w: Path, cfg: dict) -> Path:
    p = w / "cfg.json"
    p.write_text(json.dumps(cfg).replace('"__inf__"', "Infinity"))
    return p


def _webhook_file_case(w: Path) -> list[str]:
    rx = _receiver(w)
    hook = w / "hook.txt"
    hook.write_text(rx.url + "\n")
    hook.chmod(0o600)
    return ["watch", str(w / "pre" / "prereg.json"), "--source", str(w / "live_nan.jsonl"),
            "--webhook-file", str(hook), "--state", str(w / "st.json"), "--alerts",
            str(w / "alerts.jsonl")]


def _wandb_webhook_case(w: Path) -> list[str]:
    rx = _receiver(w)
    os.environ.update(WANDB_MODE="offline", WANDB_DIR=str(w), WANDB_SILENT="true")
    return ["watch", str(w / "pre" / "prereg.json"), "--source", str(w / "live_nan.jsonl"),
            "--webhook", rx.url, "--wandb", "--wandb-project", "fuzz"]



# ----------------------------------------------------------------------------- issue 39, writers
# A command touches only what it wrote; pairs of writes go together on a full disk; token ids are
# checked against the rung's vocabulary; damaged checkpoints, full disks and shared run folders
# end in one line. A user's file planted in a case is checked byte for byte afterwards ("lost"
# when it changed or went); a pair of writes left half made is "lost" too (the watcher never
# follows an amendment without its chain line).

S39_OWN, S39_PAIRS = "39 writers: only what it wrote", "39 writers: pairs of writes"
S39_VOCAB, S39_CKPT = "39 writers: token ids", "39 writers: checkpoints and locks"
_PLANTED: dict[str, list[tuple[Path, bytes]]] = {}
ENOSPC_TEXT = "No space left on device"


def corpus39_writers() -> list[Case]:
    """The writer cases of issue 39, by class."""
    C: list[Case] = []

    def add(*a, **kw):
        C.append(Case(*a, **kw))

    def report(w, out):
        return ["report", "--law", str(w / "law.json"), "--out", str(out)]

    def tokenize(w, out, *inputs):
        return ["tokenize", *(inputs or (str(_corpus_jsonl(w)),)), "--tokenizer",
                str(small_tokenizer(w)), "--out", str(out), "--processes", "0"]

    train = {"alarm": 180}
    # ------------------------------------------------------------------ only what it wrote
    for name in ("index.html", "summary.md", "law.png"):
        add(f"report --out holding the user's {name}", lambda w, n=name: report(
            w, _plant(w, w / "mine", n)), ("mine", name), surface=S39_OWN,
            check=_planted_intact)
    add("report --out a link to a folder holding the user's index.html", lambda w: report(
        w, _link(w / "lnk", _plant(w, w / "mine", "index.html"))), ("lnk", "mine", "index.html"),
        surface=S39_OWN, check=_planted_intact)
    add("report --out whose index.html was frozen (0444)", lambda w: report(
        w, _frozen_output(w, report(w, w / "rep"), w / "rep", "index.html")),
        ("index.html",), surface=S39_OWN, check=_planted_intact)
    add("report --out whose index.html links to the pre-registration", lambda w: report(
        w, _linked_output(w, report(w, w / "rep"), w / "rep", "index.html",
                          w / "pre" / "prereg.json")), ("index.html",), surface=S39_OWN,
        check=_planted_intact)
    add("compare --out whose compare.json was frozen (0444)", lambda w: _compare(
        w, _frozen_output(w, _compare(w, w / "cmp"), w / "cmp", "compare.json")),
        ("compare.json",), surface=S39_OWN, check=_planted_intact)
    for name in ("train-00000.bin", "val-00000.bin", "progress.json", "stream-00000.bin"):
        add(f"tokenize --out holding the user's {name}", lambda w, n=name: tokenize(
            w, _plant(w, w / "mine", n)), ("mine", name), surface=S39_OWN,
            check=_planted_intact)
    add("tokenize --out a link to a folder holding the user's train-00000.bin",
        lambda w: tokenize(w, _link(w / "lnk", _plant(w, w / "mine", "train-00000.bin"))),
        ("lnk", "mine", "train-00000.bin"), surface=S39_OWN, check=_planted_intact)
    for name in ("metrics.jsonl", "summary.md", "env.json"):
        add(f"run into a folder holding the user's {name}", lambda w, n=name: (
            _plant(w, _rung_folder(w), n), _run_into(w))[1], (_first_rung(), name),
            surface=S39_OWN, check=_planted_intact, bad=name != "summary.md",
            slow=name == "summary.md", **train)
    add("tokenize a FIFO among its inputs", lambda w: tokenize(
        w, w / "tok-out", str(_corpus_jsonl(w)), str(_fifo(w / "pipe.txt"))), ("pipe.txt",),
        surface=S39_OWN)
    add("tokenize a broken link among its inputs", lambda w: tokenize(
        w, w / "tok-out", str(_corpus_jsonl(w)), str(_link(w / "gone.txt", w / "nothing"))),
        ("gone.txt",), surface=S39_OWN)
    add("tokenize /dev/null among its inputs", lambda w: tokenize(
        w, w / "tok-out", str(_corpus_jsonl(w)), "/dev/null"), ("/dev/null",), surface=S39_OWN)
    add("tokenize a folder named among its inputs", lambda w: tokenize(
        w, w / "tok-out", str(_corpus_jsonl(w)), str(_folder_with_a_file(w / "more"))),
        ("more",), surface=S39_OWN)
    add("tokenize into a folder another tokenizer holds", lambda w: tokenize(w, w / "busy"),
        ("busy", "in use"), surface=S39_OWN, during=lambda w: _held(w / "busy"))
    # ------------------------------------------------------------------ pairs of writes
    for at in ("write", "fsync"):
        add(f"preregister --amend on a full disk ({at})", lambda w: _amend_argv(w),
            ("prereg-v2.json", "amendments.jsonl"), surface=S39_PAIRS,
            during=lambda w, at=at: _full_disk(at), check=_amendment_whole)
    add("tokenize with the manifest on a full disk", lambda w: tokenize(w, w / "full"),
        ("manifest.json",), surface=S39_PAIRS, during=lambda w: _full_manifest(),
        check=_shards_verify)
    add("run with a checkpoint save on a full disk", lambda w: [
        "run", "tiny", "--rung", _first_rung(), "--out", str(w / "train"), "--max-steps", "2",
        "--peak_flops=1e11", "--progress=false", "--checkpoint_async=false"],
        ("checkpoint",), surface=S39_PAIRS, during=lambda w: _full_checkpoints(),
        check=_nothing_half_made, slow=True, **train)
    # ------------------------------------------------------------------ token ids
    add("run --data .npy with one id beyond the vocabulary", lambda w: _run_data(
        w, _npy(w, stray=38_000)), ("tokens.npy", "vocab"), surface=S39_VOCAB, **train)
    add("run --data .bin declaring a larger vocabulary", lambda w: _run_data(
        w, _npy(w, stray=None, raw=True)) + ["--vocab-size", "40000"], ("tokens.bin", "vocab"),
        surface=S39_VOCAB, **train)
    add("run --data shards of a 300-token tokenizer", lambda w: _run_data(w, _manifest(
        w, lambda m: m.update(vocab_size=300))), ("shards", "vocab"), surface=S39_VOCAB,
        **train)
    add("run --data .npy within the vocabulary keeps the rung's model", lambda w: _run_data(
        w, _npy(w, stray=None)), bad=False, surface=S39_VOCAB, check=_rung_vocab_kept,
        slow=True, **train)
    # ------------------------------------------------------------------ checkpoints, locks
    add("run into a run folder another run holds", lambda w: _run_into(w), ("in use",),
        surface=S39_CKPT, during=lambda w: _held(_rung_folder(w)), **train)
    add("run into a run folder whose holder was killed", lambda w: (
        _dead_lock(_rung_folder(w)), _run_into(w))[1], bad=False, surface=S39_CKPT, check=_ran,
        slow=True, **train)
    add("run --resume over a damaged newest checkpoint", lambda w: (
        _damaged_newest(w), _run_into(w, "--max-steps", "3", "--resume"))[1], bad=False,
        surface=S39_CKPT, check=_resumed_from_older, slow=True, **train)
    return C


def _plant(w: Path, folder: Path, name: str) -> Path:
    """A user's own file ``name`` in ``folder`` (made), remembered to be checked after."""
    folder.mkdir(parents=True, exist_ok=True)
    f = folder / name
    f.write_bytes(b"the user's own " + name.encode())
    _PLANTED.setdefault(str(w), []).append((f, f.read_bytes()))
    return folder


def _folder_with_a_file(folder: Path) -> Path:
    folder.mkdir()
    (folder / "a.txt").write_text("alpha beta")
    return folder


def _planted_intact(w: Path, o: Outcome) -> str | None:
    for f, data in _PLANTED.pop(str(w), []):
        try:
            if f.read_bytes() != data:
                return "lost"
        except OSError:
            return "lost"
    return None


def _link(link: Path, target: Path) -> Path:
    link.symlink_to(target)
    return link


def _frozen_output(w: Path, argv: list[str], folder: Path, name: str) -> Path:
    """The command run once (its output in ``folder``), then its ``name`` made read-only."""
    code, _, err = run_cli(argv, alarm=300)
    assert code == 0, err
    (folder / name).chmod(0o444)
    _PLANTED.setdefault(str(w), []).append((folder / name, (folder / name).read_bytes()))
    return folder


def _linked_output(w: Path, argv: list[str], folder: Path, name: str, target: Path) -> Path:
    """The command run once, then its ``name`` replaced by a link to ``target`` (read-only)."""
    code, _, err = run_cli(argv, alarm=300)
    assert code == 0, err
    (folder / name).unlink()
    (folder / name).symlink_to(target)
    _PLANTED.setdefault(str(w), []).append((target, target.read_bytes()))
    return folder


def _compare(w: Path, out: Path) -> list[str]:
    return ["compare", str(w / "points.csv"), str(w / "points.csv"), "--bootstrap", "0",
            "--form", "compute", "--out", str(out)]


def small_tokenizer(w: Path) -> Path:
    p = w / "tokenizer.json"
    if p.exists():
        return p
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["alpha beta gamma delta"] * 20, trainers.BpeTrainer(
        vocab_size=270, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(p))
    return p


def _corpus_jsonl(w: Path) -> Path:
    p = w / "docs.jsonl"
    if not p.exists():
        words = ("alpha", "beta", "gamma", "delta")
        p.write_text("".join(json.dumps({"text": " ".join(words[(i + k) % 4] for k in range(30))
                                         + f" {i}"}) + "\n" for i in range(200)))
    return p


@contextlib.contextmanager
def _held(folder: Path):
    """Another process's lock on ``folder`` (an flock on a second open file: it conflicts
    within one process too); trees before the lock ignore it (their case is then accepted)."""
    import fcntl
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ".ladder.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                              "what": "ladder (another)", "since": "now"}).encode(), 0)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


def _enospc(*a, **k):
    raise OSError(28, ENOSPC_TEXT)


@contextlib.contextmanager
def _patched(obj, name: str, value):
    real = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, real)


def _full_disk(at: str):
    """The disk fills at the io layer's ``os.write`` (an append) or ``os.fsync`` (a staged
    file): what a full disk does to the amendment and its chain line."""
    import ladder.io as lio
    return _patched(lio.os, at, _enospc)


def _full_manifest():
    from ladder.trainer import tokens as T
    real = T.atomic_write_json

    def write(path, obj, **kw):
        if Path(path).name == "manifest.json":
            raise OSError(28, ENOSPC_TEXT, str(path))
        return real(path, obj, **kw)
    return _patched(T, "atomic_write_json", write)


def _full_checkpoints():
    """Orbax writes its metadata through etils paths: those writes fail, as on a full disk."""
    from etils import epath
    cls = type(epath.Path("/"))

    def write_text(self, *a, **k):
        raise OSError(28, ENOSPC_TEXT, str(self))
    return _patched(cls, "write_text", write_text)


def _amend_argv(w: Path) -> list[str]:
    return ["preregister", str(w / "law.json"), "--target-spec", str(w / "target.json"),
            "--amend", str(w / "pre" / "prereg.json"), "--reason", "the mix changed",
            "--eval-noise", "0.004", "--out", str(w / "pre" / "prereg-v2.json")]


def _amendment_whole(w: Path, o: Outcome) -> str | None:
    """The amendment and its chain line: both or neither; then the same command works and the
    chain leads to it."""
    new, chain = w / "pre" / "prereg-v2.json", w / "pre" / "amendments.jsonl"
    lines = chain.read_text().count("prereg-v2.json") if chain.exists() else 0
    if new.exists() != bool(lines):
        return "lost"
    if not new.exists():
        code, _, err = run_cli(_amend_argv(w), alarm=300)
        if code != 0:
            return "lost"
    from ladder.predict import prereg as pr
    return None if pr.resolve_chain(w / "pre" / "prereg.json").newest.path == str(new) \
        else "lost"


def _shards_verify(w: Path, o: Outcome) -> str | None:
    """After the failure, the same command finishes and every shard has its manifest's hash."""
    from ladder.io import sha256_file
    code, _, err = run_cli(["tokenize", str(_corpus_jsonl(w)),
                            "--tokenizer", str(small_tokenizer(w)),
                            "--out", str(w / "full"), "--processes", "0"], alarm=300)
    if code != 0:
        return "lost"
    m = json.loads((w / "full" / "manifest.json").read_text())
    ok = all(sha256_file(w / "full" / sh["file"]) == sh["sha256"]
             for s in ("train", "val") for sh in m["splits"][s]["shards"])
    return None if ok else "lost"


def _rung_folder(w: Path) -> Path:
    return w / "train" / "tiny" / _first_rung()


def _nothing_half_made(w: Path, o: Outcome) -> str | None:
    ck = _rung_folder(w) / "checkpoints"
    half = [p for p in ck.rglob("*") if "orbax-checkpoint-tmp" in p.name] if ck.exists() else []
    summary = _rung_folder(w) / "summary.json"
    status = json.loads(summary.read_text()).get("status") if summary.exists() else None
    return "lost" if half or status not in ("failed", None) else None


def _npy(w: Path, stray: int | None, raw: bool = False) -> Path:
    import numpy as np
    ids = np.random.default_rng(0).integers(0, 200, 20_000)
    if stray is not None:
        ids[777] = stray
    if raw:
        p = w / "tokens.bin"
        ids.astype(np.uint16).tofile(p)
    else:
        p = w / "tokens.npy"
        np.save(p, ids.astype(np.int32))
    return p


def _rung_vocab_kept(w: Path, o: Outcome) -> str | None:
    cfg = json.loads((_rung_folder(w) / "config.json").read_text())
    return None if cfg["rung"]["model"]["vocab_size"] == 256 else "accepted"


def _run_into(w: Path, *extra: str) -> list[str]:
    """`ladder run` of the first tiny rung, 1 step (a later --max-steps in ``extra`` wins)."""
    return ["run", "tiny", "--rung", _first_rung(), "--out", str(w / "train"), "--max-steps",
            "1", "--peak_flops=1e11", "--progress=false", *extra]


def _dead_lock(folder: Path) -> None:
    """The lock file a killed run left: its pid is gone."""
    folder.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                       capture_output=True, text=True, check=True)
    (folder / ".ladder.lock").write_text(json.dumps({"pid": int(p.stdout), "host": "h",
                                                     "what": "ladder run", "since": "then"}))


def _ran(w: Path, o: Outcome) -> str | None:
    return None if o.code == 0 and (_rung_folder(w) / "summary.json").exists() else "accepted"


def _damaged_newest(w: Path) -> None:
    """A run checkpointed at steps 1 and 2, then the newest checkpoint's array data torn."""
    for steps in ("1", "2"):
        code, _, err = run_cli(_run_into(w, "--max-steps", steps, "--resume"), alarm=300)
        assert code == 0, err
    for f in (_rung_folder(w) / "checkpoints" / "2").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(b"\0" * 7)


def _resumed_from_older(w: Path, o: Outcome) -> str | None:
    s = json.loads((_rung_folder(w) / "summary.json").read_text())
    return None if o.code == 0 and s.get("step") == 3 else "lost"


if __name__ == "__main__":
    sys.exit(main())
