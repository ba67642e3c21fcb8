"""`ladder plan`: per-device memory and time per step of a rung on a (data x expert) device mesh,
without training and without allocating the model; with ``--compile``, XLA's own figures.

Parameter shapes come from ``jax.eval_shape`` of the model's init (``model.param_shapes``), so
even the 535B hero is planned in seconds; FLOPs from the one counter (ladder/counting.py). The
mesh is the trainer's (step.py :func:`~ladder.trainer.step.make_mesh`).

Memory per device (bytes), an estimate of what the trainer keeps:
- float32 parameters, gradients and optimizer moments, each 1/N of the model (AdamW: two
  moments per weight; marin: two per Adam/AdamH weight, one per MuonH weight, optim.py); a
  float32 gradient accumulator with several microbatches; the weights GSPMD gathers whole for
  use, of which the embedding and LM head (2 V D float32) dominate;
- the balancing rule's merged statistic [layers, E, n] float32, split over "expert", twice
  (running value and the merge);
- one microbatch's activations at the rung's precision and remat
  (:func:`activation_bytes_per_token`; "auto" precision is planned as bf16, what an
  accelerator runs).
Expected within ~30% of XLA's memory analysis of the compiled step (``--compile``) on the real
rungs in f32; XLA:CPU computes bf16 matmuls through float32 copies (bench/compute_memory.py), so
a bf16 step compiled on CPU needs more than the estimate.

Time per step = training FLOPs per step (LM head included) / (N x peak FLOP/s x MFU). The default
peak is one GB200 GPU in dense bf16: 2.5e15 FLOP/s (NVIDIA's GB200 NVL72 datasheet lists 5 PFLOPS
FP16/BF16 per Blackwell GPU *with* 2:4 sparsity). The default MFU 0.4 is an assumption.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, fields
from functools import lru_cache

from ladder.accelerators import GB200_BF16_DENSE_FLOPS, accelerator_peak  # noqa: F401  (accelerator_peak re-exported)
from ladder.specs import Rung

DEFAULT_MFU = 0.4
BYTES_F32 = 4


@dataclass(frozen=True)
class Mesh:
    devices: int
    data: int
    expert: int


def make_mesh(devices: int, n_experts: int, expert_parallel: int | None = None) -> Mesh:
    """The plan's mesh (the trainer's axes, step.make_mesh); ValueError naming the field when
    the axes do not divide."""
    from ladder.trainer.step import default_expert_axis

    if devices < 1:
        raise ValueError(f"devices: must be >= 1, got {devices}")
    if expert_parallel is None:
        expert_parallel = default_expert_axis(devices, n_experts)
    if expert_parallel < 1 or devices % expert_parallel:
        raise ValueError(f"expert_parallel: {expert_parallel} does not divide devices={devices}")
    if n_experts % expert_parallel:
        raise ValueError(f"expert_parallel: {expert_parallel} does not divide "
                         f"n_experts={n_experts}")
    return Mesh(devices=devices, data=devices // expert_parallel, expert=expert_parallel)


@dataclass(frozen=True)
class RungPlan:
    """One rung on one mesh (:func:`plan_rung`). Bytes are per device."""

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
    precision: str                   # compute precision the plan describes (bf16 | f32)
    remat: str                       # rematerialisation the plan describes (none | dots | full)
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


def _gated(cfg) -> float:
    """GatedNorm of rank r after a norm (issue 12): its rank-r down projection and activation
    and three [D] products."""
    return 2 * cfg.gated_rank + 3 * cfg.d_model if cfg.gated_norm_rank else 0


def _layer_elements(cfg, layer: int) -> float:
    """Activations one layer keeps per token without remat (elements); no attention scores
    (query blocks recompute them in the backward pass, ladder/model/layers.py)."""
    cap_slots = cfg.capacity_factor * cfg.top_k          # expert slots per token
    d = cfg.d_model
    kv_dim = cfg.n_kv_heads(layer) * cfg.head_dim
    return (4 * d                           # residual inputs and their normed copies
            + 4 * cfg.q_dim + 3 * kv_dim    # q, k, v before/after QK-norm and RoPE; attn out
            + 2 * cfg.n_experts             # router logits and probabilities
            + 3 * cfg.latent_dim            # latent before/after norm, combined output
            + 2 * cfg.top_k * cfg.latent_dim    # each assignment's token and output
            # expert slots (input, gate, up, hidden, output), on the sender and again on the
            # expert's device after the all-to-all
            + 2 * cap_slots * (2 * cfg.latent_dim + 3 * cfg.expert_dim)
            + 3 * cfg.n_shared * cfg.shared_dim
            + 2 * _gated(cfg)                                   # attention and MoE norms
            + (2 * kv_dim + 4 * d if cfg.conv_kernel else 0)    # K, attention out, MoE out
            + (2 * cfg.q_dim if cfg.xsa else 0)                 # y and its projection on v
            + (cfg.q_dim + cfg.n_heads if cfg.head_gate else 0))


def _layer_dot_outputs(cfg, layer: int) -> float:
    """What remat "dots" (jax's dots_with_no_batch_dims_saveable) keeps of one layer per token:
    its input and its weight matmuls' outputs; the routed experts' matmuls (the expert axis is
    a batch dimension) are recomputed."""
    kv_dim = cfg.n_kv_heads(layer) * cfg.head_dim
    return (cfg.d_model + cfg.q_dim + 2 * kv_dim + cfg.d_model + cfg.n_experts
            + 2 * cfg.latent_dim + 3 * cfg.n_shared * cfg.shared_dim)


def plan_precision(cfg) -> str:
    """The precision a plan describes: "auto" is what an accelerator runs (bf16), since a plan
    lays a rung out for one (model.config.resolve_precision)."""
    from ladder.model.config import resolve_precision

    return resolve_precision(cfg.precision, "gpu")


def activation_bytes_per_token(cfg, seq_len: int) -> float:
    """Bytes of activations one token keeps for the backward pass under ``cfg``'s precision and
    remat. In bf16 the activations are 2 bytes; the router's logits and probabilities and the
    LM head's chunk stay float32. Remat "full" keeps each layer's input, "dots" its weight
    matmuls' outputs, and one layer is recomputed at a time; whatever the remat, the layer
    whose backward runs holds its activations' cotangents too."""
    act = 2 if plan_precision(cfg) == "bf16" else BYTES_F32
    layers = [_layer_elements(cfg, i) for i in range(cfg.n_layers)]
    f32_router = 2 * cfg.n_experts * (BYTES_F32 - act)          # per layer, beyond act bytes
    d = cfg.d_model
    # per token once: the embedding output and final norm (+ their GatedNorms); the LM head and
    # cross-entropy run over chunks of loss_chunk positions: one chunk's float32 logits,
    # exponentials and gradient exist at a time
    once = (2 * d + _gated(cfg) * (2 if cfg.embed_norm else 1)) * act \
        + 3 * cfg.vocab_size * min(cfg.loss_chunk, seq_len) / seq_len * BYTES_F32
    # the cotangents: one layer's worth more at the peak (XLA's buffer assignment of
    # 1.6B-A61M's step at remat full holds the expert buffers [E, C, L] and their gradients at
    # once, measured here)
    one_layer = max(layers) * act + f32_router
    if cfg.remat == "none":
        return sum(layers) * act + cfg.n_layers * f32_router + once + one_layer
    if cfg.remat == "full":
        kept = cfg.n_layers * d * act
    else:
        kept = sum(_layer_dot_outputs(cfg, i) for i in range(cfg.n_layers)) * act \
            + cfg.n_layers * cfg.n_experts * (BYTES_F32 - act)
    return kept + 2 * one_layer + once   # one layer recomputed, and its cotangents


@lru_cache(maxsize=64)
def exact_param_count(cfg) -> tuple[int, int]:
    """(trained parameters, router-bias entries) of ``cfg``'s abstract parameter tree. Cached:
    the microbatch search plans one model up to ~17 times, each trace seconds on CPU."""
    import jax  # noqa: F401  (plan is the one `ladder` command that needs JAX)
    from flax.traverse_util import flatten_dict

    from ladder.model.transformer import param_shapes

    shapes, bias = param_shapes(cfg)
    return int(sum(leaf.size for leaf in flatten_dict(shapes).values())), int(bias.size)


@lru_cache(maxsize=64)
def optimizer_state_count(cfg, settings) -> int:
    """Float32 entries of the optimizer state of ``cfg`` under ``settings`` (its moments; the
    step counter aside), from abstract shapes: AdamW 2 x the weights, marin 2 x the Adam/AdamH
    weights + 1 x the MuonH weights."""
    import jax

    from ladder.model.transformer import param_shapes
    from ladder.trainer.optim import make_optimizer

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

    from ladder.model.moe import balancing_rule

    n_trained, n_bias = exact_param_count(cfg)
    trained = n_trained / mesh.devices                  # FSDP: every weight split N ways
    counted, flops = rung.params, rung.flops
    seqs_per_device = math.ceil(mb / mesh.devices)      # the largest shard when uneven
    act_per_seq = activation_bytes_per_token(cfg, rung.seq_len) * rung.seq_len
    # the balancing rule's statistic and its merged copy, split over "expert": the threshold
    # rule's top-n logits per expert, the quantile rule's margin histogram (ladder/model/moe.py)
    per_expert = balancing_rule(cfg).stat_width(cfg, rung.tokens_per_step)
    balance = 2 * cfg.n_layers * cfg.n_experts * per_expert * BYTES_F32 / mesh.expert
    accumulator = trained * BYTES_F32 if mb < rung.batch else 0.0
    return RungPlan(
        ladder=rung.ladder, name=rung.name, devices=mesh.devices, data_parallel=mesh.data,
        expert_parallel=mesh.expert, params=counted.total, active_params=counted.active,
        params_exact=n_trained + n_bias, steps=rung.steps, batch=rung.batch, microbatch=mb,
        precision=plan_precision(cfg), remat=cfg.remat, seq_len=rung.seq_len,
        tokens_per_step=rung.tokens_per_step,
        tokens_per_device=seqs_per_device * rung.seq_len,
        flops_per_step=flops.training(rung.tokens_per_step, lm_head=True),
        flops_per_step_no_lm_head=flops.training(rung.tokens_per_step, lm_head=False),
        param_bytes=(trained + n_bias) * BYTES_F32,   # + the replicated router bias
        grad_bytes=trained * BYTES_F32 + accumulator,    # the bias has no gradient
        optimizer_bytes=optimizer_state_count(cfg, rung.optimizer_settings) / mesh.devices
        * BYTES_F32,                                      # nor optimizer moments
        gathered_bytes=2 * cfg.vocab_size * cfg.d_model * BYTES_F32, balance_bytes=balance,
        activation_bytes=seqs_per_device * act_per_seq,
        activation_bytes_per_sequence=act_per_seq, peak_flops=peak_flops, mfu=mfu)


# ------------------------------------------------------------------------------ --compile
COLLECTIVES = ("all-to-all", "all-reduce", "all-gather", "reduce-scatter", "collective-permute")
_COLLECTIVE_RE = re.compile(r"\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")


def count_collectives(hlo_text: str) -> dict:
    """{kind: number of instructions} of each collective in compiled HLO text (an async pair
    ``X-start``/``X-done`` counts once, by its start)."""
    counts = dict.fromkeys(COLLECTIVES, 0)
    for m in _COLLECTIVE_RE.finditer(hlo_text):
        counts[m.group(1)] += 1
    return counts


# --- matmul FLOPs of compiled HLO, loops counted as often as they run
# XLA's cost analysis counts a while loop's body once, so a scanned model's figure leaves out
# most of its work (1.6B-A61M's train step: 39% of the FLOPs, issue 22). Here each computation's
# dots are counted (2 x output elements x contracted size, the flops-v1 way: matmuls only) and
# multiplied by how often the computation runs: the product of the trip counts XLA's loop
# analysis writes on the enclosing while loops (backend_config "known_trip_count").
_COMPUTATION_RE = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_NAME_RE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_OPCODE_RE = re.compile(r"(?:\{[^}]*\})?\s+([\w\-]+)\((.*)$")
_SHAPE_RE = re.compile(r"^[a-z]\w*\[([^\]]*)\]$")
_CALLS_RE = re.compile(r"\b(calls|to_apply|body|condition|branch_computations|true_computation|"
                       r"false_computation)=(\{[^}]*\}|%?[\w.\-]+)")
_TRIP_RE = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_DIMS_RE = re.compile(r"\b(lhs_contracting_dims)=\{([\d,]*)\}")


@dataclass(frozen=True)
class HloFlops:
    """Matmul FLOPs of one compiled program, loops counted as often as they run."""

    flops: float               # dots x the trip counts of their enclosing loops
    flops_once: float          # every dot once (loop bodies once, as XLA's cost analysis does)
    loops: tuple               # known trip count of every while loop, in the text's order
    unknown_trip_loops: int    # loops without a known trip count (their bodies counted once)


def _dims(shape: str) -> list[int] | None:
    m = _SHAPE_RE.match(shape.strip())
    return None if m is None else _dim_list(m.group(1))


def _dim_list(dims: str) -> list[int]:
    """``"8,<=16"`` -> [8, 16] (a dynamic dimension by its bound)."""
    return [int(d.lstrip("<=")) for d in dims.split(",") if d.strip()]


def _instruction(line: str):
    """(name, type, opcode, the rest after the opcode's parenthesis) of an HLO instruction line,
    else None. A tuple type is matched by its parentheses (it may hold /*index=N*/ comments)."""
    m = _NAME_RE.match(line)
    if m is None:
        return None
    i = m.end()
    if line.startswith("(", i):
        depth = 0
        for j in range(i, len(line)):
            depth += {"(": 1, ")": -1}.get(line[j], 0)
            if depth == 0:
                break
        end = j + 1
    else:
        end = line.find("]", i) + 1
        if end == 0:
            return None
    o = _OPCODE_RE.match(line, end)
    return None if o is None else (m.group(1), line[i:end], o.group(1), o.group(2))


_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
                "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
                "c128": 16}
