"""Worlds that several test modules build alike, written once (issue 16: one shape for each idea).

Test modules import it as ``helpers`` (pytest puts tests/ on sys.path, as for ``conftest``);
bench/fuzz_inputs.py, which the default suite runs too, as ``tests.helpers``. It imports no test
module and nothing outside the library, so either import is the same code.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import struct
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------- a runs directory with a known law

KNOWN_LAW = (1.6, 40.0, 0.1)   # E, A, alpha of loss = E + A * C^-alpha (C in FLOPs)


def write_law_runs(root: Path, truth: tuple[float, float, float] = KNOWN_LAW, *,
                   status: str = "complete", train_loss: float | None = None,
                   target: bool = False):
    """The tiny ladder's runs under ``root/tiny/<rung>`` as the trainer lays them out (config.json,
    summary.json, metrics.jsonl, each line ending in a newline), every eval's
    ``eval_dropless/loss`` exactly on the compute law ``truth``. ``train/loss`` is ``train_loss``
    at every eval, or the law plus 0.01 when None. ``target``: the target rung's run too, as
    ``ladder run tiny`` trains it beside the rungs. Returns the ladder."""
    from ladder.specs import get_ladder

    E, A, alpha = truth
    lad = get_ladder("tiny")
    for rung in lad.all if target else lad.rungs:
        d = root / lad.name / rung.name
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(
            {"schema": "run-config/1", "rung": rung.to_dict(), "train": {}, "mesh": {}}))
        (d / "summary.json").write_text(json.dumps(
            {"schema": "run-summary/1", "status": status, "ladder": lad.name,
             "rung": rung.name}))
        lines = []
        for step in rung.eval_steps():
            tokens = step * rung.tokens_per_step
            loss = E + A * rung.compute(tokens) ** -alpha
            lines.append(json.dumps({"step": step, "tokens": tokens, "progress": step / rung.steps,
                                     "time": 0.0, "eval_dropless/loss": loss,
                                     "train/loss": loss + 0.01 if train_loss is None
                                     else train_loss}) + "\n")
        (d / "metrics.jsonl").write_text("".join(lines))
    return lad


# ---------------------------------------------------- a watched synthetic target run


@functools.cache
def watch_world():
    """(truth, target, law, noise) of the watcher tests: the 4th rung of a synthetic ladder (1200
    steps, an eval every 1%), its true law with 0.5% run-to-run scatter, eval noise 0.3%."""
    from tests import synthetic as sy

    truth = sy.Truth()
    return (truth, sy.ladder_targets(4, steps0=150)[-1], sy.TruthLaw(truth, run_sigma=0.005),
            sy.RunNoise(run_sigma=0.005, eval_sigma=0.003))


def watch_rows(fault: str = "none", at: float = 0.5, seed: int = 0) -> list[dict]:
    """The metrics rows of the watched target's run, with ``fault`` (of size 0.03) from ``at``."""
    from tests import synthetic as sy

    truth, target, _, noise = watch_world()
    return sy.make_run(truth, target, noise=noise, fault=sy.Fault(fault, at, 0.03), seed=seed,
                       offset=0.0).rows


def write_watch_prereg(path: Path) -> Path:
    """The target's pre-registration (its law, eval noise 0.003) written once at ``path``."""
    from ladder.predict import prereg as pr
    from ladder.predict.prereg import make_prereg

    _, target, law, _ = watch_world()
    return pr.write_once(path, make_prereg(law, target, eval_noise=0.003))


def write_jsonl(path, rows, mode: str = "w") -> None:
    """``rows`` as JSON lines (``mode="a"`` appends, as a training run does)."""
    with open(path, mode) as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


# ---------------------------------------------------- a `ladder run` stopped by a signal


