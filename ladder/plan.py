"""`ladder plan`: per-device memory and time per step of a rung on a (data x expert) device mesh,
without training and without allocating the model; with ``--compile``, XLA's own figures.

Parameter shapes come from ``jax.eval_shape`` of the model's init (``model.param_shapes``), so
even the 535B hero is planned in seconds. FLOPs come from the one counter (ladder/counting.py).

Mesh (as the trainer's, ladder/step.py): N devices = data x expert. The batch (of one
microbatch) is split over ALL N devices; routed-expert weights are split over "expert" (and
FSDP-style over "data"); every other weight FSDP-style over all N devices. By default the expert
axis is the largest divisor of N that also divides the number of experts.

Memory per device (bytes), the estimate (what the trainer as it is here keeps):
- parameters, gradients and the optimizer's moments: float32, each 1/N of the model (FSDP; the
  routed experts 1/(data x expert)); moments: AdamW two per weight, marin two per Adam/AdamH
  weight and one per MuonH weight (ladder/optim.py); plus a float32 gradient accumulator when the
  step has more than
  one microbatch; plus the weights GSPMD gathers for use, of which the embedding and LM head
  (2 V D float32, whole) dominate;
- the threshold rule's merged statistic [layers, E, n] float32 (n = tokens per step x k / E),
  split over "expert", twice (running value and the merge);
- activations of one microbatch's tokens on the device (no rematerialisation), float32 (what
  the step compiles to on CPU, where "auto" precision is f32). Per token and layer (elements):
  4 D (residual inputs and their normed copies) + 4 q_dim + 3 kv_dim (q, k, v before and after
  QK-norm/RoPE, attention output) + 2 E (router logits and probabilities) + 3 L (latent
  before/after norm, combined output) + 2 k L (each assignment's token and output) + 2 cf k
  (2 L + 3 F) (expert slots, on the sender and again on the expert's device after the
  all-to-all: input, gate, up, hidden, output) + 3 N F_shared; with the recipe's pieces on
  (issue 12), + 2 (2 r + 3 D) (GatedNorm of rank r after both norms) + 2 kv_dim + 4 D (the short
  convolutions at K, the attention output and the MoE output) + 2 q_dim (XSA) + q_dim + H (the
  head gate). No attention scores: attention
  runs in query blocks whose scores are recomputed in the backward pass (model/layers.py), so
  none is kept. Per token once: 2 D (embedding output, final norm; + their GatedNorms) +
  3 V loss_chunk / S (the
  LM head and cross-entropy run over chunks of loss_chunk positions: one chunk's float32
  logits, exponentials and gradient exist at a time).
  Measured against XLA's memory analysis of the compiled step (``--compile``) it is a planning
  estimate, expected within ~30% on the real rungs; it does not know about bf16 or remat, which
  shrink the activations.

Time per step = training FLOPs per step (LM head included) / (N x peak FLOP/s x MFU).
The default peak is one GB200 GPU in bf16 without sparsity: 2.5e15 FLOP/s (NVIDIA's GB200 NVL72
datasheet lists 5 PFLOPS FP16/BF16 per Blackwell GPU *with* 2:4 sparsity; dense is half). The
default MFU 0.4 is an assumption, not a measurement.
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import asdict, dataclass
from functools import lru_cache

from ladder.accelerators import (  # noqa: F401  (ACCELERATORS re-exported)
    ACCELERATORS, GB200_BF16_DENSE_FLOPS, accelerator_peak)
from ladder.specs import Rung

DEFAULT_MFU = 0.4
BYTES_F32 = 4
BYTES_ACT = 4  # the trainer computes in float32


@dataclass(frozen=True)
class Mesh:
    devices: int
    data: int
    expert: int

    def __post_init__(self):
        if self.devices < 1:
            raise ValueError(f"devices: must be >= 1, got {self.devices}")
        if self.data * self.expert != self.devices:
            raise ValueError(f"expert_parallel: {self.expert} does not divide "
                             f"devices={self.devices}")


def make_mesh(devices: int, n_experts: int, expert_parallel: int | None = None) -> Mesh:
    if devices < 1:
        raise ValueError(f"devices: must be >= 1, got {devices}")
    if expert_parallel is None:
        expert_parallel = max(e for e in range(1, devices + 1)
                              if devices % e == 0 and n_experts % e == 0)
    if expert_parallel < 1 or devices % expert_parallel:
        raise ValueError(f"expert_parallel: {expert_parallel} does not divide devices={devices}")
    if n_experts % expert_parallel:
        raise ValueError(f"expert_parallel: {expert_parallel} does not divide "
                         f"n_experts={n_experts}")
    return Mesh(devices=devices, data=devices // expert_parallel, expert=expert_parallel)


@dataclass(frozen=True)
class RungPlan:
    """One rung on one mesh. Bytes are per device."""

    ladder: str
    name: str
    devices: int
    data_parallel: int
    expert_parallel: int
    params: int                      # the rung's param convention (as `ladder list`)
    active_params: int
    params_exact: int                # from the abstract parameter tree (+ router bias)
    steps: int
    batch: int
    microbatch: int                  # sequences per microbatch
    seq_len: int
    tokens_per_step: int
    tokens_per_device: int           # per microbatch, on the most loaded device
    flops_per_step: float            # training FLOPs, LM head included
    flops_per_step_no_lm_head: float
    param_bytes: float
    grad_bytes: float                # gradients (+ the accumulator with several microbatches)
    optimizer_bytes: float
    gathered_bytes: float            # weights gathered whole for use (embedding, LM head)
    balance_bytes: float             # the balancing rule's statistic, merged (threshold, quantile)
    activation_bytes: float
    activation_bytes_per_sequence: float
    peak_flops: float
    mfu: float

    @property
    def total_bytes(self) -> float:
        return (self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.gathered_bytes
                + self.balance_bytes + self.activation_bytes)

    @property
    def step_time_s(self) -> float:
        return self.flops_per_step / (self.devices * self.peak_flops * self.mfu)

    @property
    def run_time_s(self) -> float:
        return self.steps * self.step_time_s

    def to_dict(self) -> dict:
        return {**asdict(self), "total_bytes": self.total_bytes, "step_time_s": self.step_time_s,
                "run_time_s": self.run_time_s, "run_time_days": self.run_time_s / 86400}


def activation_elements_per_token(cfg, seq_len: int) -> float:
    """Saved activations per token for the whole model (elements, float32) at ``seq_len``.
    See the module docstring for the terms."""
    cap_slots = cfg.capacity_factor * cfg.top_k          # expert slots per token
    d = cfg.d_model
    # the recipe's pieces (issue 12), when on: GatedNorm after a norm keeps its rank-r down
    # projection and activation and three [D] products; a short conv its input and output
    gated = 2 * cfg.gated_rank + 3 * d if cfg.gated_norm_rank else 0
    total = 0.0
    for layer in range(cfg.n_layers):
        kv_dim = cfg.n_kv_heads(layer) * cfg.head_dim
        total += (4 * d + 4 * cfg.q_dim + 3 * kv_dim
                  + 2 * cfg.n_experts + 3 * cfg.latent_dim + 2 * cfg.top_k * cfg.latent_dim
                  + 2 * cap_slots * (2 * cfg.latent_dim + 3 * cfg.expert_dim)
                  + 3 * cfg.n_shared * cfg.shared_dim
                  + 2 * gated                                         # attention and MoE norms
                  + (2 * kv_dim + 4 * d if cfg.conv_kernel else 0)    # K, attention out, MoE out
                  + (2 * cfg.q_dim if cfg.xsa else 0)                 # y and its projection on v
                  + (cfg.q_dim + cfg.n_heads if cfg.head_gate else 0))
    once = 2 * d + (gated * (2 if cfg.embed_norm else 1))   # embedding out, final norm (+gates)
    return total + once + 3 * cfg.vocab_size * min(cfg.loss_chunk, seq_len) / seq_len


@lru_cache(maxsize=64)
def exact_param_count(cfg) -> tuple[int, int]:
    """(trained parameters, router-bias entries) of ``cfg``'s abstract parameter tree. Cached per
    model: the microbatch search plans one model up to ~17 times, and each abstract trace of a
    large model's init costs seconds on CPU (27.7B: 17 traces, 14.7 s before this cache)."""
    import jax  # noqa: F401  (plan is the one `ladder` command that needs JAX)
    from flax.traverse_util import flatten_dict

    from model.transformer import param_shapes

    shapes, bias = param_shapes(cfg)
    return int(sum(leaf.size for leaf in flatten_dict(shapes).values())), int(bias.size)