_ARRAY_RE = re.compile(r"\b([a-z]\w*)\[([^\]]*)\]")


def _array_bytes(shape: str) -> list[float]:
    """Bytes of each array of an HLO type (an array or a tuple of them); fp8 and other
    1-byte types by their name (f8e4m3fn ...)."""
    out = []
    for dtype, dims in _ARRAY_RE.findall(shape):
        size = _DTYPE_BYTES.get(dtype, 1 if dtype.startswith("f8") else None)
        if size is None:
            continue
        out.append(float(size * math.prod(_dim_list(dims))))
    return out


def _collective_bytes(opcode: str, shape: str, operands: list[float]) -> float:
    """Bytes one collective moves per device, by the larger of its input and its output (an
    all-gather's output, a reduce-scatter's input, an all-to-all's or all-reduce's buffer).
    An async ``X-start`` returns a tuple of its operands and its outputs (plus small context
    scalars): the outputs are what follows the operands."""
    result = _array_bytes(shape)
    if opcode.endswith("-start") and shape.startswith("(") and \
            result[:len(operands)] == operands:
        result = result[len(operands):]
    return max(sum(result), sum(operands))


@dataclass(frozen=True)
class _HloWalk:
    own_flops: dict          # computation -> matmul FLOPs of its own instructions
    own_collectives: dict    # computation -> {kind: bytes} of its own collectives
    edges: dict              # computation -> [(callee, "branch" | None, trip factor)]
    entry: str
    loops: tuple
    unknown: int

    def total(self, own_of, once: bool = False) -> float:
        """``own_of(computation)`` summed over every computation as often as it runs (a
        conditional: its costliest branch)."""
        @lru_cache(maxsize=None)
        def total(c: str) -> float:
            calls = self.edges.get(c, [])
            branches = [total(n) for n, g, _ in calls if g == "branch"]
            return (own_of(c) + (max(branches) if branches else 0.0)
                    + sum(total(n) * (1 if once else f) for n, g, f in calls if g is None))
        return total(self.entry)