def start_and_signal(args: list[str], metrics: Path, sig, *, every: int = 7,
                     timeout: float = 300) -> subprocess.Popen:
    """Start ``python -m ladder ARGS`` from the checkout, send ``sig`` once ``metrics`` holds
    10 or more rows and the run is past a checkpoint (every ``every`` steps) but not at one, and
    wait for it to end; its stderr is ``proc.err``."""
    proc = subprocess.Popen([sys.executable, "-m", "ladder", *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + timeout
        while time.time() < deadline and proc.poll() is None:
            n = metrics.read_bytes().count(b"\n") if metrics.exists() else 0
            if n >= 10 and n % every:
                break
            time.sleep(0.002)
        proc.send_signal(sig)
        proc.err = proc.communicate(timeout=timeout)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc


# ---------------------------------------------------- documents packed in one sequence


def assert_documents_stay_apart(fwd, tokens, vocab_size: int, cut: int, atol: float) -> None:
    """``fwd(tokens, segment_ids)`` -> per-token outputs [B, S, ...]. With two documents split
    at ``cut`` (segment 0, then 1), changing the first document's tokens leaves the second's
    outputs equal to ``atol`` and changes the first's; with one segment the second sees them."""
    import jax.numpy as jnp
    import numpy as np

    B, S = tokens.shape
    seg = jnp.broadcast_to(jnp.where(jnp.arange(S) < cut, 0, 1), (B, S)).astype(jnp.int32)
    changed = tokens.at[:, :cut].set((tokens[:, :cut] + 3) % vocab_size)
    a, b = fwd(tokens, seg), fwd(changed, seg)
    np.testing.assert_allclose(a[:, cut:], b[:, cut:], rtol=0, atol=atol)
    assert not np.allclose(a[:, :cut], b[:, :cut])
    whole = jnp.zeros((B, S), jnp.int32)
    assert not np.allclose(fwd(tokens, whole)[:, cut:], fwd(changed, whole)[:, cut:])


# ---------------------------------------------------- the CLI in-process, a deadline

def run_cli(*args) -> tuple[int, str, str]:
    """`ladder ARGS` in this process (a subprocess costs seconds of imports), warnings silenced:
    (exit code, stdout, stderr)."""
    import contextlib
    import io
    import warnings

    from ladder.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


class Hang(Exception):
    """What :func:`alarm` raises when its block is still running at the deadline."""


@contextmanager
def alarm(seconds: float = 120):
    """Raise :class:`Hang` in this (main) thread if the block is still running after
    ``seconds``: a test of "never blocks" fails instead of hanging the suite."""
    import signal

    def on(signum, frame):
        raise Hang(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, on)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class FakeWandbRun:
    """A run of W&B's public API (``wandb.Api().run``) over rows held in memory: the history,
    the config and the name that ladder.fit.points reads."""

    def __init__(self, rows, config, name):
        self.rows, self.config, self.name = rows, config, name

    def scan_history(self, page_size=1000):
        return iter([dict(r) for r in self.rows])


class FakeWandbApi:
    """``wandb.Api()``'s run lookup, by the last part of the run path."""

    def __init__(self, runs):
        self.runs = runs

    def run(self, path):
        return self.runs[path.split("/")[-1]]


def same(a, b) -> bool:
    """Equal as values and types, floats to the bit (NaN equal to NaN; 1 is not 1.0, -0.0 is
    not 0.0): what two JSON readers must agree on."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    return a == b


# ---------------------------------------------------- a law along a planned run (issue 16)


def predict_rung(law, rung, schedule=None, *, level: float | None = None, step=None,
                 fraction=None):
    """The law along ``rung`` (ladder.predict.planned.rung_query)."""
    from ladder.predict.planned import rung_query
    return law.predict(rung_query(rung, schedule, step=step, fraction=fraction), level=level)


@dataclass(frozen=True)
class PlanForecast:
    """Final loss (with band) of one plan for a run: its length and where the prediction ends."""

    steps: int
    tokens: int
    decay_end: float
    loss: float
    lo: float
    hi: float


@dataclass(frozen=True)
class ContingencyForecast:
    """"Continue as planned" vs "shorten and re-aim the decay" (the real hero's contingency:
    trouble within the first 25% of tokens -> shorten the run and re-aim the LR decay)."""

    planned: PlanForecast
    shortened: PlanForecast
    level: float

    def to_dict(self) -> dict:
        return {"planned": dataclasses.asdict(self.planned),
                "shortened": dataclasses.asdict(self.shortened), "level": self.level}


def contingency_forecast(law, rung, decay_end: float, *,
                         level: float | None = None) -> ContingencyForecast:
    """Projected final loss of ``rung`` as planned and when shortened to ``decay_end`` of its
    planned steps with the decay re-aimed to end there (``Schedule.decay_end``)."""
    from ladder.io import InputError
    if not 0 < decay_end <= 1:
        raise InputError(f"must be in (0, 1], got {decay_end!r}", field="decay_end")
    short_sched = dataclasses.replace(rung.schedule, decay_end=float(decay_end))
    short_steps = max(1, round(decay_end * rung.steps))
    out = []
    for sched, steps in ((rung.schedule, rung.steps), (short_sched, short_steps)):
        pred = predict_rung(law, rung, sched, level=level, step=[steps])
        out.append(PlanForecast(steps=int(steps), tokens=int(steps * rung.tokens_per_step),
                                decay_end=float(sched.decay_end), loss=float(pred.loss[0]),
                                lo=float(pred.lo[0]), hi=float(pred.hi[0])))
    return ContingencyForecast(out[0], out[1], float(pred.level))


# ---------------------------------------------------- attention, slow and obviously correct

def attend_reference(q, k, v, window, segment_ids=None):
    """Slow, obviously correct twin of ladder.model.layers.attend: q [B, S, H, Hd], k and v
    [B, T, K, Hd] -> [B, S, H, Hd] from full [B, K, G, S, T] float32 scores, masked causally
    (and to the last ``window`` keys, and within each query's segment), softmaxed."""
    import jax
    import jax.numpy as jnp

    B, S, H, Hd = q.shape
    K = k.shape[2]
    G = H // K
    q = q.reshape(B, S, K, G, Hd)               # [B,S,H,Hd] -> [B,S,K,G,Hd]; head h = k*G + g
    scores = jnp.einsum("bskgx,btkx->bkgst", q, k).astype(jnp.float32) / math.sqrt(Hd)
    s, t = jnp.arange(S)[:, None], jnp.arange(S)[None, :]
    mask = t <= s                                                # [S, T]
    if window is not None:
        mask = mask & (s - t < window)
    mask = mask[None, None, None]                                # [1, 1, 1, S, T]
    if segment_ids is not None:                                  # [B, 1, 1, S, T]
        mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None, None]
    scores = jnp.where(mask, scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)      # every row sees itself: no NaN
    out = jnp.einsum("bkgst,btkx->bskgx", probs, v)              # [B, S, K, G, Hd]
    return out.reshape(B, S, H, Hd)                              # [B,S,K,G,Hd] -> [B,S,H,Hd]


# ---------------------------------------------------- W&B offline runs read back

def offline_records(run_dir: Path, timeout: float = 60.0) -> list[dict]:
    """Every record of an offline W&B run directory's .wandb files, oldest segment first, once
    each segment ends with its exit record. ``run.finish()`` returns before wandb-core's writer
    has closed the file (wandb 0.31: its log says "stream: finishing up" after the call came
    back), so a test reading at once can find the run's history missing on a busy machine."""
    from ladder.sources import WandbOfflineSource, read_wandb_records
    t_end = time.monotonic() + timeout
    while True:
        segs = [[r for r in read_wandb_records(f, full=True)]
                for _, f in WandbOfflineSource(run_dir).segments()]
        if all(s and s[-1]["type"] == "exit" for s in segs) or time.monotonic() > t_end:
            return [r for s in segs for r in s]
        time.sleep(0.1)


def schedules_from_sources(sources) -> dict:
    """Exact per-update LRs of the ladder runs below ``sources`` (others give nothing), keyed
    ``LADDER/RUNG``, rebuilt from each run's config.json as the trainer builds them, so curve
    fits (``fit_curve_law(schedules=...)``) need not interpolate the LRs logged at evals."""
    from ladder.sources.runs import read_runs

    out = {}
    for src in sources if isinstance(sources, (list, tuple)) else [sources]:
        if Path(src).is_dir():
            for run in read_runs(src, metrics=False):
                if run.rung is not None and run.metrics_path.is_file():
                    out[run.key] = run.lr_table()
    return out
