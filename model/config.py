"""Model configuration: one frozen dataclass, plain Python (no JAX import).

Axis legend used across model/: B batch, S sequence, D model width, H query heads, K KV heads,
Hd head dim, E routed experts, L latent width, F expert hidden width, C expert capacity, V vocab.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

COMBINE_RULES = ("sigmoid", "softmax")
BIAS_RULES = ("threshold", "quantile", "sign", "none")
PRECISIONS = ("auto", "bf16", "f32")
REMATS = ("none", "dots", "full")


def resolve_precision(precision: str, backend: str) -> str:
    """"auto" -> "f32" on CPU (exact, and CPUs have no fast bf16 matmul) and "bf16" on
    accelerators (GPU/TPU); a concrete value is returned unchanged."""
    if precision != "auto":
        return precision
    return "f32" if backend == "cpu" else "bf16"


@dataclass(frozen=True)
class ModelConfig:
    """A decoder of MoE layers in the shape of Marin's hero recipe.

    Every layer: RMSNorm -> attention (QK-norm, partial RoPE, grouped KV heads, sliding-window
    "local" or full "global") -> RMSNorm -> MoE (routed SwiGLU experts in a latent space of width
    ``latent_dim`` + ``n_shared`` full-width SwiGLU shared experts, router on the full-width token).
    Untied embedding and LM head.
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    head_dim: int
    n_kv_heads_local: int
    n_kv_heads_global: int
    global_every: int = 4          # layer i is global if (i + 1) % global_every == 0, and the last
    local_window: int = 2048       # sliding window of local layers (tokens, incl. the current one)
    rope_fraction: float = 1.0     # fraction of the head dim rotated by RoPE
    rope_theta: float = 10_000.0
    n_experts: int = 8
    top_k: int = 2
    n_shared: int = 1
    expert_dim: int = 32           # hidden width F of a routed expert (in latent space)
    latent_dim: int = 32           # latent width L the routed experts read and write
    shared_dim: int = 32           # hidden width of a shared expert (full-width in and out)
    combine: str = "sigmoid"       # combine weights over the chosen k: sigmoid or softmax
    route_scale: float = 2.5       # combine weights rescaled to sum to this (real recipe: 2.5)
    capacity_factor: float = 1.25  # slots per expert = ceil(cf * tokens * k / E)
    bias_rule: str = "threshold"   # router-bias balancing rule: threshold | quantile | sign | none
    bias_rate: float = 1e-3        # u of the sign rule
    z_loss: float = 1e-4           # logit z-loss weight (real recipe: 1e-4)
    norm_eps: float = 1e-6
    init_std: float = 0.02
    # How to compute (not what): the same parameters and, up to rounding, the same function.
    precision: str = "auto"        # auto | bf16 | f32; "auto": f32 on CPU, bf16 on accelerators
    remat: str = "none"            # none | dots | full: what each layer saves for the backward
    loss_chunk: int = 512          # LM head + cross-entropy over chunks of this many positions
    attention_chunk: int = 512     # query block of attention without flash (XLA: CPU, TPU)

    def __post_init__(self):
        def positive(name):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be a positive integer, got {getattr(self, name)!r}")

        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "head_dim", "n_kv_heads_local",
                     "n_kv_heads_global", "global_every", "local_window", "n_experts", "top_k",
                     "expert_dim", "latent_dim", "loss_chunk", "attention_chunk"):
            positive(name)
        if not isinstance(self.n_shared, int) or self.n_shared < 0:
            raise ValueError(f"n_shared: must be an integer >= 0, got {self.n_shared!r}")
        if self.n_shared and (not isinstance(self.shared_dim, int) or self.shared_dim <= 0):
            raise ValueError(f"shared_dim: must be a positive integer, got {self.shared_dim!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model: {self.d_model} is not divisible by n_heads={self.n_heads}")
        for name in ("n_kv_heads_local", "n_kv_heads_global"):
            if self.n_heads % getattr(self, name):
                raise ValueError(f"{name}: n_heads={self.n_heads} is not a multiple of "
                                 f"{getattr(self, name)}")
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k: {self.top_k} > n_experts={self.n_experts}")
        if not self.capacity_factor > 0:
            raise ValueError(f"capacity_factor: must be > 0, got {self.capacity_factor!r}")
        if not 0.0 <= self.rope_fraction <= 1.0:
            raise ValueError(f"rope_fraction: must be in [0, 1], got {self.rope_fraction!r}")
        if int(self.head_dim * self.rope_fraction) % 2:
            raise ValueError(f"rope_fraction: head_dim * rope_fraction must be even, got "
                             f"{self.head_dim} * {self.rope_fraction}")
        if self.combine not in COMBINE_RULES:
            raise ValueError(f"combine: must be one of {COMBINE_RULES}, got {self.combine!r}")
        if self.bias_rule not in BIAS_RULES:
            raise ValueError(f"bias_rule: must be one of {BIAS_RULES}, got {self.bias_rule!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision: must be one of {PRECISIONS}, got {self.precision!r}")
        if self.remat not in REMATS:
            raise ValueError(f"remat: must be one of {REMATS}, got {self.remat!r}")
        for name in ("route_scale", "bias_rate", "z_loss", "norm_eps", "init_std", "rope_theta"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)!r}")

    # ----------------------------------------------------------------- derived sizes
    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def rope_dim(self) -> int:
        return int(self.head_dim * self.rope_fraction)

    def is_global(self, layer: int) -> bool:
        """Every ``global_every``-th layer (1-based) and the last layer attend globally."""
        return (layer + 1) % self.global_every == 0 or layer == self.n_layers - 1

    @property
    def global_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.n_layers) if self.is_global(i))

    def n_kv_heads(self, layer: int) -> int:
        return self.n_kv_heads_global if self.is_global(layer) else self.n_kv_heads_local

    @property
    def n_groups(self) -> int:
        """Repeats of the [local] * (global_every - 1) + [global] pattern that run under one
        scan: layers 0 .. n_groups * global_every - 1. The rest (n_layers % global_every layers,
        the last of them global) run unrolled after it."""
        return self.n_layers // self.global_every

    @property
    def scanned_layers(self) -> int:
        return self.n_groups * self.global_every

    # ----------------------------------------------------------------- JSON
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown model config key")
        return cls(**d)

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)