def _walk_hlo(hlo_text: str) -> _HloWalk:
    own: dict[str, float] = {}
    coll: dict[str, dict] = {}
    edges: dict[str, list[tuple[str, str, int | None]]] = {}
    shapes: dict[str, str] = {}
    loops: list[int] = []
    unknown = 0
    entry = comp = None
    for line in hlo_text.splitlines():
        m = _COMPUTATION_RE.match(line)
        if m:
            comp = m.group(1)
            own.setdefault(comp, 0.0)
            coll.setdefault(comp, dict.fromkeys(COLLECTIVES, 0.0))
            edges.setdefault(comp, [])
            shapes = {}
            if line.startswith("ENTRY"):
                entry = comp
            continue
        parsed = _instruction(line) if comp is not None else None
        if parsed is None:
            continue
        name, shape, opcode, rest = parsed
        shapes[name] = shape
        if opcode == "dot":
            out = _dims(shape)
            operands = rest.split(")", 1)[0].split(",")
            lhs = _dims(shapes.get(operands[0].strip().split()[-1].lstrip("%"), "")) \
                if operands else None
            if lhs is None:   # operands written with their types: "f32[8,16]{1,0} %x"
                lhs = _dims(operands[0].strip().split()[0].split("{")[0])
            cm = _DIMS_RE.search(rest)
            if out is None or lhs is None or cm is None:
                raise ValueError(f"hlo: cannot read the dot {name} in {comp}")
            contracted = math.prod(lhs[int(i)] for i in cm.group(2).split(",") if i)
            own[comp] += 2.0 * math.prod(out) * contracted
        kind = opcode.removesuffix("-start")
        if kind in COLLECTIVES:
            args = [a.strip() for a in rest.split(")", 1)[0].split(",") if a.strip()]
            operand_bytes = []
            for arg in args:
                typed = _array_bytes(arg.split("%")[0]) if "[" in arg else []
                operand_bytes += typed or _array_bytes(shapes.get(arg.split()[-1].lstrip("%"),
                                                                  ""))
            coll[comp][kind] += _collective_bytes(opcode, shape, operand_bytes)
        trip = None
        if opcode == "while":
            t = _TRIP_RE.search(rest)
            if t:
                trip = int(t.group(1))
                loops.append(trip)
            else:
                unknown += 1
        for call, target in _CALLS_RE.findall(rest):
            names = [n.strip().lstrip("%") for n in target.strip("{}").split(",") if n.strip()]
            factor = (trip or 1) if call == "body" else 1
            group = "branch" if call in ("branch_computations", "true_computation",
                                         "false_computation") else None
            edges[comp].extend((n, group, factor) for n in names)
    if entry is None:
        raise ValueError("hlo: no ENTRY computation")
    return _HloWalk(own_flops=own, own_collectives=coll, edges=edges, entry=entry,
                    loops=tuple(loops), unknown=unknown)


