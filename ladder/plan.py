"""`ladder plan`: per-device memory and time per step of a rung on a (data x expert) device mesh,
without training and without allocating the model.

Parameter shapes come from ``jax.eval_shape`` of the model's init (``model.param_shapes``), so
even the 535B hero is planned in seconds. FLOPs come from the one counter (ladder/counting.py).

Mesh (as the trainer's, issue #3): N devices = data x expert. Routed-expert weights (leading E
axis) are split over the expert axis; every other parameter, and the router bias, is replicated;
the batch is split over the data axis (ceil(batch / data) sequences on the most loaded device when
it does not divide evenly). By default the expert axis is the largest divisor of N that also
divides the number of experts. An implementation that also splits the batch over the expert axis
(token-parallel attention, all-to-all into the experts) holds 1/expert of the activations shown.

Memory per device (bytes):
- parameters: float32 (4 bytes), expert weights / expert axis;
- gradients: float32, sharded like the parameters (none for the router bias);
- Adam state: two float32 moments per trained parameter (2 x parameters; not the router bias);
- activations: an estimate of what the backward pass keeps for one step's batch on the device
  (no rematerialisation, no gradient accumulation), in bf16 (2 bytes per element) except the
  router logits and the output logits, kept in float32; attention is assumed to be a
  flash-style kernel that stores only a log-sum-exp per query and head, not the S x S scores.
  Per token and layer (elements): 4 D (the two residual inputs and their normed copies)
  + 3 q_dim + 3 kv_dim (q, k, v before and after QK-norm/RoPE, attention output) + 2 H (lse, f32)
  + 2 E (router logits, f32) + 3 L (latent before/after norm, combined latent output)
  + cf k (2 L + 3 F) (per expert slot: input, gate, up, hidden, output) + 3 N F_shared.
  Per token once: 2 D (embedding output, final norm) + 2 V (logits in f32: a chunked
  cross-entropy would avoid most of this).
  It is a planning estimate (within tens of percent of what XLA actually keeps), not a measurement.

Time per step = training FLOPs per step (LM head included) / (N x peak FLOP/s x MFU).
The default peak is one GB200 GPU in bf16 without sparsity: 2.5e15 FLOP/s (NVIDIA's GB200 NVL72
datasheet lists 5 PFLOPS FP16/BF16 per Blackwell GPU *with* 2:4 sparsity; dense is half). The
default MFU 0.4 is an assumption, not a measurement.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ladder.specs import Rung

GB200_BF16_DENSE_FLOPS = 2.5e15

# Nominal dense (no 2:4 sparsity) bf16 peak of one device, matched against jax's device_kind
# (lower-cased substring, first match wins, so the more specific names come first). Vendors
# quote tensor-core bf16 "with sparsity"; dense is half of that figure.
ACCELERATORS = (
    # (substring of device_kind, name, FLOP/s, source)
    ("gb200", "GB200", 2.5e15, "NVIDIA GB200 NVL72 datasheet: 5 PFLOPS FP16/BF16 per GPU with "
     "sparsity"),
    ("b200", "B200", 2.25e15, "NVIDIA HGX B200 datasheet: 4.5 PFLOPS FP16/BF16 per GPU with "
     "sparsity"),
    ("h200", "H200", 989e12, "NVIDIA H200 SXM datasheet: 1,979 TFLOPS BF16 with sparsity"),
    ("h100 pcie", "H100 PCIe", 756e12, "NVIDIA H100 PCIe datasheet: 1,513 TFLOPS BF16 with "
     "sparsity"),
    ("h100", "H100 SXM", 989e12, "NVIDIA H100 SXM datasheet: 1,979 TFLOPS BF16 with sparsity"),
    ("v5 lite", "TPU v5e", 197e12, "Google Cloud TPU v5e docs: 197 TFLOPS BF16 per chip"),
    ("v5e", "TPU v5e", 197e12, "Google Cloud TPU v5e docs: 197 TFLOPS BF16 per chip"),
    ("v5p", "TPU v5p", 459e12, "Google Cloud TPU v5p docs: 459 TFLOPS BF16 per chip"),
    ("tpu v5", "TPU v5p", 459e12, "Google Cloud TPU v5p docs: 459 TFLOPS BF16 per chip"),
    ("v6 lite", "TPU v6e", 918e12, "Google Cloud TPU v6e (Trillium) docs: 918 TFLOPS BF16 per "
     "chip"),
    ("v6e", "TPU v6e", 918e12, "Google Cloud TPU v6e (Trillium) docs: 918 TFLOPS BF16 per chip"),
)


def accelerator_peak(device_kind: str) -> dict | None:
    """{name, flops, source} of the first ACCELERATORS entry whose key is in ``device_kind``
    (case-insensitive), else None."""
    kind = device_kind.lower()
    for key, name, flops, source in ACCELERATORS:
        if key in kind:
            return {"name": name, "flops": flops, "source": source}
    return None
DEFAULT_MFU = 0.4
BYTES_F32 = 4
BYTES_ACT = 2  # bf16 activations


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
    seq_len: int
    tokens_per_step: int
    tokens_per_device: int           # per step, on the most loaded device
    flops_per_step: float            # training FLOPs, LM head included
    flops_per_step_no_lm_head: float
    param_bytes: float
    grad_bytes: float
    optimizer_bytes: float
    activation_bytes: float
    activation_bytes_per_sequence: float
    peak_flops: float
    mfu: float

    @property
    def total_bytes(self) -> float:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.activation_bytes

    @property
    def step_time_s(self) -> float:
        return self.flops_per_step / (self.devices * self.peak_flops * self.mfu)

    @property
    def run_time_s(self) -> float:
        return self.steps * self.step_time_s

    def to_dict(self) -> dict:
        return {**asdict(self), "total_bytes": self.total_bytes, "step_time_s": self.step_time_s,
                "run_time_s": self.run_time_s, "run_time_days": self.run_time_s / 86400}


def activation_elements_per_token(cfg) -> float:
    """Saved activations per token for the whole model (elements; f32 ones counted as 2 bf16).
    See the module docstring for the terms."""
    cap_slots = cfg.capacity_factor * cfg.top_k          # expert slots per token
    total = 0.0
    for layer in range(cfg.n_layers):
        kv_dim = cfg.n_kv_heads(layer) * cfg.head_dim
        total += (4 * cfg.d_model + 3 * cfg.q_dim + 3 * kv_dim + 2 * cfg.n_heads
                  + 2 * cfg.n_experts + 3 * cfg.latent_dim
                  + cap_slots * (2 * cfg.latent_dim + 3 * cfg.expert_dim)
                  + 3 * cfg.n_shared * cfg.shared_dim)
    return total + 2 * cfg.d_model + 2 * cfg.vocab_size


def plan_rung(rung: Rung, devices: int = 1, *, expert_parallel: int | None = None,
              peak_flops: float = GB200_BF16_DENSE_FLOPS, mfu: float = DEFAULT_MFU) -> RungPlan:
    """Memory and time of ``rung`` on ``devices`` devices. Raises ValueError naming the field."""
    import jax  # noqa: F401  (plan is the one `ladder` command that needs JAX)
    from flax.traverse_util import flatten_dict

    from model.transformer import param_group, param_shapes

    if not peak_flops > 0:
        raise ValueError(f"peak_flops: must be > 0, got {peak_flops!r}")
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu: must be in (0, 1], got {mfu!r}")
    cfg = rung.model
    mesh = make_mesh(devices, cfg.n_experts, expert_parallel)

    shapes, bias = param_shapes(cfg)
    n_exact = bias.size
    trained = 0.0                                  # differentiated parameters on one device
    for path, leaf in flatten_dict(shapes).items():
        n_exact += leaf.size
        trained += leaf.size / (mesh.expert if param_group(path) == "routed_experts" else 1)

    counted = rung.params
    flops = rung.flops
    seqs_per_device = math.ceil(rung.batch / mesh.data)   # the largest shard when uneven
    act_per_seq = activation_elements_per_token(cfg) * rung.seq_len * BYTES_ACT
    return RungPlan(
        ladder=rung.ladder, name=rung.name, devices=mesh.devices, data_parallel=mesh.data,
        expert_parallel=mesh.expert, params=counted.total, active_params=counted.active,
        params_exact=int(n_exact), steps=rung.steps, batch=rung.batch, seq_len=rung.seq_len,
        tokens_per_step=rung.tokens_per_step,
        tokens_per_device=seqs_per_device * rung.seq_len,
        flops_per_step=flops.training(rung.tokens_per_step, lm_head=True),
        flops_per_step_no_lm_head=flops.training(rung.tokens_per_step, lm_head=False),
        param_bytes=(trained + bias.size) * BYTES_F32,   # + the replicated router bias
        grad_bytes=trained * BYTES_F32,                  # the bias has no gradient
        optimizer_bytes=2 * trained * BYTES_F32,         # nor Adam moments
        activation_bytes=seqs_per_device * act_per_seq,
        activation_bytes_per_sequence=act_per_seq,
        peak_flops=peak_flops, mfu=mfu,
    )