@lru_cache(maxsize=64)
def optimizer_state_count(cfg, settings) -> int:
    """Float32 entries of the optimizer state of ``cfg`` under ``settings`` (its moments; the
    step counter aside), from abstract shapes: AdamW 2 x the weights, marin 2 x the Adam/AdamH
    weights + 1 x the MuonH weights."""
    import jax

    from ladder.optim import make_optimizer
    from model.transformer import param_shapes

    shapes, _ = param_shapes(cfg)
    state = jax.eval_shape(make_optimizer(settings).init, shapes)
    return int(sum(x.size for x in jax.tree.leaves(state) if x.ndim))


def plan_rung(rung: Rung, devices: int = 1, *, expert_parallel: int | None = None,
              microbatch: int | None = None, peak_flops: float = GB200_BF16_DENSE_FLOPS,
              mfu: float = DEFAULT_MFU) -> RungPlan:
    """Memory and time of ``rung`` on ``devices`` devices, the batch in microbatches of
    ``microbatch`` sequences (default: whole). Raises ValueError naming the field."""
    if not peak_flops > 0:
        raise ValueError(f"peak_flops: must be > 0, got {peak_flops!r}")
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu: must be in (0, 1], got {mfu!r}")
    mb = rung.batch if microbatch is None else microbatch
    if mb < 1 or rung.batch % mb:
        raise ValueError(f"microbatch: must divide the batch ({rung.batch}), got {mb}")
    cfg = rung.model
    mesh = make_mesh(devices, cfg.n_experts, expert_parallel)

    from model.balance import N_BINS

    n_trained, n_bias = exact_param_count(cfg)
    n_exact = n_trained + n_bias
    trained = n_trained / mesh.devices                  # FSDP: every weight split N ways
    counted = rung.params
    flops = rung.flops
    seqs_per_device = math.ceil(mb / mesh.devices)      # the largest shard when uneven
    act_per_seq = activation_elements_per_token(cfg, rung.seq_len) * rung.seq_len * BYTES_ACT
    n_top = max(1, rung.tokens_per_step * cfg.top_k // cfg.n_experts)
    # the balancing rule's statistic and its merged copy, split over "expert": the threshold
    # rule's top-n logits per expert, the quantile rule's margin histogram (model/balance.py)
    per_expert = {"threshold": n_top, "quantile": N_BINS}.get(cfg.bias_rule, 0)
    balance = 2 * cfg.n_layers * cfg.n_experts * per_expert * BYTES_F32 / mesh.expert
    accumulator = trained * BYTES_F32 if mb < rung.batch else 0.0
    return RungPlan(
        ladder=rung.ladder, name=rung.name, devices=mesh.devices, data_parallel=mesh.data,
        expert_parallel=mesh.expert, params=counted.total, active_params=counted.active,
        params_exact=int(n_exact), steps=rung.steps, batch=rung.batch, microbatch=mb,
        seq_len=rung.seq_len, tokens_per_step=rung.tokens_per_step,
        tokens_per_device=seqs_per_device * rung.seq_len,
        flops_per_step=flops.training(rung.tokens_per_step, lm_head=True),
        flops_per_step_no_lm_head=flops.training(rung.tokens_per_step, lm_head=False),
        param_bytes=(trained + n_bias) * BYTES_F32,   # + the replicated router bias
        grad_bytes=trained * BYTES_F32 + accumulator,    # the bias has no gradient
        optimizer_bytes=optimizer_state_count(cfg, rung.optimizer_settings) / mesh.devices
        * BYTES_F32,                                      # nor optimizer moments
        gathered_bytes=2 * cfg.vocab_size * cfg.d_model * BYTES_F32,
        balance_bytes=balance,
        activation_bytes=seqs_per_device * act_per_seq,
        activation_bytes_per_sequence=act_per_seq,
        peak_flops=peak_flops, mfu=mfu,
    )


def largest_fitting_microbatch(rung: Rung, devices: int, memory_per_device: float, **kw
                               ) -> int | None:
    """The largest microbatch whose *estimated* memory fits (None when none does)."""
    for m in microbatch_candidates(rung, devices):
        if plan_rung(rung, devices, microbatch=m, **kw).total_bytes <= memory_per_device:
            return m
    return None


# ------------------------------------------------------------------------------ --compile
COLLECTIVES = ("all-to-all", "all-reduce", "all-gather", "reduce-scatter", "collective-permute")
DEFAULT_MEMORY_PER_DEVICE = 80e9   # bytes: one H100/H200-class 80 GB HBM budget
_COLLECTIVE_RE = re.compile(r"\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")


def count_collectives(hlo_text: str) -> dict:
    """{kind: number of instructions} of each collective in compiled HLO text (an async pair
    ``X-start``/``X-done`` counts once, by its start)."""
    counts = dict.fromkeys(COLLECTIVES, 0)
    for m in _COLLECTIVE_RE.finditer(hlo_text):
        counts[m.group(1)] += 1
    return counts


def ensure_host_devices(n: int) -> bool:
    """Make JAX start with ``n`` fake CPU devices when it has not been imported yet (sets
    XLA_FLAGS and JAX_PLATFORMS=cpu). Returns whether ``n`` devices are (or will be) visible;
    False means JAX is already running with fewer: the caller must re-run in a fresh process."""
    if "jax" in sys.modules:
        import jax
        return jax.device_count() >= n
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                   os.environ.get("XLA_FLAGS", ""))
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    os.environ["JAX_PLATFORMS"] = "cpu"
    return True