def hlo_flops(hlo_text: str) -> HloFlops:
    """Matmul FLOPs of compiled HLO text (``compiled.as_text()``), each ``dot`` as often as its
    computation runs (nested loops multiply; a conditional counts its costliest branch)."""
    w = _walk_hlo(hlo_text)
    own = w.own_flops.get
    return HloFlops(flops=w.total(lambda c: own(c, 0.0)),
                    flops_once=w.total(lambda c: own(c, 0.0), once=True), loops=w.loops,
                    unknown_trip_loops=w.unknown)


def collective_bytes(hlo_text: str) -> dict:
    """{kind: bytes per device per program run} of each collective in compiled HLO text, each
    instruction as often as its computation runs, by the larger of its input and output
    (``_collective_bytes``): what one device sends or receives, up to the algorithm's factor
    (a ring all-reduce moves ~2 (n-1)/n of it)."""
    w = _walk_hlo(hlo_text)
    return {kind: w.total(lambda c, k=kind: w.own_collectives.get(c, {}).get(k, 0.0))
            for kind in COLLECTIVES}


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


class _Compiled:
    @property
    def flops_ratio(self) -> float:
        """Compiled matmul FLOPs / flops-v1: what the program computes beyond the convention
        (the LM head recomputed in the backward, the optimizer's Newton-Schulz, capacity slots,
        attention blocks that are masked out)."""
        return self.flops_per_device / self.flops_v1_per_device

    def to_dict(self) -> dict:
        return {**asdict(self), "flops_ratio": self.flops_ratio}


