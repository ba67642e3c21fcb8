"""`ladder run` / train_rung on the tiny ladder: keys, falling loss, exact resume, failures."""

import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import start_and_signal

from ladder.cli.main import main
from ladder.io import read_json, read_metrics
from ladder.sources.runs import read_run
from ladder.specs import LADDERS, Rung
from ladder.trainer.train import train_rung
from ladder.trainer.trainconfig import Fault, RunArgs, TrainConfig

ROOT = Path(__file__).resolve().parent.parent
RUNG = LADDERS["tiny"].rungs[0]
CFG = TrainConfig(run=RunArgs(peak_flops=1e11, progress=False))  # a given peak: no matmul measured
# tiny_run (conftest): RUNG trained once with CFG, shared with test_train_preempt.py

# shared/DESIGN.md section 3: the keys of metrics.jsonl
ALWAYS = ["step", "tokens", "progress", "time", "train/loss", "train/ce", "train/z_loss",
          "optim/lr", "grad/norm", "moe/drop_frac", "moe/load_max_over_mean",
          "moe/router_entropy", "throughput/tokens_per_s", "throughput/mfu", "flops"]
EVAL = ["eval/loss", "eval_dropless/loss", "eval/bpb"]
GROUPS = ["embedding", "lm_head", "attention", "norms", "router", "latent", "shared_experts",
          "routed_experts", "router_bias"]


def test_tiny_rung_trains_and_writes_the_run_directory(tiny_run):
    out, summary = tiny_run
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, RUNG.steps + 1))
    for r in rows:
        missing = [k for k in ALWAYS + [f"params/norm/{g}" for g in GROUPS] if k not in r]
        assert not missing, (r["step"], missing)
        assert r["tokens"] == r["step"] * RUNG.batch * RUNG.seq_len
        assert r["progress"] == pytest.approx(r["step"] / RUNG.steps)
        assert r["flops"] == pytest.approx(RUNG.compute(r["tokens"]))
    evals = [r for r in rows if "eval_dropless/loss" in r]
    assert [r["step"] for r in evals] == RUNG.eval_steps()
    for r in evals:
        assert all(k in r for k in EVAL)
        assert r["eval/bpb"] == pytest.approx(r["eval_dropless/loss"] / math.log(2))
    # the loss falls: from ~ln(256) = 5.55 at init to well below the unigram entropy of code. The
    # recipe's init gives logits of std ~0.5 (+0.13 nats on average), and a byte batch's few
    # frequent targets keep the step's mean off that by tenths (5.94 measured on this rung)
    first, last = rows[0]["train/ce"], np.mean([r["train/ce"] for r in rows[-5:]])
    assert first == pytest.approx(math.log(256), abs=0.5)
    assert last < first - 1.5
    assert evals[-1]["eval_dropless/loss"] < evals[0]["eval_dropless/loss"]
    # the real recipe's schedule: warmup to the peak, linear decay to 5% of it
    lrs = [r["optim/lr"] for r in rows]
    assert max(lrs) == pytest.approx(RUNG.peak_lr, rel=1e-6)
    warm = 0.01 * RUNG.steps  # the last step (index steps-1) is 1 step short of the end
    assert lrs[-1] == pytest.approx(
        RUNG.peak_lr * (1 - 0.95 * (RUNG.steps - 1 - warm) / (RUNG.steps - warm)), rel=1e-6)
    # ... and it is the table the curve laws rebuild from the run directory (one LR table)
    np.testing.assert_array_equal(np.float32(lrs), read_run(out).lr_table().astype(np.float32))

    assert summary["status"] == "complete" and summary["step"] == RUNG.steps
    assert summary["final"]["eval_dropless/loss"] == evals[-1]["eval_dropless/loss"]
    assert summary["tokens_seen"] == summary["tokens"] == RUNG.tokens
    assert summary["compute"] == RUNG.compute() and summary["schema"] == "run-summary/1"
    cfg = read_json(out / "config.json", schema="run-config")
    # the rung as it ran: "auto" precision recorded as what it resolved to (f32 on CPU)
    assert Rung.from_dict(cfg["rung"]) == RUNG.replace(model=RUNG.model.replace(precision="f32"))
    assert cfg["mesh"]["shape"] == {"data": 1, "expert": 1}
    assert cfg["mesh"]["eval_batch"] == 1 and cfg["train"]["eval_batch"] is None   # 1 / device
    env = read_json(out / "env.json", schema="run-env")
    assert env["corpus"]["kind"] == "python-stdlib" and env["versions"]["jax"]
    assert "sha" in env["git"] and env["devices"]["count"] >= 1
    # on CPU no layout is chosen (f32, the whole batch) and no GPU setting is made (issue 37)
    assert cfg["layout"] is None and cfg["mesh"]["microbatch"] == RUNG.batch
    assert env["gpu_env"]["gpu"] is False and env["gpu_env"]["xla_flags_set"] == []
    # the attention each program traced, and why (issue 37): on CPU XLA's, for both programs
    chunk = RUNG.model.attention_chunk
    want = "xla-blocked" if chunk is not None and RUNG.seq_len > chunk else "xla"
    assert set(env["attention"]) == {"train", "eval"}
    for program in ("train", "eval"):
        assert [c["implementation"] for c in env["attention"][program]] == [want]
        assert env["attention"][program][0]["reason"].startswith("backend cpu")
    # Orbax keeps the last 2 checkpoints
    assert sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit()) \
        == RUNG.eval_steps()[-2:]


