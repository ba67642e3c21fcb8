"""Training data other than the eval data, and a change of training data at a fraction of the
run (issue 27: ``train_data``, ``switch_data``, ``switch_at``): the evals stay on ``data``'s
held-out split; batches before the switch are the unswitched run's, so its rows are too; a run
stopped after the switch resumes bitwise; bad values are refused; a run directory written
before these keys existed still resumes."""

import pytest

from ladder.io import InputError, read_json, read_metrics
from ladder.specs import LADDERS
from ladder.trainer.rundir import previous_run
from ladder.trainer.train import train_rung
from ladder.trainer.trainconfig import RunArgs, TrainConfig

RUNG = LADDERS["tiny"].rungs[0]
KEYS = ["step", "train/loss", "grad/norm", "eval/loss", "eval_dropless/loss"]


def rows(path):
    return [[r.get(k) for k in KEYS] for r in read_metrics(path / "metrics.jsonl")]


@pytest.mark.heavy  # 13 s on 2 busy cores
def test_switch_data_changes_batches_from_the_switch_on_and_resumes_bitwise(tiny_run,
                                                                              tmp_path):
    other = tmp_path / "other.txt"
    other.write_bytes(b"abcabcabd" * 4000)   # a corpus nothing like the stdlib
    run = RunArgs(peak_flops=1e11, progress=False, checkpoint_every=5)
    cfg = TrainConfig(run=run, switch_data=(str(other),), switch_at=0.5)
    switch = round(0.5 * RUNG.steps)
    part = train_rung(RUNG, tmp_path / "r", cfg, max_steps=switch + 10)
    assert part["step"] == switch + 10
    done = train_rung(RUNG, tmp_path / "r", cfg, resume=True)
    assert done["status"] == "complete"
    ref, got = rows(tiny_run[0]), rows(tmp_path / "r")
    before = [r for r in got if r[0] <= switch]
    assert before == [r for r in ref if r[0] <= switch]          # the same batches before it
    after_ref = {r[0]: r[1] for r in ref if r[0] > switch}
    # a periodic corpus is learnt at once: the train loss falls far below the stdlib run's
    assert all(r[1] < after_ref[r[0]] for r in got if r[0] > switch + 10)
    # the uninterrupted run is the same, bitwise
    whole = train_rung(RUNG, tmp_path / "w", cfg)
    assert whole["status"] == "complete" and rows(tmp_path / "w") == got
    t = read_json(tmp_path / "r" / "config.json")["train"]
    assert t["switch_data"] == [str(other)] and t["switch_at"] == 0.5 and t["train_data"] is None


@pytest.mark.parametrize("kw,field", [
    ({"switch_at": 0.5}, "switch_at"),                           # without switch_data
    ({"switch_data": ("x.txt",)}, "switch_at"),                  # without switch_at
    ({"switch_data": ("x.txt",), "switch_at": 1.0}, "switch_at"),
    ({"switch_data": ("x.txt",), "switch_at": 0.0}, "switch_at"),
    ({"train_data": ()}, "train_data"),
    ({"train_data": (3,)}, "train_data"),
])
def test_bad_switch_settings_are_refused(kw, field):
    with pytest.raises(ValueError, match=field):   # the CLI makes it a one-line usage error
        TrainConfig(**kw)


def test_missing_switch_data_is_refused_before_anything_is_written(tmp_path):
    cfg = TrainConfig(run=RunArgs(peak_flops=1e11, progress=False),
                      switch_data=(str(tmp_path / "nope.txt"),), switch_at=0.5)
    with pytest.raises(InputError, match="nope.txt"):
        train_rung(RUNG, tmp_path / "r", cfg)
    assert not (tmp_path / "r").exists()


def test_a_run_written_before_the_switch_keys_still_resumes(tiny_run, tmp_path):
    config = read_json(tiny_run[0] / "config.json")
    old = {**config, "train": {k: v for k, v in config["train"].items()
                               if k not in ("train_data", "switch_data", "switch_at")}}
    d = tmp_path / "old"
    d.mkdir()
    (d / "config.json").write_text(__import__("json").dumps(old))
    (d / "summary.json").write_text((tiny_run[0] / "summary.json").read_text())
    assert previous_run(d, config, resume=True)["status"] == "complete"