@dataclass(frozen=True)
class CompiledStep(_Compiled):
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
    flops_per_device: float     # matmul FLOPs of the per-device program, loops x trip counts
    flops_v1_per_device: float  # flops-v1 (ladder/counting.py) of the same work / devices
    xla_flops: float            # XLA's cost analysis (every op, loop bodies counted once)
    loops: tuple                # trip counts of the program's while loops
    collectives: dict           # {kind: instruction count} from the compiled HLO
    collective_bytes: dict      # {kind: bytes per device per step}, loops x trip counts
    compile_s: float
    precision: str = "f32"      # the compiled program's compute precision and remat
    remat: str = "none"


@dataclass(frozen=True)
class CompiledEval(_Compiled):
    """XLA's figures for the eval step (held-out loss with drops and dropless, two forward
    passes) of one rung at ``eval_batch`` sequences on one mesh (per device)."""

    devices: int
    eval_batch: int
    bytes_per_device: float
    temp_bytes: float
    flops_per_device: float     # matmul FLOPs, loops x trip counts
    flops_v1_per_device: float  # 2 x flops-v1 forward x the batch's tokens / devices
    xla_flops: float
    collectives: dict
    collective_bytes: dict      # {kind: bytes per device per eval call}
    compile_s: float


def _compile(program, *args) -> dict:
    """Lower and compile ``program`` on abstract ``args`` (nothing is allocated): the compile
    time and XLA's memory, FLOPs and collectives of the program, per device."""
    t = time.perf_counter()
    compiled = program.lower(*args).compile()
    compile_s = time.perf_counter() - t
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    text = compiled.as_text()
    counted = hlo_flops(text)
    arg, tmp = float(mem.argument_size_in_bytes), float(mem.temp_size_in_bytes)
    outb, alias = float(mem.output_size_in_bytes), float(mem.alias_size_in_bytes)
    return {"bytes_per_device": arg + tmp + outb - alias, "argument_bytes": arg,
            "temp_bytes": tmp, "output_bytes": outb, "alias_bytes": alias,
            "flops_per_device": counted.flops, "loops": counted.loops,
            "xla_flops": float(cost.get("flops", float("nan"))),
            "collectives": count_collectives(text), "collective_bytes": collective_bytes(text),
            "compile_s": compile_s}


