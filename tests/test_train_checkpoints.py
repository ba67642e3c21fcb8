"""Checkpoints elsewhere (--checkpoint-dir: a folder or a file:// URL; gs:// and s3:// go to
Orbax as etils paths), written in the background, resumed bitwise; a resume that names another
checkpoint folder is refused; --profile-steps A:B writes a jax.profiler trace into the run
directory."""

from pathlib import Path

import pytest

from ladder.cli.main import main
from ladder.io import InputError, read_json, read_metrics
from ladder.specs import LADDERS
from ladder.trainer.checkpointing import location
from ladder.trainer.train import checkpoint_root, train_rung
from ladder.trainer.trainconfig import RunArgs, TrainConfig, profile_range

RUNG = LADDERS["tiny"].rungs[0]
KEYS = ["step", "train/loss", "grad/norm", "params/norm/router_bias", "eval/loss",
        "eval_dropless/loss"]


def _steps(path: Path) -> list[int]:
    return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit()) \
        if path.exists() else []


@pytest.mark.heavy  # 11 s on 2 busy cores
def test_checkpoints_in_another_folder_by_url_resume_bitwise_and_a_profile_is_written(
        tiny_run, tmp_path):
    ckpt = tmp_path / "store"
    run = RunArgs(peak_flops=1e11, progress=False, checkpoint_dir=f"file://{ckpt}",
                  checkpoint_every=7, profile_steps="2:3")
    cfg = TrainConfig(run=run)
    part = train_rung(RUNG, tmp_path / "r", cfg, max_steps=16)
    where = ckpt / RUNG.ladder / RUNG.name
    assert part["step"] == 16 and _steps(where) == [14, 16]       # keep 2: 7 went
    assert not (tmp_path / "r" / "checkpoints").exists()
    traces = list((tmp_path / "r" / "profile").rglob("*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0
    # resuming with the checkpoints elsewhere would start over: refused
    other = TrainConfig(run=RunArgs(peak_flops=1e11, progress=False, checkpoint_every=7))
    with pytest.raises(InputError, match="field 'train.checkpoint_dir'"):
        train_rung(RUNG, tmp_path / "r", other, resume=True)
    done = train_rung(RUNG, tmp_path / "r", cfg, resume=True)
    assert done["status"] == "complete" and done["step"] == RUNG.steps
    a = read_metrics(tiny_run[0] / "metrics.jsonl")
    b = read_metrics(tmp_path / "r" / "metrics.jsonl")
    assert [[r.get(k) for k in KEYS] for r in a] == [[r.get(k) for k in KEYS] for r in b]
    assert read_json(tmp_path / "r" / "config.json")["train"]["checkpoint_dir"] == \
        f"file://{ckpt}"


def test_checkpoint_locations():
    assert location("gs://bucket/runs") .as_posix() == "gs://bucket/runs"  # not resolved locally
    assert str(location("s3://bucket/a/b")) == "s3://bucket/a/b"
    assert location("file:///tmp/x/../y") == Path("/tmp/y")
    cfg = TrainConfig(run=RunArgs(checkpoint_dir="gs://b/runs/"))
    assert checkpoint_root(Path("out"), RUNG, cfg) == f"gs://b/runs/{RUNG.ladder}/{RUNG.name}"
    assert checkpoint_root(Path("out"), RUNG, TrainConfig()) == Path("out") / "checkpoints"


@pytest.mark.parametrize("key, value", [("checkpoint_dir", "ftp://host/x"),
                                        ("checkpoint_dir", ""), ("profile_steps", "3:2"),
                                        ("profile_steps", "0:4"), ("profile_steps", "5"),
                                        ("checkpoint_async", "yes")])
def test_bad_checkpoint_and_profile_settings_are_refused(key, value, tmp_path, capsys):
    with pytest.raises(ValueError, match=key):
        RunArgs(**{key: value})
    if key != "checkpoint_async":
        flag = "--" + key.replace("_", "-")
        code = main(["run", "tiny", "--out", str(tmp_path), "--max-steps", "1", flag, value])
        assert code == 64 and not (tmp_path / "tiny").exists()
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and key in err
    assert profile_range("2:5") == (2, 5) and profile_range(" 1:1") == (1, 1)
