"""Preemption: SIGTERM checkpoints at the next step boundary and exits 143; rolling time-based
checkpoints beside the permanent ones; resume after either is bitwise the uninterrupted run."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import start_and_signal

from ladder.io import read_json, read_metrics
from ladder.specs import LADDERS
from ladder.trainer.train import train_rung
from ladder.trainer.trainconfig import RunArgs, TrainConfig

ROOT = Path(__file__).resolve().parent.parent
RUNG = LADDERS["tiny"].rungs[0]
KEYS = ["step", "tokens", "train/loss", "train/ce", "grad/norm", "params/norm/router_bias",
        "moe/drop_frac", "eval/loss", "eval_dropless/loss"]


@pytest.fixture(scope="module")
def reference(tiny_run):
    """The metrics rows of RUNG trained uninterrupted at peak_flops 1e11 (conftest's tiny_run;
    the run arguments below differ only in what never changes a run's numbers)."""
    return read_metrics(tiny_run[0] / "metrics.jsonl")


def _steps(path: Path) -> list[int]:
    return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit()) \
        if path.exists() else []


@pytest.mark.heavy  # 6 s on 2 busy cores
@pytest.mark.parametrize("background", [False, True], ids=["sync", "async"])
def test_sigterm_checkpoints_at_the_step_boundary_then_resume_is_bitwise(reference, tmp_path,
                                                                        monkeypatch, background):
    """With background (async) saves, the last save is complete when train_rung returns; the
    directory seen mid-run is checked with synchronous saves (an async one may still be in
    flight at step 20)."""
    out = tmp_path / "run"
    cfg = TrainConfig(run=RunArgs(peak_flops=1e11, progress=False, checkpoint_minutes=1.0,
                                  checkpoint_async=background))
    clock = [0.0]   # the checkpoint clock, driven by the test: a minute passes during step 19
    monkeypatch.setattr("ladder.trainer.checkpointing._clock", lambda: clock[0])
    seen: dict = {}

    def preempt(row):
        if row["step"] in (17, 18):
            clock[0] += 29.0    # 58 s since the last save: not yet due
        if row["step"] == 19:
            clock[0] += 3.0     # 61 s: a rolling checkpoint after this step
        if row["step"] == 20:   # rolling checkpoints so far: only the newest, beside step 15
            seen["rolling"] = _steps(out / "checkpoints" / "rolling")
            seen["permanent"] = _steps(out / "checkpoints")
        if row["step"] == 23:   # the scheduler's SIGTERM arrives in the middle of step 23's work
            os.kill(os.getpid(), signal.SIGTERM)

    s = train_rung(RUNG, out, cfg, on_metrics=preempt)
    if not background:
        assert seen == {"rolling": [19], "permanent": [15]}
    assert s["status"] == "running" and s["interrupted"] and s["signal"] == "SIGTERM"
    assert s["step"] == 23                                   # saved at the next step boundary
    assert _steps(out / "checkpoints" / "rolling") == [23]   # ... as the rolling checkpoint
    assert _steps(out / "checkpoints") == [15]               # the permanent ones untouched
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handler restored
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(1, 24))

    done = train_rung(RUNG, out, cfg, resume=True)
    assert done["status"] == "complete" and not done.get("interrupted")
    rows = read_metrics(out / "metrics.jsonl")
    assert [[r.get(k) for k in KEYS] for r in rows] == \
        [[r.get(k) for k in KEYS] for r in reference]
    assert done["final"]["eval_dropless/loss"] == reference[-1]["eval_dropless/loss"]
    # the last permanent checkpoint superseded the rolling one
    assert _steps(out / "checkpoints" / "rolling") == []
    assert _steps(out / "checkpoints") == RUNG.eval_steps()[-2:]


def test_checkpoint_minutes_is_validated():
    with pytest.raises(ValueError, match="checkpoint_minutes"):
        RunArgs(checkpoint_minutes=0)


@pytest.mark.slow
def test_ladder_run_exits_143_on_sigterm_and_resumes_identically(reference, tmp_path):
    args = ["run", "tiny", "--rung", RUNG.name, "--out", str(tmp_path), "--peak_flops=1e11",
            "--checkpoint_every=7", "--progress=false"]
    run_dir = tmp_path / "tiny" / RUNG.name
    metrics = run_dir / "metrics.jsonl"
    proc = start_and_signal(args, metrics, signal.SIGTERM)
    err = proc.err
    assert proc.returncode == 143, err
    assert "interrupted at step" in err and "SIGTERM" in err and "--resume" in err
    s = read_json(run_dir / "summary.json", schema="run-summary")
    assert s["signal"] == "SIGTERM" and 10 <= s["step"] < RUNG.steps and s["step"] % 7
    assert _steps(run_dir / "checkpoints" / "rolling") == [s["step"]]
    r = subprocess.run([sys.executable, "-m", "ladder", *args, "--resume"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    rows = read_metrics(metrics)
    assert [[r.get(k) for k in KEYS] for r in rows] == \
        [[r.get(k) for k in KEYS] for r in reference]