def compile_step(rung: Rung, devices: int, *, microbatch: int | None = None,
                 expert_parallel: int | None = None) -> CompiledStep:
    """XLA's figures for ``rung``'s real train step on a ``devices`` mesh."""
    import jax
    import jax.numpy as jnp

    from ladder.model.config import resolve_precision
    from ladder.trainer.step import batch_sharding, make_mesh, programs
    from ladder.trainer.trainconfig import TrainConfig, check_cell, microbatch_size

    mb = microbatch_size(rung, TrainConfig(microbatch=microbatch))
    check_cell(rung, devices, mb, "microbatch")
    mesh = make_mesh(devices, expert_parallel, rung.model.n_experts, mb)
    progs = programs(rung.model, mesh, rung.optimizer_settings, rung.batch // mb)
    split = batch_sharding(mesh)
    toks = jax.ShapeDtypeStruct((rung.batch, rung.seq_len), jnp.int32, sharding=split)
    batch = {"tokens": toks, "targets": toks, "lr": jax.ShapeDtypeStruct((), jnp.float32)}
    a = _compile(progs.train_step, progs.abstract_state(), batch)
    return CompiledStep(
        devices=devices, mesh={k: int(v) for k, v in mesh.shape.items()}, microbatch=mb,
        microbatches=rung.batch // mb, **a,
        precision=resolve_precision(rung.model.precision, jax.default_backend()),
        remat=rung.model.remat,
        flops_v1_per_device=rung.flops.training(rung.tokens_per_step, lm_head=True) / devices)


def compile_eval(rung: Rung, devices: int, *, eval_batch: int | None = None,
                 expert_parallel: int | None = None) -> CompiledEval:
    """XLA's figures for ``rung``'s eval step (step.make_eval_step) for ``eval_batch``
    sequences (default: :func:`~ladder.trainer.trainconfig.eval_batch_size`) on the train
    step's mesh."""
    import jax
    import jax.numpy as jnp

    from ladder.trainer.step import batch_sharding, make_mesh, programs
    from ladder.trainer.trainconfig import TrainConfig, eval_batch_size

    eb = eval_batch_size(TrainConfig(eval_batch=eval_batch), devices, rung)
    if eb < 1 or eb % devices:
        raise ValueError(f"eval_batch: the {devices} devices must divide it, got {eb}")
    mesh = make_mesh(devices, expert_parallel, rung.model.n_experts, eb)
    progs = programs(rung.model, mesh, rung.optimizer_settings, 1)
    state = progs.abstract_state()
    toks = jax.ShapeDtypeStruct((eb, rung.seq_len), jnp.int32, sharding=batch_sharding(mesh))
    batch = {"tokens": toks, "targets": toks, "segment_ids": toks}
    a = _compile(progs.eval_step, state["params"], state["router_bias"], batch)
    # two forward passes (as trained, and dropless) of the batch, the LM head included
    v1 = 2.0 * rung.flops.forward * eb * rung.seq_len / devices
    return CompiledEval(devices=devices, eval_batch=eb, flops_v1_per_device=v1,
                        **{f.name: a[f.name] for f in fields(CompiledEval) if f.name in a})


def microbatch_candidates(rung: Rung, devices: int) -> list[int]:
    """Microbatch sizes the step accepts on ``devices``: divisors of the batch that give every
    device whole capacity cells (ladder.trainer.trainconfig.cell_fits), largest first."""
    from ladder.trainer.trainconfig import cell_fits

    return [m for m in range(rung.batch, 0, -1)
            if rung.batch % m == 0 and cell_fits(rung, devices, m)]
