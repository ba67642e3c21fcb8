"""bench/gpu_rung.py --smoke: every phase of the GPU benchmark runs on CPU with tiny shapes and
lands in its JSON file."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_bench():
    spec = importlib.util.spec_from_file_location("gpu_rung", ROOT / "bench" / "gpu_rung.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.slow   # two compiles, a checkpoint and a trace: ~3 min on 2 loaded cores
def test_gpu_rung_smoke(tmp_path):
    bench = load_bench()
    scratch = tmp_path / "scratch"
    assert bench.main(["--smoke", "--out", str(tmp_path), "--scratch", str(scratch),
                       "--budget-s", "3600"]) == 0
    doc = json.loads((tmp_path / "gpu_rung.json").read_text())
    phases = doc["phases"]
    assert {k: v["status"] for k, v in phases.items()} == dict.fromkeys(
        ("setup", "data", "train", "eval", "checkpoint", "profile"), "done"), phases
    setup, train = phases["setup"], phases["train"]
    assert setup["batch"] == 2 and setup["microbatch"] == 2 and doc["devices"] == 1
    assert phases["data"]["documents_in_first_batch"] > 2     # segment ids: several documents
    assert train["timed_steps"] == 2 and train["tokens_per_s"] > 0 and 0 < train["mfu"] < 1
    assert train["attention_ran"].startswith("xla") and train["xla_bytes_per_device"] > 0
    assert train["plan_bytes_per_device"] > 0 and "measured" in train["peak"]["source"]
    assert phases["eval"]["eval_batch"] == 1 and phases["eval"]["drop_frac"] >= 0
    assert phases["checkpoint"]["bytes"] > 0 and not list(scratch.iterdir())   # removed
    prof = phases["profile"]
    assert prof["events"] > 0 and set(prof["device_seconds"]) == set(bench.CATEGORIES)
    # the tiny model's attention, experts, LM head and optimizer all show up by name scope
    for part in ("attention", "expert_matmuls", "lm_head", "optimizer", "dispatch"):
        assert prof["device_seconds"][part] > 0, (part, prof)


def test_profile_categories_from_name_scopes():
    category = load_bench().category
    assert category("jit(train_step)/jvp(Decoder)/layer_0/attn/btd,dkx->btkx/dot_general") \
        == "attention"
    assert category("jit(train_step)/transpose(jvp(Decoder))/layer_1/moe/shared/td,ndf->tnf") \
        == "expert_matmuls"
    assert category("jit(train_step)/jvp(Decoder)/groups/block_0/moe/shard_map/ecl,elf->ecf"
                    "/dot_general") == "expert_matmuls"
    assert category("jit(train_step)/jvp(Decoder)/layer_0/moe/gather") == "dispatch"
    assert category("jit(train_step)/jvp()/while/body/closed_call/checkpoint/bsd,dv->bsv") \
        == "lm_head"
    assert category("jit(train_step)/optimizer/mul") == "optimizer"
    assert category("jit(train_step)/jvp(Decoder)/final_norm/mul") == "other"


def test_synthetic_shards_hold_documents():
    shard, eos = load_bench().synthetic_shards(1000, 50_000, 100, 0)
    assert eos == 999 and shard.dtype == np.int32 and shard.max() == eos
    ends = np.flatnonzero(shard == eos)
    assert 300 < len(ends) < 700                       # ~500 documents of mean length 100


def test_in_order_feed_reads_windows_with_segment_ids():
    from ladder.trainer.tokens import WindowSource

    bench = load_bench()
    shard, eos = bench.synthetic_shards(100, 16 * 9 + 1, 4, 1)
    feed = bench.InOrderFeed(WindowSource([shard], 16, eos), slice(0, 3))
    b0, b1 = feed.batch(0), feed.batch(1)
    assert b0["tokens"].shape == b0["segment_ids"].shape == (3, 16)
    np.testing.assert_array_equal(b0["targets"][0], shard[1:17])        # window 0
    np.testing.assert_array_equal(b1["tokens"][0], shard[48:64])         # window 3
    assert b0["segment_ids"].max() > 0                                   # documents end inside


def test_hlo_scopes_name_each_instruction_and_the_loops():
    text = """HloModule m
%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]{0}) parameter(0)
  ROOT %t = (s32[], f32[4]{0}) tuple(%p), metadata={op_name="jit(f)/while/body"}
}
ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %m = f32[4]{0} multiply(%x, %x), metadata={op_name="jit(f)/optimizer/mul"}
  %w = (s32[], f32[4]{0}) while(%m), condition=%c, body=%body
  ROOT %r = f32[4]{0} get-tuple-element(%w), index=1
}
"""
    scopes, containers = load_bench().hlo_scopes(text)
    assert scopes["m"] == "jit(f)/optimizer/mul" and containers == {"w"}
