"""The plain-Python half of the optimizer recipe: the rules' constants, :class:`OptimizerSpec`
(a rung's rule, in ladder files and rung specs) and :class:`OptimizerSettings` (the resolved
numbers `ladder list` prints). Part of the ladder base (no JAX): ``ladder.specs`` builds rungs
with it. The recipe itself, and the optax transformations that use these numbers, are described
and built in :mod:`ladder.optim`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

OPTIMIZERS = ("adamw", "marin")

# AdamW defaults (the optimizer of every ladder before issue 12; the usual LLM choices: GPT-3,
# Llama): b2 0.95, eps 1e-8, decoupled weight decay 0.1 on matrices, global-norm clip 1.0.
ADAMW_DEFAULTS = {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "clip": 1.0}

# The hero recipe's rules (Marin's public hero-run tracking issue, quoted in issue 12).
MUONH_LR_RATIO = 13 / 3          # MuonH LR = 13/3 x Adam LR ...
MUONH_LR_CAP = 0.05              # ... at most 0.05
BETA2_BASE, BETA2_BATCH_TOKENS = 0.999, 131_072   # beta2 = 0.999^(tokens per batch / 131072)
BETA2_MIN, BETA2_MAX = 0.95, 0.9999               # ... clipped to [0.95, 0.9999]
EPS_COEF = 9.676e-18             # eps = 9.676e-18 x sqrt(tokens / tokens per batch)
MARIN_BETA1 = 0.9

# Group of each parameter under ``marin``, by the group names of model.transformer.param_group.
# The recipe's "gates and norm gains" get plain Adam: the convolution kernels and head gates
# (zero-initialised: a hyperball step keeps a matrix at its norm, and 0 would stay 0); GatedNorm's
# W_down/W_up are hidden matrices: MuonH.
ADAM_GROUPS = ("embedding", "router", "norms", "convs", "head_gates")
ADAMH_GROUPS = ("lm_head",)
MUONH_GROUPS = ("attention", "latent", "shared_experts", "routed_experts", "gated_norms")
NORM_GAIN = "scale"              # leaf name of every RMSNorm gain (model/layers.py): Adam


@dataclass(frozen=True)
class OptimizerSettings:
    """The resolved optimizer of one rung: what `ladder list --json` shows under "optimizer".
    ``muonh_lr`` is None for ``adamw``."""

    kind: str
    adam_lr: float
    muonh_lr: float | None
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    clip: float

    def __post_init__(self):
        if self.kind not in OPTIMIZERS:
            raise ValueError(f"kind: must be one of {OPTIMIZERS}, got {self.kind!r}")
        if not self.adam_lr > 0:
            raise ValueError(f"adam_lr: must be > 0, got {self.adam_lr!r}")
        if self.kind == "marin" and not (self.muonh_lr or 0) > 0:
            raise ValueError(f"muonh_lr: must be > 0 for marin, got {self.muonh_lr!r}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name}: must be in [0, 1), got {getattr(self, name)!r}")
        for name in ("eps", "weight_decay", "clip"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)!r}")

    @property
    def muonh_ratio(self) -> float:
        """MuonH/AdamH step per unit of the step's (Adam) LR."""
        return (self.muonh_lr or 0.0) / self.adam_lr

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class OptimizerSpec:
    """A rung's optimizer rule: the kind, and fixed values that override the kind's rules
    (None = the rule). Lives in the ladder's recipe (ladder files) and in each rung."""

    kind: str = "adamw"
    beta1: float | None = None
    beta2: float | None = None
    eps: float | None = None
    weight_decay: float | None = None
    clip: float | None = None

    def __post_init__(self):
        if self.kind not in OPTIMIZERS:
            raise ValueError(f"kind: must be one of {OPTIMIZERS}, got {self.kind!r}")
        for name in ("beta1", "beta2", "eps", "weight_decay", "clip"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ValueError(f"{name}: must be null or a number, got {v!r}")
        for name in ("beta1", "beta2"):
            v = getattr(self, name)
            if v is not None and not 0 <= v < 1:
                raise ValueError(f"{name}: must be in [0, 1), got {v!r}")
        for name in ("eps", "weight_decay", "clip"):
            v = getattr(self, name)
            if v is not None and not v >= 0:
                raise ValueError(f"{name}: must be >= 0, got {v!r}")

    def settings(self, adam_lr: float, tokens: float, tokens_per_step: int) -> OptimizerSettings:
        """The numbers for a run of ``tokens`` tokens at ``tokens_per_step`` per step whose Adam
        peak LR is ``adam_lr``."""
        if self.kind == "adamw":
            rule = dict(ADAMW_DEFAULTS, muonh_lr=None)
        else:
            beta2 = BETA2_BASE ** (tokens_per_step / BETA2_BATCH_TOKENS)
            rule = {"muonh_lr": min(MUONH_LR_RATIO * adam_lr, MUONH_LR_CAP),
                    "beta1": MARIN_BETA1, "beta2": min(max(beta2, BETA2_MIN), BETA2_MAX),
                    "eps": EPS_COEF * math.sqrt(tokens / tokens_per_step),
                    "weight_decay": 0.0, "clip": 0.0}
        fixed = {k: float(getattr(self, k)) for k in ("beta1", "beta2", "eps", "weight_decay",
                                                      "clip") if getattr(self, k) is not None}
        return OptimizerSettings(kind=self.kind, adam_lr=float(adam_lr), **{**rule, **fixed})

    def replace(self, **kw) -> "OptimizerSpec":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "OptimizerSpec":
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown optimizer key")
        return cls(**d)
