"""Issue 26 item 5: every ladder-file and config number has a range (what a rung can be on any
machine); outside it, a one-line error naming the file and the field, at once (before: a
traceback, a hang counting 10**7 layers, or rungs of ~1e300 steps accepted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import alarm

from ladder.cli.main import main
from ladder.trainer.trainconfig import train_config

TINY = (Path(__file__).resolve().parents[1] / "ladder" / "ladders" / "tiny.toml").read_text()
FIRST = "[[rungs]]\nd = 16\nn_layers = 2"




@pytest.mark.parametrize("old, new, field", [
    ("d = 16", "d = 1" + "0" * 200, "rungs[0].d"),
    ("vocab_size = 256", f"vocab_size = {2 ** 62}", "recipe.vocab_size"),
    (FIRST, FIRST + "\nbatch_units = 0", "rungs[0].batch_units"),
    ("tokens_per_active = 4", "tokens_per_active = 1e300", "recipe.tokens_per_active"),
    (FIRST, "[[rungs]]\nd = 16\nn_layers = 10000000", "rungs[0].n_layers"),
    ("eval_every = 0.25", "eval_every = 1e-300", "recipe.eval_every"),
    ("capacity_factor = 1.6", "capacity_factor = inf", "recipe.capacity_factor"),
    ("lr_coef = 0.087571", "lr_coef = nan", "recipe.lr_coef"),
    ("lr_d_exp = -0.3448", "lr_d_exp = 1e300", "recipe.lr_d_exp"),
    ("head_dim = 8", "head_dim = 100000", "recipe.head_dim"),
    ("n_experts = 4", "n_experts = 1000000", "recipe.n_experts"),
    ("eval_every = 0.25", f"eval_every = 0.25\neval_sequences = {2 ** 40}",
     "recipe.eval_sequences"),
    ("eval_every = 0.25", f"eval_every = 0.25\neval_batch = {2 ** 40}", "recipe.eval_batch"),
])
def test_a_number_out_of_range_in_a_ladder_file_is_one_line(tmp_path, capsys, old, new, field):
    assert old in TINY
    f = tmp_path / "lad.toml"
    f.write_text(TINY.replace(old, new, 1))
    with alarm():
        code = main(["list", "--ladder-file", str(f)])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 65, last
    assert "lad.toml" in last and f"field '{field}'" in last


def test_the_real_ladders_are_inside_every_range():
    from ladder.specs import LADDERS
    for lad in LADDERS.values():
        for r in lad.all:
            assert 1 <= r.steps <= 10 ** 12 and r.model.d_model <= 2 ** 17


@pytest.mark.parametrize("values, field", [
    ({"eval_every": 1e-300}, "eval_every"),
    ({"lr": 1e308}, "lr"),
    ({"eps": float("inf")}, "eps"),
    ({"checkpoint_every": 10 ** 30}, "checkpoint_every"),
    ({"peak_flops": 1e300}, "peak_flops"),
    ({"seed": 2 ** 70}, "seed"),
    ({"microbatch": 2 ** 40}, "microbatch"),
    ({"model": {"d_model": 10 ** 200}}, "d_model"),
    ({"model": {"n_layers": 10 ** 7}}, "n_layers"),
    ({"model": {"rope_theta": float("inf")}}, "rope_theta"),
])
def test_a_config_number_out_of_range_is_refused_before_training(values, field):
    from ladder.io import InputError
    from ladder.specs import get_ladder
    with pytest.raises((InputError, ValueError)) as e:
        cfg = train_config(values, where="cfg.json")
        if "model" in values:  # model overrides meet the rung's config when it is built
            from ladder.trainer.trainconfig import resolve_rung
            resolve_rung(get_ladder("tiny").rungs[0], cfg)
    assert field in str(e.value)


def test_run_config_out_of_range_exits_before_jax(tmp_path, capsys):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"eval_every": 1e-300}))
    with alarm():
        code = main(["run", "tiny", "--config", str(cfg), "--out", str(tmp_path / "t")])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 64 and "eval_every" in last and "cfg.json" in last
    assert not (tmp_path / "t").exists()