def test_resume_reproduces_the_uninterrupted_run_bitwise(tiny_run, tmp_path):
    out, _ = tiny_run
    part = train_rung(RUNG, tmp_path / "r", CFG, max_steps=23)
    assert part["status"] == "running" and part["step"] == 23
    seen = []
    done = train_rung(RUNG, tmp_path / "r", CFG, resume=True, on_metrics=seen.append)
    assert done["status"] == "complete"
    assert [r["step"] for r in seen] == list(range(24, RUNG.steps + 1))
    a = read_metrics(out / "metrics.jsonl")
    b = read_metrics(tmp_path / "r" / "metrics.jsonl")
    keys = ["train/loss", "grad/norm", "params/norm/router_bias", "eval/loss",
            "eval_dropless/loss"]
    assert [[r.get(k) for k in keys] for r in a] == [[r.get(k) for k in keys] for r in b]
    # a completed run is skipped, not retrained
    again = train_rung(RUNG, tmp_path / "r", CFG)
    assert again["updated"] == done["updated"]


def _cli(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "ladder", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False, **kw)


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_loses_and_duplicates_nothing(tiny_run, tmp_path):
    out, _ = tiny_run
    args = ["run", "tiny", "--rung", RUNG.name, "--out", str(tmp_path), "--peak_flops=1e11",
            "--checkpoint_every=7", "--progress=false"]
    metrics = tmp_path / "tiny" / RUNG.name / "metrics.jsonl"
    proc = start_and_signal(args, metrics, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    killed_at = metrics.read_bytes().count(b"\n")
    assert 10 <= killed_at < RUNG.steps
    r = _cli(*args, "--resume")
    assert r.returncode == 0, r.stderr
    lines = metrics.read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines]
    assert steps == list(range(1, RUNG.steps + 1))        # no duplicate, no gap, no partial line
    ref = {row["step"]: row["train/loss"] for row in read_metrics(out / "metrics.jsonl")}
    assert [json.loads(line)["train/loss"] for line in lines] == [ref[s] for s in steps]


@pytest.mark.slow
def test_ctrl_c_checkpoints_and_exits_then_resumes(tiny_run, tmp_path):
    out, _ = tiny_run
    args = ["run", "tiny", "--rung", RUNG.name, "--out", str(tmp_path), "--peak_flops=1e11",
            "--checkpoint_every=7", "--progress=false"]
    run_dir = tmp_path / "tiny" / RUNG.name
    proc = start_and_signal(args, run_dir / "metrics.jsonl", signal.SIGINT)
    assert proc.returncode == 130, proc.err
    assert "interrupted at step" in proc.err and "--resume" in proc.err
    s = read_json(run_dir / "summary.json", schema="run-summary")
    assert s["status"] == "running" and s["interrupted"] and 10 <= s["step"] < RUNG.steps
    assert s["step"] % 7  # saved at the step it stopped at, not only at the last multiple of 7
    assert str(s["step"]) in {p.name for p in (run_dir / "checkpoints" / "rolling").iterdir()}
    assert _cli(*args, "--resume").returncode == 0
    ref = read_metrics(out / "metrics.jsonl")
    assert [r["train/loss"] for r in read_metrics(run_dir / "metrics.jsonl")] == \
        [r["train/loss"] for r in ref]


def test_nan_loss_marks_the_run_diverged(tmp_path, capsys):
    code = main(["run", "tiny", "--rung", RUNG.name, "--out", str(tmp_path), "--peak_flops=1e11",
                 "--progress=false", "--lr=1e3"])  # the largest --lr takes (ranges)
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and "diverged at step" in err
    s = read_json(tmp_path / "tiny" / RUNG.name / "summary.json", schema="run-summary")
    rows = read_metrics(tmp_path / "tiny" / RUNG.name / "metrics.jsonl")
    assert s["status"] == "diverged" and s["step"] == rows[-1]["step"] < RUNG.steps
    assert not math.isfinite(float(rows[-1]["train/loss"]))
    assert all(math.isfinite(r["train/loss"]) for r in rows[:-1])


