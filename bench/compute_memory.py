"""XLA's own memory and compile-time figures for the model's compute path at a real rung shape.

    python bench/compute_memory.py [--rung marin-535b:1.6B-A61M] [--precision bf16 f32]
                                   [--remat none dots full] [--depths 8 24] [--json]

For each (precision, remat) this lowers and compiles the forward + backward of ``model.loss_fn``
for ONE sequence of the rung (abstract inputs: nothing is allocated) on the default backend and
prints ``compiled.memory_analysis()``: temporaries, arguments (params, bias, tokens) and outputs
(loss, stats, gradients). Then, to say what share of the temporaries is the MoE layer, the same
for one MoE layer alone (its fwd + bwd on the sequence's tokens, capacity dispatch as in
training), and the lowering + compile time of the whole model at two depths (scan over the
layer pattern: it should not grow with depth).

It also runs against a checkout without the ``precision``/``remat`` fields (the code before
they existed: ``PYTHONPATH=/path/to/old/checkout``), in which case it measures that code's one
(float32, no remat) configuration, which makes the before/after comparison one command each.
Figures are per compiled program on this backend (CPU here): on GPU, cuDNN's flash attention
does not keep the S x S scores that the XLA attention on CPU does.

Measured here (2-core shared CPU, jax 0.10.2, 1.6B-A61M, one 4096-token sequence, temporaries):
before this path (commit 648f2df: f32, unrolled, dense S x S attention, whole [S, V] logits)
19.05 GB. After: f32 remat none / dots / full 10.64 / 6.57 / 5.79 GB; bf16 16.29 / 6.42 /
5.76 GB (XLA:CPU has no bf16 dot and computes bf16 matmuls via float32 copies, so bf16 buys
nothing here; it is the GPU that halves activations). Of the 5.79 GB at remat=full, one MoE
layer's fwd+bwd (its dispatch buffers included) is 0.55 GB; ~2.7 GB are one scanned group's
routed-expert weight gradients (4 layers x 3 x [384, 384, 384] float32, parameter-sized, not
token-sized) and ~1.2 GB the LM head's chunk (its [768, V] gradient and [512, V] logits).
Lower + compile of the whole fwd+bwd, 8 -> 24 layers: 23 s -> 61 s before, 27 s -> 31 s after
(f32, remat none; timings on a loaded machine, so only their ratio means something).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from functools import partial

import jax
import jax.numpy as jnp

import ladder.model as M
from ladder.model.config import ModelConfig
from ladder.specs import resolve

GB = 1e9
FIELDS = {f.name for f in dataclasses.fields(ModelConfig)}


def _variant(cfg: ModelConfig, **kw) -> ModelConfig:
    return cfg.replace(**{k: v for k, v in kw.items() if k in FIELDS})


def _figures(compiled, seconds: float) -> dict:
    m = compiled.memory_analysis()
    return {"temp_gb": m.temp_size_in_bytes / GB, "argument_gb": m.argument_size_in_bytes / GB,
            "output_gb": m.output_size_in_bytes / GB, "compile_s": seconds}


def loss_grad_memory(cfg: ModelConfig, seq_len: int) -> dict:
    """Memory of jit(value_and_grad(loss_fn)) for one sequence."""
    params, bias = M.param_shapes(cfg)
    tokens = jax.ShapeDtypeStruct((1, seq_len), jnp.int32)
    f = jax.jit(jax.value_and_grad(partial(M.loss_fn, cfg), has_aux=True))
    t = time.perf_counter()
    compiled = f.lower(params, bias, tokens, tokens).compile()
    return _figures(compiled, time.perf_counter() - t)


def moe_layer_memory(cfg: ModelConfig, seq_len: int) -> dict:
    """Memory of one MoE layer's fwd + bwd on one sequence, in the model's compute dtype."""
    from ladder.model.moe import MoE

    dtype, cast = jnp.float32, None
    if "precision" in FIELDS:
        from ladder.model.transformer import cast_params, compute_dtype
        dtype = compute_dtype(cfg)
        cast = partial(cast_params, dtype=dtype)
    layer = MoE(cfg)
    x = jax.ShapeDtypeStruct((1, seq_len, cfg.d_model), dtype)
    bias = jax.ShapeDtypeStruct((cfg.n_experts,), jnp.float32)
    params = jax.eval_shape(lambda: jax.tree.map(
        lambda b: b.value, layer.init(jax.random.key(0), jnp.zeros(x.shape, dtype),
                                      jnp.zeros(bias.shape))["params"],
        is_leaf=lambda b: hasattr(b, "unbox")))

    def objective(p, x, b):
        if cast is not None:
            p = cast(p)
        y, aux = layer.apply({"params": p}, x, b)
        return jnp.sum(y.astype(jnp.float32)), aux

    f = jax.jit(jax.value_and_grad(objective, argnums=(0, 1), has_aux=True))
    t = time.perf_counter()
    compiled = f.lower(params, x, bias).compile()
    return _figures(compiled, time.perf_counter() - t)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rung", default="marin-535b:1.6B-A61M", help="LADDER:RUNG (default: "
                    "%(default)s)")
    ap.add_argument("--precision", nargs="+", default=["bf16", "f32"],
                    help="precisions to compile (default: %(default)s)")
    ap.add_argument("--remat", nargs="+", default=["none", "dots", "full"],
                    help="remat policies to compile (default: %(default)s)")
    ap.add_argument("--depths", nargs="*", type=int, default=[8, 24],
                    help="n_layers for the compile-time comparison (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object (default: off)")
    args = ap.parse_args(argv)

    _, (rung,) = resolve(args.rung)
    cfg, seq = rung.model, rung.seq_len
    combos = ([(p, r) for p in args.precision for r in args.remat] if "precision" in FIELDS
              else [("f32", "none")])
    out = {"rung": args.rung, "seq_len": seq, "backend": jax.default_backend(),
           "jax": jax.__version__, "loss_grad": {}, "moe_layer": {}, "compile_s_by_depth": {}}
    for precision, remat in combos:
        c = _variant(cfg, precision=precision, remat=remat)
        r = loss_grad_memory(c, seq)
        out["loss_grad"][f"{precision}/{remat}"] = r
        if not args.json:
            print(f"loss fwd+bwd {precision:4s} remat={remat:4s}: temp {r['temp_gb']:6.2f} GB, "
                  f"args {r['argument_gb']:.2f} GB, out {r['output_gb']:.2f} GB, "
                  f"compile {r['compile_s']:.1f} s", flush=True)
    for precision in sorted({p for p, _ in combos}):
        r = moe_layer_memory(_variant(cfg, precision=precision), seq)
        out["moe_layer"][precision] = r
        if not args.json:
            print(f"one MoE layer fwd+bwd {precision}: temp {r['temp_gb']:.2f} GB", flush=True)
    for depth in args.depths:
        c = _variant(cfg, n_layers=depth, precision=combos[0][0], remat=combos[0][1])
        r = loss_grad_memory(c, seq)
        out["compile_s_by_depth"][str(depth)] = r["compile_s"]
        if not args.json:
            print(f"n_layers={depth}: lower+compile {r['compile_s']:.1f} s "
                  f"(temp {r['temp_gb']:.2f} GB)", flush=True)
    if args.json:
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
