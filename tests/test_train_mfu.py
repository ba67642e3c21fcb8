"""MFU's denominator (devices x one device's peak; CPU measured once) and the run flags of the
step: --microbatch, --peak-flops, eval_batch."""

import pytest

from ladder.cli.main import main
from ladder.io import InputError
from ladder.specs import LADDERS
from ladder.trainer.train import peak_flops_info
from ladder.trainer.trainconfig import TrainConfig, eval_batch_size, microbatch_size

RUNG = LADDERS["tiny"].rungs[0]


def test_peak_flops_override_is_per_device():
    p = peak_flops_info(2e14, 8)
    assert p["flops_per_s"] == 2e14 and p["total_flops_per_s"] == 8 * 2e14
    assert p["devices"] == 8 and "config" in p["source"]


def test_cpu_peak_is_the_hosts_measured_rate_not_times_devices():
    p = peak_flops_info(None, 8)          # this test process: the CPU backend
    assert p["total_flops_per_s"] == p["flops_per_s"] > 0
    assert p["source"].startswith("measured")


def test_microbatch_must_divide_the_batch(capsys):
    assert microbatch_size(RUNG, TrainConfig()) == RUNG.batch
    assert microbatch_size(RUNG, TrainConfig(microbatch=2)) == 2
    with pytest.raises(InputError, match="microbatch"):
        microbatch_size(RUNG, TrainConfig(microbatch=3))
    code = main(["run", "tiny", "--rung", RUNG.name, "--microbatch", "3", "--peak-flops", "1e11",
                 "--out", "/nonexistent-never-written"])
    assert code == 64 and "microbatch" in capsys.readouterr().err
    with pytest.raises(ValueError, match="^eval_batch:"):
        TrainConfig(eval_batch=0)



def test_eval_batch_is_one_sequence_per_device_by_default(capsys):
    assert eval_batch_size(TrainConfig(), 8) == 8 and eval_batch_size(TrainConfig(), 1) == 1
    assert eval_batch_size(TrainConfig(eval_batch=16), 8) == 16
    code = main(["run", "tiny", "--rung", RUNG.name, "--eval-batch", "0", "--peak-flops", "1e11",
                 "--out", "/nonexistent-never-written"])
    assert code == 64 and "eval_batch" in capsys.readouterr().err