@pytest.mark.parametrize("case", ["top_k", "token_file", "unknown_key", "bad_value"])
def test_bad_input_fails_with_one_line_and_writes_nothing(tmp_path, capsys, case):
    out = tmp_path / "out"
    args = ["run", "tiny", "--rung", RUNG.name, "--out", str(out), "--progress=false"]
    if case == "top_k":
        args.append("--model.top_k=9")
        expect = "model.top_k"
    elif case == "token_file":
        bad = tmp_path / "tokens.npy"
        np.save(bad, np.array([1, 2, 3, 999, 5] * 100, dtype=np.uint16))
        args += ["--data", str(bad), "--vocab-size", "256"]
        expect = str(bad)
    elif case == "unknown_key":
        args.append("--learning_rate=0.1")
        expect = "learning_rate"
    else:
        args.append("--eval_sequences=0")
        expect = "eval_sequences"
    code = main(args)
    err = capsys.readouterr().err.strip()
    assert code >= 64, err
    assert len(err.splitlines()) == 1 and expect in err
    assert not out.exists()


def test_config_file_and_overrides(tmp_path):
    from ladder.trainer.trainconfig import parse_overrides, train_config

    cfg = train_config({"seed": 3, "schedule": {"kind": "wsd"},
                        **parse_overrides(["--schedule.decay_end=0.5", "--lr=0.01",
                                           "--model.capacity_factor=2", "--data=a.txt"])})
    assert cfg.seed == 3 and cfg.optim.lr == 0.01 and cfg.data == ("a.txt",)
    assert cfg.optim.schedule == {"kind": "wsd", "decay_end": 0.5}
    assert cfg.model == {"capacity_factor": 2}
    assert train_config(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_wandb_offline_mirror(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    s = train_rung(RUNG, tmp_path / "w", TrainConfig(run=RunArgs(
        peak_flops=1e11, progress=False, wandb=True)), max_steps=3)
    run_dir = Path(s["wandb"]["dir"])
    assert s["wandb"]["mode"] == "offline" and run_dir.is_dir()
    assert run_dir.is_relative_to(tmp_path / "w")
    assert list(run_dir.glob("*.wandb"))   # the offline run log (a watch source)


@pytest.mark.parametrize("fault", ["lr-spike", "data-swap"])
def test_injected_faults_start_at_their_step(tiny_run, tmp_path, fault):
    out, _ = tiny_run
    ref = read_metrics(out / "metrics.jsonl")
    cfg = TrainConfig(run=RunArgs(peak_flops=1e11, progress=False),
                      fault=Fault(fault, at=0.5, scale=10.0))
    s = train_rung(RUNG, tmp_path / fault, cfg)
    rows = read_metrics(tmp_path / fault / "metrics.jsonl")
    k = RUNG.steps // 2                       # steps 1..k run clean, step k+1 is the first hit
    assert s["fault"]["from_step"] == k + 1 and s["status"] == "complete"
    assert [r["train/loss"] for r in rows[:k]] == [r["train/loss"] for r in ref[:k]]
    if fault == "lr-spike":
        assert rows[k]["optim/lr"] == pytest.approx(10 * ref[k]["optim/lr"], rel=1e-6)
        assert rows[k]["train/loss"] == ref[k]["train/loss"]  # the LR acts on the update
        assert rows[k + 1]["train/loss"] != ref[k + 1]["train/loss"]
    else:
        assert rows[k]["optim/lr"] == ref[k]["optim/lr"]
        assert rows[k]["train/loss"] != ref[k]["train/loss"]  # a different batch at once
        # order destroyed: training on shuffled bytes cannot keep the held-out loss falling
        assert rows[-1]["eval_dropless/loss"] > ref[-1]["eval_dropless/loss"]


@pytest.mark.slow
def test_ladder_run_tiny_trains_every_rung_then_skips_them(tmp_path):
    r = _cli("run", "tiny", "--out", str(tmp_path), "--peak_flops=1e11", "--progress=false")
    assert r.returncode == 0, r.stderr
    lad = LADDERS["tiny"]
    for rung in lad.all:
        s = read_json(tmp_path / "tiny" / rung.name / "summary.json", schema="run-summary")
        assert s["status"] == "complete" and s["step"] == rung.steps
        assert s["is_target"] == rung.is_target
    assert r.stdout.splitlines()[-1].startswith(f"tiny/{lad.target.name}: complete")
    again = _cli("run", "tiny", "--out", str(tmp_path), "--peak_flops=1e11")
    assert again.returncode == 0 and again.stdout.count("complete") == len(lad.all)


def test_unknown_key_in_a_config_file_names_the_file(tmp_path, capsys):
    cfg = tmp_path / "train.json"
    cfg.write_text(json.dumps({"seed": 1, "schedule": {"kind": "wsd", "warmupp": 0.1}}))
    code = main(["run", "tiny", "--out", str(tmp_path / "o"), "--config", str(cfg)])
    err = capsys.readouterr().err.strip()
    assert code == 64 and str(cfg) in err and "schedule.warmupp" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "o").exists()
