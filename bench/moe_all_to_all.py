"""Bytes of the expert-parallel MoE's all-to-all per layer per microbatch (issue 37 item 3): the
dense exchange (every padded slot) from XLA's compiled program, against the ragged exchange
(each expert's filled slots only).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/moe_all_to_all.py [RUNG]

Part 1 compiles one MoE layer's routed path (forward and backward) of RUNG (default the real
ladder's 1.6B-A61M) for 8 fake CPU devices, all on the "expert" axis, one microbatch of the
recipe's capacity cell (16 sequences, 65,536 tokens) per device, and sums the result bytes of
every all-to-all in the compiled HLO. XLA:CPU cannot compile the ragged all-to-all, so the
ragged bytes are those of the rows each layer actually fills: part 2 takes a
small layer's routing (balanced and skewed) and counts the rows its send sizes name
(``compact_slots``' filled rows: the sizes the GPU path hands to jax.lax.ragged_all_to_all).
Per device and per direction; the 1/ep of the buffer a device sends to itself is included in
both (XLA counts it in the dense op's result).
"""

from __future__ import annotations

import os
import re
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from ladder.model import moe  # noqa: E402
from ladder.specs import LADDERS  # noqa: E402

BYTES = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "pred": 1}
_OP = re.compile(r"=\s*(\(?[^=]*?\)?)\s+all-to-all(?:-start)?\(")
_SHAPE = re.compile(r"(bf16|f16|f32|s32|u32|pred)\[([0-9,]*)\]")


def all_to_all_elements(hlo: str) -> list[int]:
    """Result elements of each all-to-all instruction in compiled HLO text (XLA:CPU moves the
    bf16 buffer as f32, converted around the op, so elements x 2 bytes are the program's bf16
    bytes, what a GPU moves)."""
    return all_to_all_bytes(hlo, {t: 1 for t in BYTES})


def all_to_all_bytes(hlo: str, size: dict = BYTES) -> list[int]:
    """Result bytes of each all-to-all instruction in compiled HLO text."""
    out = []
    for line in hlo.splitlines():
        m = _OP.search(re.sub(r"/\*.*?\*/", "", line))          # drop /*index=5*/ comments
        if m:
            out.append(sum(size[t] * int(np.prod([int(d) for d in dims.split(",") if d]))
                           for t, dims in _SHAPE.findall(m.group(1))))
    return out


def mesh8():
    return jax.make_mesh((1, 8), ("data", "expert"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def dense_bytes(rung: str) -> dict:
    cfg = next(r for r in LADDERS["marin-535b"].all if r.name == rung).model
    mesh = mesh8()
    t = cfg.capacity_tokens                                           # one cell per device
    E, L, F, k = cfg.n_experts, cfg.latent_dim, cfg.expert_dim, cfg.top_k
    dt = jnp.bfloat16
    x = jax.ShapeDtypeStruct((8 * t, L), dt, sharding=NamedSharding(mesh, P(("data", "expert"))))
    ex = jax.ShapeDtypeStruct((8 * t, k), jnp.int32,
                              sharding=NamedSharding(mesh, P(("data", "expert"))))
    wt = jax.ShapeDtypeStruct((8 * t, k), dt, sharding=NamedSharding(mesh, P(("data", "expert"))))
    w = tuple(jax.ShapeDtypeStruct(s, dt, sharding=NamedSharding(mesh, P("expert")))
              for s in ((E, L, F), (E, L, F), (E, F, L)))

    def layer(x, e, wt, w):
        mixed, _ = moe.routed_expert_parallel(cfg, mesh, x, e, wt, 0, w,
                                              cfg.capacity_tokens // 16, moe.exchange_dense(8))
        return jnp.sum(mixed.astype(jnp.float32) ** 2)

    with jax.set_mesh(mesh):
        hlo = jax.jit(jax.grad(layer, argnums=(0, 3))).lower(x, ex, wt, w).compile().as_text()
    per = [2 * n for n in all_to_all_elements(hlo)]                    # bf16
    cap = moe.capacity(cfg, t)
    return {"rung": rung, "tokens_per_device": t, "experts": E, "top_k": k, "latent": L,
            "capacity": cap, "all_to_all_ops": len(per), "bytes_each": per,
            "bytes_total": sum(per), "compiled_cpu_bytes": sum(all_to_all_bytes(hlo)),
            "slots": E * cap, "assignments": t * k}


def ragged_fill(skew: float, cf: float = 1.15) -> dict:
    """Filled rows over padded rows of a small layer's ragged exchange (8 devices, E=32, k=4)."""
    cfg = LADDERS["tiny"].rungs[0].model.replace(n_experts=32, top_k=4, capacity_tokens=256,
                                                 capacity_factor=cf)
    mesh = mesh8()
    T, L = 8 * 256, cfg.latent_dim
    ks = jax.random.split(jax.random.key(0), 2)
    x = jax.random.normal(ks[0], (T, L))
    logits = jax.random.normal(ks[1], (T, 32)) + skew * jnp.linspace(1, -1, 32)
    expert = jax.lax.top_k(logits, cfg.top_k)[1].astype(jnp.int32)

    def fill(x, e):
        cell = moe.cell_tokens(cfg, x.shape[0])
        cap = moe.capacity(cfg, cell)
        s, filled = moe.compact_slots(moe.slots(e, 32, cap, None, x.shape[0] // cell), 32, cap,
                                      x.shape[0] // cell)
        return jnp.sum(filled)[None], jnp.mean(s.kept)[None]

    with jax.set_mesh(mesh):
        tok = P(("data", "expert"))
        filled, kept = jax.jit(jax.shard_map(fill, mesh=mesh, in_specs=(tok, tok),
                                             out_specs=(tok, tok)))(x, expert)
    cap = moe.capacity(cfg, 256)
    return {"skew": skew, "capacity_factor": cf, "filled_over_slots":
            float(np.mean(np.asarray(filled)) / (32 * cap)), "drop_frac":
            float(1 - np.mean(np.asarray(kept)))}


def main(argv):
    rung = argv[0] if argv else "1.6B-A61M"
    d = dense_bytes(rung)
    print(f"{rung}: dense all-to-all, compiled for 8 CPU devices: {d['all_to_all_ops']} ops "
          f"(forward 2, backward 2) of {[round(b / 1e6, 1) for b in d['bytes_each']]} MB each, "
          f"{d['bytes_total'] / 1e6:.1f} MB per layer per microbatch per device "
          f"(E x C x L = {d['experts']} x {d['capacity']} x {d['latent']} bf16; XLA:CPU moves "
          f"it as f32: {d['compiled_cpu_bytes'] / 1e6:.1f} MB)")
    bound = d["assignments"] / d["slots"]
    print(f"ragged: at most t x k = {d['assignments']} of {d['slots']} rows "
          f"({bound:.3f} of the dense bytes: {bound * d['bytes_total'] / 1e6:.1f} MB) with no "
          f"drops; (1 - drop) of that with drops")
    for skew in (0.0, 2.0):
        r = ragged_fill(skew)
        print(f"small layer, skew {skew}: ragged sends {r['filled_over_slots']:.3f} of the "
              f"dense rows (drop fraction {r['drop_frac']:.3f}, capacity factor "
              f"{r['capacity_factor']}: bound (1 - drop) / cf = "
              f"{(1 - r['drop_frac']) / r['capacity_factor']:.3f})")


if __name__ == "__main__":
    main(sys.argv[1:])
