"""Gradient accumulation: a step in microbatches equals the step on one big batch."""

import jax
import numpy as np
import pytest
from helpers import threshold_bias

from ladder.model.config import ModelConfig
from ladder.model.moe import (
    bias_target_from_stat,
    merge_bias_stat,
    step_tokens,
    top_logits,
)
from ladder.specs import LADDERS
from ladder.trainer.data import stdlib_corpus
from ladder.trainer.step import make_mesh, programs


def test_threshold_statistic_merges_exactly():
    logits = jax.random.normal(jax.random.key(0), (64, 4))
    k, E = 2, 4
    n = 64 * k // E                                   # 32: more than either half's 16 tokens
    cfg = ModelConfig(vocab_size=8, d_model=8, n_layers=1, n_heads=1, head_dim=8,
                      n_kv_heads_local=1, n_kv_heads_global=1, n_experts=E, top_k=k)
    parts = [top_logits(logits[i::4], n) for i in range(4)]       # 4 microbatches of 16
    assert np.isinf(np.asarray(parts[0])[:, 16:]).all()          # padded: fewer tokens than n
    merged = parts[0]
    for p in parts[1:]:
        merged = merge_bias_stat(cfg, merged, p)
    np.testing.assert_array_equal(merged, top_logits(logits, n))
    np.testing.assert_allclose(bias_target_from_stat(cfg, merged), threshold_bias(logits, k),
                               rtol=0, atol=1e-7)
    # one microbatch alone would give another target: the merge is what makes it the step's
    assert not np.allclose(threshold_bias(logits[::4], k), threshold_bias(logits, k), atol=1e-3)
    with step_tokens(64):                      # the statistic sized for the step, not the call
        from ladder.model.moe import threshold_n
        assert threshold_n(cfg, 16) == 32
    assert threshold_n(cfg, 16) == 8


@pytest.mark.slow   # two compiles of the step per rule: ~20 s on 2 busy cores
@pytest.mark.parametrize("bias_rule", ["threshold", "sign"])
def test_microbatched_step_matches_one_big_batch(bias_rule):
    rung = LADDERS["tiny"].rungs[0]
    # with drops on: capacity is counted per cell of one sequence (tiny's capacity_tokens), so
    # a microbatch of 2 sequences holds whole cells and drops the same assignments (issue 22
    # item 2; before, capacity was per call and the comparison needed a factor of E / k)
    cfg = rung.model.replace(bias_rule=bias_rule, bias_rate=0.01, capacity_factor=1.25)
    assert cfg.capacity_tokens == rung.seq_len and cfg.capacity_factor == 1.25
    batch, seq = 8, rung.seq_len
    corpus = stdlib_corpus()
    mesh = make_mesh(1, 1, cfg.n_experts, batch)
    runs, stats = {}, {}
    for micro in (1, 4):
        progs = programs(cfg, mesh, microbatches=micro)
        state = progs.init_state(0)
        losses, biases, drops = [], [], []
        for i in range(3):
            b = {**corpus.batch(0, i, batch, seq), "lr": np.float32(3e-3)}
            state, m = progs.train_step(state, jax.device_put(b))
            losses.append(float(m["train/loss"]))
            drops.append(float(m["moe/drop_frac"]))
            biases.append(np.asarray(state["router_bias"]))
        runs[micro] = losses, biases, drops, float(m["moe/load_max_over_mean"])
        stats[micro] = [float(m[k]) for k in ("moe/router_entropy", "moe/balance_loss")]
    (l1, b1, d1, lm1), (l4, b4, d4, lm4) = runs[1], runs[4]
    # the recipe's router statistics are the whole step's (from the summed load and the mean
    # router probabilities), not a mean of the microbatches' (issue 22 item 3)
    np.testing.assert_allclose(stats[4], stats[1], rtol=1e-6)
    np.testing.assert_allclose(l4, l1, rtol=2e-6)
    for a, b in zip(b1, b4):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    assert np.abs(b1[-1]).max() > 1e-3          # the bias really moved
    assert d4 == pytest.approx(d1, abs=1e-12) and max(d1) > 0     # the same drops, some
    assert lm4 == pytest.approx(lm1, rel=1e-6)   # from the step's summed load, not one part's


# ------------------------------------------------------------------ the capacity cell (issue 22)


