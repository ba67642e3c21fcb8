"""The plain-Python half of the optimizer recipe: the rules' constants, :class:`OptimizerSpec`
(a rung's rule, in ladder files and rung specs) and :class:`OptimizerSettings` (the resolved
numbers `ladder list` prints). The optax side is :mod:`ladder.trainer.optim`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

OPTIMIZERS = ("adamw", "marin")

# AdamW defaults, the usual LLM choices (GPT-3, Llama): b2 0.95, eps 1e-8, decoupled weight decay
# 0.1 on matrices, global-norm clip 1.0.
ADAMW_DEFAULTS = {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "clip": 1.0}

# The hero recipe's rules (Marin's public hero-run tracking issue, quoted in issue 12).
MUONH_LR_RATIO = 13 / 3          # MuonH LR = 13/3 x Adam LR ...
MUONH_LR_CAP = 0.05              # ... at most 0.05
BETA2_BASE, BETA2_BATCH_TOKENS = 0.999, 131_072   # beta2 = 0.999^(tokens per batch / 131072)
BETA2_MIN, BETA2_MAX = 0.95, 0.9999               # ... clipped to [0.95, 0.9999]
EPS_COEF = 9.676e-18             # eps = 9.676e-18 x sqrt(tokens / tokens per batch)
MARIN_BETA1 = 0.9                # Adam/AdamH beta1
# MuonH as the recipe runs it (issue 22 item 3; Marin's grug MoE `scale_with_grug_muonh` and
# Levanter's `scale_with_muonh`, marin-community/marin: experiments/grug/moe/optimizer.py,
# lib/levanter/src/levanter/optim/muonh.py): momentum 0.95 with Nesterov, the buffer
# m <- mu m + g undamped and never bias-corrected, and Newton-Schulz with the 5-step "quintic"
# coefficient schedule of lib/levanter/src/levanter/optim/util.py (which cites
# NVIDIA-NeMo/Emerging-Optimizers). After 5 steps it maps singular values in [0.01, 1] into
# [0.978, 1.032]; optax's fixed (3.4445, -4.7750, 2.0315) into [0.682, 1.134]
# (tests/test_optim.py measures both).
MUON_MOMENTUM = 0.95
MUON_NESTEROV = True
MUON_NS_COEFFS = ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377),
                  (3.7418, -5.5913, 2.3037), (2.8769, -3.1427, 1.2046),
                  (2.8366, -3.0525, 1.2012))
MUON_NS_EPS = 1e-8               # X / (|X|_F + eps) before the iteration (the recipe's muon_eps)

# Group of each parameter under ``marin``, by the group names of model.transformer.param_group.
# The recipe's "gates and norm gains" get plain Adam: the convolution kernels and head gates
# (zero-initialised: a hyperball step keeps a matrix at its norm, and 0 would stay 0); GatedNorm's
# W_down/W_up are hidden matrices: MuonH.
ADAM_GROUPS = ("embedding", "router", "norms", "convs", "head_gates")
ADAMH_GROUPS = ("lm_head",)
MUONH_GROUPS = ("attention", "latent", "shared_experts", "routed_experts", "gated_norms")
NORM_GAIN = "scale"              # leaf name of every RMSNorm gain (ladder/model/layers.py): Adam


def _check(obj, muon_fields: tuple[str, ...]) -> None:
    """What a rule (:class:`OptimizerSpec`, None: not given) and its numbers
    (:class:`OptimizerSettings`) both must be: a known kind, no MuonH field outside marin, the
    betas in [0, 1), eps, weight decay and clip >= 0. ValueError naming the field."""
    if obj.kind not in OPTIMIZERS:
        raise ValueError(f"kind: must be one of {OPTIMIZERS}, got {obj.kind!r}")
    for name in muon_fields:
        if obj.kind != "marin" and getattr(obj, name) is not None:
            raise ValueError(f"{name}: a MuonH setting, for the marin optimizer only (this one "
                             f"is {obj.kind!r})")
    for name in ("beta1", "beta2", "muon_momentum"):
        v = getattr(obj, name)
        if v is not None and not 0 <= v < 1:
            raise ValueError(f"{name}: must be in [0, 1), got {v!r}")
    for name in ("eps", "weight_decay", "clip"):
        v = getattr(obj, name)
        if v is not None and not v >= 0:
            raise ValueError(f"{name}: must be >= 0, got {v!r}")


@dataclass(frozen=True)
class OptimizerSettings:
    """The resolved optimizer of one rung: what `ladder list --json` shows under "optimizer".
    ``muonh_lr`` and the MuonH numbers (``muon_momentum``, ``nesterov``, ``ns_coeffs``: one
    (a, b, c) per Newton-Schulz step) are None for ``adamw``."""

    kind: str
    adam_lr: float
    muonh_lr: float | None
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    clip: float
    muon_momentum: float | None = None
    nesterov: bool | None = None
    ns_coeffs: tuple[tuple[float, float, float], ...] | None = None

    def __post_init__(self):
        _check(self, ("muon_momentum", "nesterov", "ns_coeffs"))
        if not self.adam_lr > 0:
            raise ValueError(f"adam_lr: must be > 0, got {self.adam_lr!r}")
        if self.kind == "marin" and not (self.muonh_lr or 0) > 0:
            raise ValueError(f"muonh_lr: must be > 0 for marin, got {self.muonh_lr!r}")
        if self.kind == "marin":
            if not (isinstance(self.muon_momentum, (int, float)) and 0 <= self.muon_momentum < 1):
                raise ValueError(f"muon_momentum: must be in [0, 1) for marin, got "
                                 f"{self.muon_momentum!r}")
            if not isinstance(self.nesterov, bool):
                raise ValueError(f"nesterov: must be true or false for marin, got "
                                 f"{self.nesterov!r}")
            if not (self.ns_coeffs and all(len(c) == 3 for c in self.ns_coeffs)):
                raise ValueError(f"ns_coeffs: must be one (a, b, c) per Newton-Schulz step, got "
                                 f"{self.ns_coeffs!r}")
            object.__setattr__(self, "ns_coeffs", tuple(tuple(float(x) for x in c)
                                                        for c in self.ns_coeffs))

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
    muon_momentum: float | None = None   # marin only: MuonH's momentum (the recipe: 0.95)
    nesterov: bool | None = None         # marin only: Nesterov momentum for MuonH (the recipe's)

    def __post_init__(self):
        if self.kind not in OPTIMIZERS:
            raise ValueError(f"kind: must be one of {OPTIMIZERS}, got {self.kind!r}")
        for name in ("beta1", "beta2", "eps", "weight_decay", "clip", "muon_momentum"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ValueError(f"{name}: must be null or a number, got {v!r}")
        if self.nesterov is not None and not isinstance(self.nesterov, bool):
            raise ValueError(f"nesterov: must be null, true or false, got {self.nesterov!r}")
        _check(self, ("muon_momentum", "nesterov"))

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
                    "weight_decay": 0.0, "clip": 0.0, "muon_momentum": MUON_MOMENTUM,
                    "nesterov": MUON_NESTEROV, "ns_coeffs": MUON_NS_COEFFS}
        fixed = {k: float(getattr(self, k)) for k in ("beta1", "beta2", "eps", "weight_decay",
                                                      "clip", "muon_momentum")
                 if getattr(self, k) is not None}
        if self.nesterov is not None:
            fixed["nesterov"] = self.nesterov
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
