"""The per-step LR table: the real recipe's shape, WSD, cosine, re-aimed decay and the lr-spike."""

import math

import numpy as np
import pytest

from ladder.lrtable import run_lr_table
from ladder.specs import LADDERS, Schedule
from ladder.trainer.trainconfig import (
    Fault,
    OptimizerOverrides,
    RunArgs,
    TrainConfig,
    checkpoint_steps,
    resolve_rung,
)

RUNG = LADDERS["tiny"].rungs[0].replace(steps=200, peak_lr=1.0)


def lr_table(rung, fault=None):
    """The table as the trainer builds it: from the flat config that config.json records."""
    return run_lr_table(rung, TrainConfig(fault=fault).to_dict())


def test_linear_is_the_real_recipe():
    lr = lr_table(RUNG)
    # 1% warmup = 2 steps: 1/2, 2/2; then linear from 1 at step 2 to 0.05 at step 200
    assert lr[0] == pytest.approx(0.5) and lr[1] == pytest.approx(1.0)
    assert lr[101] == pytest.approx(1 - 0.95 * 99 / 198)
    assert lr[-1] == pytest.approx(1 - 0.95 * 197 / 198)
    assert lr[2] == 1.0 and np.all(np.diff(lr[2:]) < 0)


def test_wsd_cosine_and_reaimed_decay():
    wsd = lr_table(RUNG.replace(schedule=Schedule("wsd", decay=0.2)))
    assert np.all(wsd[2:160] == 1.0) and wsd[180] == pytest.approx(1 - 0.95 * 20 / 40)
    cos = lr_table(RUNG.replace(schedule=Schedule("cosine")))
    assert cos[101] == pytest.approx(0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * 99 / 198)))
    # decay_end 0.5: the decay ends at step 100 and the LR stays at 5% after it
    rung = resolve_rung(RUNG, TrainConfig(optim=OptimizerOverrides(schedule={"decay_end": 0.5})))
    short = lr_table(rung)
    assert short[50] == pytest.approx(1 - 0.95 * 48 / 98)
    assert np.all(short[100:] == 0.05)


def test_lr_spike_fault_multiplies_from_its_step():
    fault = Fault("lr-spike", at=0.5, scale=10.0)
    assert fault.first_step(RUNG.steps) == 100
    base, spiked = lr_table(RUNG), lr_table(RUNG, fault)
    np.testing.assert_array_equal(spiked[:100], base[:100])
    np.testing.assert_allclose(spiked[100:], 10 * base[100:], rtol=1e-6)


def test_checkpoints_every_quarter_and_at_the_end():
    assert checkpoint_steps(RUNG, RunArgs()) == {50, 100, 150, 200}
    assert checkpoint_steps(RUNG, RunArgs(checkpoint_every=70)) == {70, 140, 200}
