"""Attention without a dense segment mask (issue 37 item 2): documents reach cuDNN's flash
attention as packed segments, the XLA path builds masks block by block, and which one runs is
chosen and said.

What CPU can show: the packed layout derived from segment ids (property test), the XLA path's
compiled program (no [S, S] buffer, forward or backward), and the cuDNN path's program lowered
for CUDA (jax's cuDNN lowering runs without a GPU once its version probes are answered): the
fused call with the window, the segments and GQA, and no [S, S] tensor. Its numbers need a GPU.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import attend_reference
from hypothesis import given, settings
from hypothesis import strategies as st

from ladder.model import layers
from ladder.model.layers import attend, attention_choice, packed_segments

# shapes of every array in an HLO / StableHLO text: f32[1,2,3]{...} and tensor<1x2x3xf32>
_HLO_SHAPE = re.compile(r"\b(?:pred|s8|s32|u32|u8|bf16|f16|f32)\[([0-9,]+)\]")
_MLIR_SHAPE = re.compile(r"tensor<((?:[0-9]+x)+)(?:i1|i8|i32|ui32|ui8|bf16|f16|f32)>")


def _shapes(text: str) -> list[tuple[int, ...]]:
    hlo = [tuple(int(d) for d in m.split(",") if d) for m in _HLO_SHAPE.findall(text)]
    mlir = [tuple(int(d) for d in m.rstrip("x").split("x")) for m in _MLIR_SHAPE.findall(text)]
    return hlo + mlir


def _dense_square(text: str, S: int) -> list[tuple[int, ...]]:
    """Arrays with an S x S plane, or as many elements as one (a stack of blocks of it)."""
    return [s for s in _shapes(text)
            if int(np.prod(s)) >= S * S or any(a == b == S for a, b in zip(s, s[1:]))]


def _qkv(B, S, H, K, Hd, dtype=jnp.float32):
    q, k, v = (jax.random.normal(jax.random.key(i), (B, S, n, Hd)).astype(dtype)
               for i, n in enumerate((H, K, K)))
    seg = jnp.cumsum(jax.random.bernoulli(jax.random.key(9), 0.05, (B, S)).at[:, 0].set(False),
                     axis=1).astype(jnp.int32)
    return q, k, v, seg


# -------------------------------------------------------------------------- packed layout
@pytest.mark.heavy  # 80 s on 2 busy cores
@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=12), min_size=1, max_size=3),
       st.integers(1, 8))
def test_packed_segments_describe_the_runs(rows, max_segments):
    S = max(sum(r) for r in rows)
    seg = np.zeros((len(rows), S), np.int32)
    for b, runs in enumerate(rows):
        runs = list(runs) + ([S - sum(runs)] if sum(runs) < S else [])
        # ids may repeat out of order: a segment is a run of equal ids, not an id
        seg[b] = np.repeat(np.arange(len(runs)) % 2, runs)
    p = jax.tree.map(np.asarray, packed_segments(jnp.asarray(seg), max_segments))
    for b in range(len(rows)):
        starts = [0] + [s for s in range(1, S) if seg[b, s] != seg[b, s - 1]]
        lens = list(np.diff(starts + [S]))
        assert p.count[b] == len(starts)
        n = min(len(starts), max_segments)
        assert list(p.offsets[b, :n]) == starts[:n]
        assert (p.offsets[b, n:] == -1).all()
        assert list(p.lengths[b, :n]) == lens[:n]
        assert (p.lengths[b, n:] == -1).all()


# -------------------------------------------------------------------------- the choice
def test_choice_on_cpu_is_blocked_xla_and_said(caplog):
    c = attention_choice(jnp.bfloat16, 128, 4096, True, 512)
    assert c.implementation == "xla-blocked" and "cpu" in c.reason
    assert attention_choice(jnp.float32, 8, 64, True, 512).implementation == "xla"
    layers._SAID.discard(c)
    with caplog.at_level("INFO", logger=layers.__name__):
        layers.say_attention_choice(c)
        layers.say_attention_choice(c)                                 # once per process
    assert [r.getMessage() for r in caplog.records].count(
        f"attention: xla-blocked ({c.reason})") == 1
    assert c.to_dict() in layers.attention_traced()


def test_traced_choices_since_a_mark_include_repeats():
    """What a program traced after a mark, even a choice an earlier program made (env.json of
    the second rung trained in one process)."""
    q = jnp.zeros((1, 16, 2, 8), jnp.float32)
    layers.attend(q, q, q, None, None, 8)                              # blocked: 16 > 8
    mark = layers.attention_mark()
    assert layers.attention_traced(mark) == []
    layers.attend(q, q, q, None, None, 8)
    layers.attend(q, q, q, None, None, 32)                             # one block
    got = layers.attention_traced(mark)
    assert [c["implementation"] for c in got] == ["xla", "xla-blocked"]


@pytest.fixture
def fake_cuda(monkeypatch):
    """jax's cuDNN checks answered as on a Hopper GPU with cuDNN 9.10, so that the program can be
    lowered for CUDA here (nothing runs)."""
    from jax._src.cudnn import fused_attention_stablehlo as fa
    monkeypatch.setattr(fa, "check_cudnn_version", lambda: 91000)
    monkeypatch.setattr(fa, "check_compute_capability", lambda c: True)
    monkeypatch.setattr(fa, "is_cuda_compute_capability_equal", lambda c: False)
    monkeypatch.setattr(layers.jax, "default_backend", lambda: "gpu")


def test_choice_on_gpu(fake_cuda, monkeypatch):
    assert attention_choice(jnp.bfloat16, 128, 4096, True, 512).implementation == "cudnn-packed"
    assert attention_choice(jnp.bfloat16, 128, 4096, False, 512).implementation == "cudnn"
    c = attention_choice(jnp.float32, 128, 4096, True, 512)           # f32: no flash
    assert c.implementation == "xla-blocked" and "float32" in c.reason
    from jax._src.cudnn import fused_attention_stablehlo as fa
    monkeypatch.setattr(fa, "check_compute_capability", lambda c: False)   # an A100
    c = attention_choice(jnp.bfloat16, 128, 4096, True, 512)
    assert c.implementation == "xla-blocked" and "Hopper" in c.reason


# -------------------------------------------------------------------------- no dense mask
def _grad_program(S, window, chunk, dtype=jnp.float32, platform=None):
    q, k, v, seg = _qkv(1, S, 2, 1, 8, dtype)

    def loss(q, k, v):
        return jnp.sum(attend(q, k, v, window, seg, chunk).astype(jnp.float32) ** 2)

    traced = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, k, v)
    if platform is None:
        return traced.lower().compile().as_text()
    return traced.lower(lowering_platforms=(platform,)).as_text()


@pytest.mark.parametrize("window", [None, 16])
def test_xla_program_has_no_dense_segment_mask(window):
    S = 256
    # the detector finds the dense mask of attention in one block (so it can fail) ...
    assert _dense_square(_grad_program(S, window, None), S)
    # ... and none in the blocked path, forward and backward
    assert _dense_square(_grad_program(S, window, 32), S) == []


@pytest.mark.parametrize("window", [None, 16])
def test_cudnn_program_takes_segments_not_a_mask(fake_cuda, window):
    S = 256
    text = _grad_program(S, window, 32, jnp.bfloat16, "cuda")
    calls = re.findall(r"custom_call @(__cudnn\$fmha\w+)\(.*", text)
    assert {"__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"} <= set(calls)
    fused = [line for line in text.splitlines() if "__cudnn$fmha" in line]
    for line in fused:
        assert "PADDING_CAUSAL" in line                                 # segments as lengths
        assert f"max_seg_per_batch\\22: {layers.MAX_SEGMENTS}" in line
        want = 0 if window is None else window
        assert f"sliding_window_length\\22: {want}" in line
        # GQA: 2 query heads read 1 KV head inside the kernel (no repeat of K and V)
        assert "tensor<1x256x2x8xbf16>" in line and "tensor<1x256x1x8xbf16>" in line
    assert _dense_square(text, S) == []


@pytest.mark.heavy  # 4 s on 2 busy cores
def test_blocked_fallback_equals_reference_in_bf16_shapes():
    # the path a GPU takes for a batch with more than MAX_SEGMENTS documents in a row
    q, k, v, seg = _qkv(2, 64, 4, 2, 8)
    out = jax.jit(attend, static_argnums=(3, 5))(q, k, v, 8, seg, 16)
    np.testing.assert_allclose(out, attend_reference(q, k, v, 8, seg), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_decoder_program_has_no_dense_segment_mask():
    # the whole train step's gradient of a model with a local and a global layer, packed documents
    from functools import partial

    from ladder import model
    from ladder.specs import LADDERS
    S = 512
    cfg = LADDERS["tiny"].rungs[0].model.replace(attention_chunk=64)
    assert [cfg.is_global(i) for i in range(cfg.n_layers)] == [False, True]
    params, bias = model.init(cfg, 0)
    tokens = jax.random.randint(jax.random.key(0), (1, S), 0, cfg.vocab_size)
    seg = _qkv(1, S, 1, 1, 8)[3]

    def program(c):
        f = jax.grad(partial(model.loss_fn, c), has_aux=True)
        return jax.jit(lambda p: f(p, bias, tokens, tokens, segment_ids=seg)).lower(
            params).compile().as_text()

    assert _dense_square(program(cfg.replace(attention_chunk=S)), S)    # one block: the mask
    assert _dense_square(program(cfg), S) == []
