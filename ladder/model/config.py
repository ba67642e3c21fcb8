"""Model configuration: one frozen dataclass, plain Python (no JAX import).

Axis legend used across model/: B batch, S sequence, D model width, H query heads, K KV heads,
Hd head dim, E routed experts, L latent width, F expert hidden width, C expert capacity, V vocab.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from dataclasses import dataclass

COMBINE_RULES = ("sigmoid", "softmax")
PRECISIONS = ("auto", "bf16", "f32")
REMATS = ("none", "dots", "full")
INITS = ("gpt2", "recipe")
QK_NORMS = ("learned", "rms")
# The hero recipe's init: truncated normal (+-3 sigma) with sigma = 0.5 / sqrt(d_model), no
# residual scaling (Marin's public hero-run tracking issue; issue 12 of this project).
RECIPE_INIT_COEF = 0.5
RECIPE_INIT_TRUNCATE = 3.0


class BiasRule(enum.StrEnum):
    """How the router bias is set after each step, by the name a config file or
    ``--model.bias_rule`` gives (a str: written as its name). Each rule's class: moe.RULES."""

    threshold = "threshold"   # minus each expert's n-th largest raw logit (the first ladders')
    quantile = "quantile"     # minus each expert's upper K/E margin quantile (the hero recipe's)
    sign = "sign"             # bias += u sign(mean load - load) (loss-free balancing)
    none = "none"             # the bias stays at its init (zeros)


BIAS_RULES = tuple(r.value for r in BiasRule)


def resolve_precision(precision: str, backend: str) -> str:
    """"auto" -> "f32" on CPU (exact, and CPUs have no fast bf16 matmul) and "bf16" on
    accelerators (GPU/TPU); a concrete value is returned unchanged."""
    if precision != "auto":
        return precision
    return "f32" if backend == "cpu" else "bf16"


# (field, upper bound, lower bound > or >= 0) of the float switches
NUMBER_BOUNDS = (("capacity_factor", 1e3, ">"), ("route_scale", 1e3, ">="),
                 ("rope_theta", 1e12, ">="), ("qk_mult", 1e3, ">"), ("norm_eps", 1.0, ">="),
                 ("init_std", 10.0, ">="), ("bias_rate", 1.0, ">="), ("z_loss", 1e3, ">="))


def _positive(obj, names) -> None:
    for name in names:
        if not isinstance(getattr(obj, name), int) or getattr(obj, name) <= 0:
            raise ValueError(f"{name}: must be a positive integer, got {getattr(obj, name)!r}")


def _at_most(obj, limits) -> None:
    # what a model can be on any machine (issue 26): 10**200 is refused here, not in a kernel
    for name, hi in limits:
        v = getattr(obj, name)
        if isinstance(v, int) and v > hi:
            raise ValueError(f"{name}: must be <= {hi}, got {v!r}")


def _one_of(obj, choices) -> None:
    for name, allowed in choices:
        if getattr(obj, name) not in allowed:
            raise ValueError(f"{name}: must be one of {allowed}, got {getattr(obj, name)!r}")