@dataclass(frozen=True)
class CompiledStep:
    """XLA's own figures for the real train step of one rung on one mesh (per device)."""

    devices: int
    mesh: dict                  # {"data": d, "expert": e}
    microbatch: int             # sequences per microbatch
    microbatches: int
    bytes_per_device: float     # arguments + temporaries + outputs not aliased to arguments
    argument_bytes: float
    temp_bytes: float
    output_bytes: float
    alias_bytes: float
    # XLA's cost analysis counts a while loop's body once. The microbatch loop is multiplied
    # back; loops inside it (the layer scan, the loss chunks, blocked attention, Newton-Schulz)
    # are not, so on scanned models this is not the step's FLOPs (flops-v1 is): it compares
    # meshes of the same program (x devices vs 1 device: is work replicated?)
    flops_per_device: float     # XLA's cost analysis of the per-device program, x microbatches
    xla_flops: float            # XLA's own figure (the microbatch loop's body counted once)
    collectives: dict           # {kind: instruction count} from the compiled HLO
    compile_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def compile_step(rung: Rung, devices: int, *, microbatch: int | None = None,
                 expert_parallel: int | None = None) -> CompiledStep:
    """Lower and compile ``rung``'s real train step (ladder.train) for a ``devices`` mesh on
    abstract inputs (nothing is allocated) and read XLA's memory and cost analyses."""
    import time

    import jax
    import jax.numpy as jnp

    from ladder.step import batch_sharding, make_mesh, programs
    from ladder.trainconfig import TrainConfig, microbatch_size

    mb = microbatch_size(rung, TrainConfig(microbatch=microbatch))
    mesh = make_mesh(devices, expert_parallel, rung.model.n_experts, mb)
    progs = programs(rung.model, mesh, rung.optimizer_settings, rung.batch // mb)
    split = batch_sharding(mesh)
    toks = jax.ShapeDtypeStruct((rung.batch, rung.seq_len), jnp.int32, sharding=split)
    batch = {"tokens": toks, "targets": toks, "lr": jax.ShapeDtypeStruct((), jnp.float32)}
    t = time.perf_counter()
    compiled = progs.train_step.lower(progs.abstract_state(), batch).compile()
    compile_s = time.perf_counter() - t
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    arg, tmp = float(mem.argument_size_in_bytes), float(mem.temp_size_in_bytes)
    outb, alias = float(mem.output_size_in_bytes), float(mem.alias_size_in_bytes)
    return CompiledStep(
        devices=devices, mesh={k: int(v) for k, v in mesh.shape.items()}, microbatch=mb,
        microbatches=rung.batch // mb, bytes_per_device=arg + tmp + outb - alias,
        argument_bytes=arg, temp_bytes=tmp, output_bytes=outb, alias_bytes=alias,
        # HLO cost analysis counts a while loop's body once, so the step's FLOPs are its figure
        # x the microbatches. The optimizer update outside the loop is then counted M times too:
        # ~10 FLOPs per parameter on the device, against 6 x active params x the microbatch's
        # tokens for its forward and backward, so < 0.1% on the real rungs (estimated)
        flops_per_device=float(cost.get("flops", float("nan"))) * (rung.batch // mb),
        xla_flops=float(cost.get("flops", float("nan"))),
        collectives=count_collectives(compiled.as_text()), compile_s=compile_s)


def microbatch_candidates(rung: Rung, devices: int) -> list[int]:
    """Microbatch sizes the step accepts on ``devices``: divisors of the batch that the device
    count divides, largest first."""
    return [m for m in range(rung.batch, 0, -1) if rung.batch % m == 0 and m % devices == 0]


def fit_microbatch(rung: Rung, devices: int, memory_per_device: float = DEFAULT_MEMORY_PER_DEVICE,
                   *, expert_parallel: int | None = None, start: int | None = None
                   ) -> tuple[CompiledStep, list[dict]]:
    """The largest microbatch whose compiled step fits ``memory_per_device``: compiles from
    ``start`` (default: the estimate's largest fitting one) downwards until one fits, and
    upwards while the next larger one still fits. Returns (the chosen step, every attempt as
    {microbatch, bytes, fits}); when none fits, the smallest candidate's step, with fits False."""
    cands = microbatch_candidates(rung, devices)
    if not cands:
        raise ValueError(f"devices: {devices} divides no microbatch of the batch ({rung.batch})")
    if start is None:
        start = largest_fitting_microbatch(rung, devices, memory_per_device,
                                           expert_parallel=expert_parallel) or cands[-1]
    i = cands.index(start) if start in cands else 0
    tried: dict[int, CompiledStep] = {}

    def attempt(j):
        if cands[j] not in tried:
            tried[cands[j]] = compile_step(rung, devices, microbatch=cands[j],
                                           expert_parallel=expert_parallel)
        return tried[cands[j]].bytes_per_device <= memory_per_device

    if attempt(i):
        while i > 0 and attempt(i - 1):
            i -= 1
    else:
        while i + 1 < len(cands) and not attempt(i + 1):
            i += 1
        i = min(i + 1, len(cands) - 1)
    chosen = tried[cands[i]]
    log = [{"microbatch": m, "bytes_per_device": s.bytes_per_device,
            "fits": s.bytes_per_device <= memory_per_device} for m, s in sorted(tried.items())]
    return chosen, log