def test_every_ladder_names_its_capacity_cell():
    """The cell is a recipe setting: the recipe's 65,536 tokens (16 sequences) on marin-535b,
    one sequence on tiny, 8 on cpu (of 8 tokens: the largest cell that divides every batch)."""
    assert {r.model.capacity_tokens for r in LADDERS["marin-535b"].all} == {65_536}
    assert {r.model.capacity_tokens for r in LADDERS["tiny"].all} == {64}
    assert {r.model.capacity_tokens for r in LADDERS["cpu"].all} == {64}
    assert all(r.batch * r.seq_len % 64 == 0 for r in LADDERS["cpu"].all)


def test_a_layout_without_whole_cells_is_refused_naming_what_would_do():
    from ladder.io import InputError
    from ladder.trainer.plan import microbatch_candidates
    from ladder.trainer.trainconfig import cell_fits, check_cell

    rung = LADDERS["marin-535b"].get("1.6B-A61M")
    # 8 devices: a device holds microbatch / 8 sequences of 4096 tokens; cells of 65,536 tokens
    # need 16 of them, so microbatch 128 is the smallest that holds whole cells
    assert [m for m in (32, 64, 128, 256) if cell_fits(rung, 8, m)] == [128, 256]
    with pytest.raises(InputError) as e:
        check_cell(rung, 8, 32, "microbatch")
    msg = str(e.value)
    assert e.value.field == "microbatch" and "\n" not in msg
    assert "65536" in msg and "smallest microbatch that does is 128" in msg, msg
    with pytest.raises(InputError, match="smallest eval_batch that does is 128") as e:
        check_cell(rung, 8, 8, "eval_batch")
    assert e.value.field == "eval_batch"
    check_cell(rung, 1, 16, "microbatch")                     # one device: 16 sequences do
    # the default eval batch holds whole cells: 16 sequences per device (1 where a cell is one)
    from ladder.trainer.trainconfig import TrainConfig, eval_batch_size
    assert eval_batch_size(TrainConfig(), 8, rung) == 128
    assert eval_batch_size(TrainConfig(), 8, LADDERS["tiny"].rungs[0]) == 8
    check_cell(rung, 8, eval_batch_size(TrainConfig(), 8, rung), "eval_batch")
    assert microbatch_candidates(rung, 8) == [1024, 512, 256, 128]
    # cells of one sequence (tiny): every layout that splits the sequences holds them whole
    tiny = LADDERS["tiny"].rungs[0].replace(batch=16)
    assert all(cell_fits(tiny, d, m) for d in (1, 2, 4, 8) for m in (8, 16))
    # cells of 3 sequences fit no 16-sequence batch on 2 devices
    odd = tiny.replace(model=tiny.model.replace(capacity_tokens=3 * 64))
    with pytest.raises(InputError, match="no microbatch of the 16-sequence batch does"):
        check_cell(odd, 2, 16, "microbatch")


def test_train_refuses_before_writing_anything(tmp_path):
    from ladder.io import InputError
    from ladder.trainer.train import train_rung
    from ladder.trainer.trainconfig import RunArgs, TrainConfig

    rung = LADDERS["tiny"].rungs[0]
    cfg = TrainConfig(microbatch=1, model={"capacity_tokens": 128},
                      run=RunArgs(peak_flops=1e11, progress=False))
    with pytest.raises(InputError, match="smallest microbatch that does is 2") as e:
        train_rung(rung, tmp_path / "run", cfg, max_steps=1)
    assert e.value.field == "microbatch"
    assert not (tmp_path / "run").exists()


def test_files_from_before_the_cell_still_load():
    """A ladder file without capacity_tokens gets cells of one sequence; a run's config.json
    from before it (no model.capacity_tokens) reads back with None: one cell per call, the rule
    it ran with; a bad value names the field."""
    from pathlib import Path

    import tomllib

    from ladder.specs import Rung, parse_ladder

    obj = tomllib.loads((Path(__file__).resolve().parent.parent / "ladder" / "ladders"
                         / "tiny.toml").read_text())
    obj["recipe"].pop("capacity_tokens")
    rung = parse_ladder(obj).rungs[0]
    assert rung.model.capacity_tokens == rung.seq_len == 64
    old = rung.to_dict()
    old["model"].pop("capacity_tokens")
    assert Rung.from_dict(old).model.capacity_tokens is None
    obj["recipe"]["capacity_tokens"] = 0
    with pytest.raises(ValueError, match="capacity_tokens"):
        parse_ladder(obj)