@dataclass(frozen=True, kw_only=True)
class ModelSwitches:
    """The model's switches: every choice of the architecture and the recipe that is not a size
    derived from a rung's width and depth, nor how to compute. A ladder's ``Recipe`` holds one
    (ladder/specs.py; a ladder file's ``[recipe]`` table sets them by name) and a
    :class:`ModelConfig` is one plus the sizes and the compute path."""

    vocab_size: int
    head_dim: int
    global_every: int = 4          # layer i is global if (i + 1) % global_every == 0, and the last
    local_window: int = 2048       # sliding window of local layers (tokens, incl. the current one)
    rope_fraction: float = 1.0     # fraction of the head dim rotated by RoPE
    rope_theta: float = 10_000.0
    n_experts: int = 8
    top_k: int = 2
    n_shared: int = 1
    combine: str = "sigmoid"       # combine weights over the chosen k: sigmoid or softmax
    route_scale: float = 2.5       # combine weights rescaled to sum to this (real recipe: 2.5)
    capacity_factor: float = 1.25  # slots per (cell, expert) = ceil(cf * cell tokens * k / E)
    capacity_tokens: int | None = None  # tokens per capacity cell (consecutive tokens of the
    #                                batch); None: one cell per MoE call per device (model/moe.py)
    bias_rule: BiasRule = BiasRule.threshold  # router-bias balancing rule (a name of BiasRule)
    bias_rate: float = 1e-3        # u of the sign rule
    z_loss: float = 1e-4           # logit z-loss weight (real recipe: 1e-4)
    norm_eps: float = 1e-6         # the residual-stream (and latent, learned-QK) RMSNorms; the
    #                                recipe's: 1e-5 (marin-535b.toml; model/layers.py QK_RMS_EPS)
    init_std: float = 0.02
    # The hero recipe's pieces (issue 12; ladder/model/layers.py says where each sits), off by
    # default (the cpu and tiny ladders' model); marin-535b.toml switches them on.
    init: str = "gpt2"             # gpt2: normal(init_std), residual projections / sqrt(2 L);
    #                                recipe: truncated normal +-3 sigma, sigma 0.5/sqrt(d_model)
    global_rope: bool = True       # False: global layers use no positions (NoPE)
    qk_norm: str = "learned"       # learned: RMSNorm with a gain; rms: no gain (the recipe)
    qk_mult: float = 1.0           # q x this after the QK-norm (the recipe: 1.3)
    embed_norm: bool = False       # RMSNorm after the token embedding
    gated_norm_rank: int = 0       # > 0: GatedNorm after every residual-stream RMSNorm, rank
    #                                min(this, d_model) (the recipe: 128); 0: off
    conv_kernel: int = 0           # > 0: short causal depthwise convolutions of this width at K,
    #                                the attention output and the MoE output (the recipe: 4)
    xsa: bool = False              # exclusive self-attention: remove y's component along v
    head_gate: bool = False        # attention output of head h x 2 sigmoid(x . attn_gate_h)

    def __post_init__(self):
        _positive(self, ("vocab_size", "head_dim", "global_every", "local_window", "n_experts",
                         "top_k"))
        _at_most(self, (("vocab_size", 2 ** 24), ("head_dim", 2 ** 12), ("global_every", 2 ** 12),
                        ("local_window", 2 ** 24), ("n_experts", 2 ** 16), ("top_k", 2 ** 16),
                        ("n_shared", 2 ** 10), ("gated_norm_rank", 2 ** 17),
                        ("conv_kernel", 2 ** 10)))
        for name, hi, lo in NUMBER_BOUNDS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v > hi:
                raise ValueError(f"{name}: must be a finite number <= {hi:g}, got {v!r}")
            if not (v > 0 if lo == ">" else v >= 0):
                raise ValueError(f"{name}: must be {lo} 0, got {v!r}")
        if not isinstance(self.n_shared, int) or self.n_shared < 0:
            raise ValueError(f"n_shared: must be an integer >= 0, got {self.n_shared!r}")
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k: {self.top_k} > n_experts={self.n_experts}")
        if self.capacity_tokens is not None and (not isinstance(self.capacity_tokens, int) or
                                                 isinstance(self.capacity_tokens, bool) or
                                                 self.capacity_tokens <= 0):
            raise ValueError(f"capacity_tokens: must be null or a positive integer, got "
                             f"{self.capacity_tokens!r}")
        if isinstance(self.rope_fraction, bool) or \
                not isinstance(self.rope_fraction, (int, float)) or \
                not 0.0 <= self.rope_fraction <= 1.0:
            raise ValueError(f"rope_fraction: must be in [0, 1], got {self.rope_fraction!r}")
        if int(self.head_dim * self.rope_fraction) % 2:
            raise ValueError(f"rope_fraction: head_dim * rope_fraction must be even, got "
                             f"{self.head_dim} * {self.rope_fraction}")
        _one_of(self, (("combine", COMBINE_RULES), ("init", INITS), ("qk_norm", QK_NORMS)))
        if not isinstance(self.bias_rule, str) or self.bias_rule not in BIAS_RULES:
            raise ValueError(f"bias_rule: must be one of {BIAS_RULES}, got {self.bias_rule!r}")
        # a name from a file or an override becomes the rule (frozen: set through object)
        object.__setattr__(self, "bias_rule", BiasRule(self.bias_rule))
        for name in ("global_rope", "embed_norm", "xsa", "head_gate"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: must be true or false, got {getattr(self, name)!r}")
        for name in ("gated_norm_rank", "conv_kernel"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name}: must be an integer >= 0 (0: off), got {v!r}")

    @property
    def switches(self) -> "ModelSwitches":
        """The switches alone (of a :class:`ModelConfig`: without its sizes and compute path)."""
        return ModelSwitches(**{f.name: getattr(self, f.name) for f in SWITCH_FIELDS})


SWITCH_FIELDS = dataclasses.fields(ModelSwitches)


@dataclass(frozen=True, kw_only=True)
class ModelConfig(ModelSwitches):
    """A decoder of MoE layers in the shape of Marin's hero recipe: its switches
    (:class:`ModelSwitches`), its sizes and how to compute it. Every layer: RMSNorm -> attention
    (QK-norm, partial RoPE, grouped KV heads, sliding-window "local" or full "global") -> RMSNorm
    -> MoE (routed SwiGLU experts in a latent space of width ``latent_dim`` + ``n_shared``
    full-width shared experts). Untied embedding and LM head. On disk (config.json's
    ``"model"``) one flat object of every field."""

    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads_local: int
    n_kv_heads_global: int
    expert_dim: int = 32           # hidden width F of a routed expert (in latent space)
    latent_dim: int = 32           # latent width L the routed experts read and write
    shared_dim: int = 32           # hidden width of a shared expert (full-width in and out)
    # How to compute (not what): the same parameters and, up to rounding, the same function.
    precision: str = "auto"        # auto | bf16 | f32; "auto": f32 on CPU, bf16 on accelerators
    remat: str = "none"            # none | dots | full: what each layer saves for the backward
    loss_chunk: int = 512          # LM head + cross-entropy over chunks of this many positions
    attention_chunk: int = 512     # query block of attention without flash (XLA: CPU, TPU)

    def __post_init__(self):
        super().__post_init__()
        _positive(self, ("d_model", "n_layers", "n_heads", "n_kv_heads_local", "n_kv_heads_global",
                         "expert_dim", "latent_dim", "loss_chunk", "attention_chunk"))
        _at_most(self, (("d_model", 2 ** 17), ("n_layers", 2 ** 12), ("n_heads", 2 ** 12),
                        ("n_kv_heads_local", 2 ** 12), ("n_kv_heads_global", 2 ** 12),
                        ("expert_dim", 2 ** 20), ("latent_dim", 2 ** 20), ("shared_dim", 2 ** 20),
                        ("loss_chunk", 2 ** 24), ("attention_chunk", 2 ** 24)))
        if self.n_shared and (not isinstance(self.shared_dim, int) or self.shared_dim <= 0):
            raise ValueError(f"shared_dim: must be a positive integer, got {self.shared_dim!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model: {self.d_model} is not divisible by n_heads={self.n_heads}")
        for name in ("n_kv_heads_local", "n_kv_heads_global"):
            if self.n_heads % getattr(self, name):
                raise ValueError(f"{name}: n_heads={self.n_heads} is not a multiple of "
                                 f"{getattr(self, name)}")
        _one_of(self, (("precision", PRECISIONS), ("remat", REMATS)))

    @classmethod
    def of(cls, switches: ModelSwitches, **sizes) -> "ModelConfig":
        """The model of ``switches`` with these sizes (and compute fields; a switch named here
        too, e.g. ``capacity_tokens``, takes this value)."""
        return cls(**{**{f.name: getattr(switches, f.name) for f in SWITCH_FIELDS}, **sizes})

    # ----------------------------------------------------------------- derived sizes
    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def rope_dim(self) -> int:
        return int(self.head_dim * self.rope_fraction)

    def layer_rope_dim(self, layer: int) -> int:
        """Channels of each head RoPE rotates in ``layer`` (0: NoPE global layers)."""
        return 0 if self.is_global(layer) and not self.global_rope else self.rope_dim

    @property
    def gated_rank(self) -> int:
        """``gated_norm_rank`` capped at d_model (small ladders: a full-rank gate). 0: off."""
        return min(self.gated_norm_rank, self.d_model)

    @property
    def weight_std(self) -> float:
        """sigma of the weight init: ``init_std`` (gpt2) or 0.5 / sqrt(d_model) (recipe)."""
        if self.init == "recipe":
            return RECIPE_INIT_COEF / math.sqrt(self.d_model)
        return self.init_std

    @property
    def residual_std(self) -> float:
        """sigma of the projections that write into the residual stream: gpt2 divides by
        sqrt(2 n_layers) (Radford et al. 2019, section 2.3); the recipe does not."""
        if self.init == "recipe":
            return self.weight_std
        return self.init_std / math.sqrt(2 * self.n_layers)

    @property
    def init_truncate(self) -> float | None:
        """Truncation of the weight init in sigmas (None: a plain normal)."""
        return RECIPE_INIT_TRUNCATE if self.init == "recipe" else None

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
        scan (layers 0 .. scanned_layers - 1); the rest run unrolled after it."""
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
