"""How a law is fitted: ``FitConfig``, one frozen value that travels through the fit (each refit
as ``config.refit(...)``) and is kept on the fitted law, so its backtest refits with it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ladder.io import InputError, number

HUBER_DELTA = 1e-3   # on log residuals, every law's (Besiroglu et al. 2024's Chinchilla refit)
OBJECTIVES = ("huber", "ols")


@dataclass(frozen=True)
class FitConfig:
    """The law asked for: ``form`` (or "auto"), ``fix`` ({name: value}), ``tie`` ({name:
    name}), ``by`` (one law per value of that column). The estimator: ``bootstrap`` replicates
    (0: none), ``level``, ``seed``, ``params_column`` (what a form's N reads), ``metric`` (None:
    the table's own), ``delta`` (Huber, on log residuals), ``backtest``, ``objective`` ("huber"
    or "ols": least squares of log(L - E) on log C, E fixed), ``prior`` ({name: (mean, sd)}),
    ``bandwidth`` (fit.estimate.scale_weights). The forecast layer (fit.law.fit_law):
    ``asymptote_rule``, ``scale_weighting``, ``band_prior``, ``extrapolation_power``. Two
    selection rules with a switch each for bench/scoreboard.py: ``one_se_form`` (auto's
    one-standard-error choice) and ``shared_folds`` (the asymptote rule's common folds).
    Bad values: InputError naming the field (exit 64)."""

    form: str = "auto"
    fix: dict = field(default_factory=dict)
    tie: dict = field(default_factory=dict)
    by: str | None = None
    bootstrap: int = 200
    level: float = 0.9
    seed: int = 0
    params_column: str = "params"
    metric: str | None = None
    delta: float = HUBER_DELTA
    backtest: bool = True
    objective: str = "huber"
    prior: dict = field(default_factory=dict)
    bandwidth: float | None = None
    asymptote_rule: bool | None = None
    scale_weighting: bool | None = None
    band_prior: dict | bool | None = None
    extrapolation_power: float | None = None
    one_se_form: bool = True
    shared_folds: bool = True

    def __post_init__(self):
        if not 0 < self.level < 1:
            raise InputError(f"must be in (0, 1), got {self.level!r}", field="level")
        if self.bootstrap < 0:
            raise InputError(f"must be >= 0, got {self.bootstrap!r}", field="bootstrap")
        if self.params_column not in ("params", "active_params"):
            raise InputError("must be 'params' or 'active_params'", field="params_column")
        if self.objective not in OBJECTIVES:
            raise InputError(f"one of {', '.join(OBJECTIVES)}, got {self.objective!r}",
                             field="objective")
        if not (isinstance(self.delta, (int, float)) and math.isfinite(self.delta)
                and self.delta > 0):
            raise InputError(f"must be a positive number, got {self.delta!r}", field="delta")
        object.__setattr__(self, "extrapolation_power", number(
            self.extrapolation_power, field="extrapolation_power", lo=0, allow_none=True))
        object.__setattr__(self, "fix", dict(self.fix or {}))
        object.__setattr__(self, "tie", dict(self.tie or {}))
        object.__setattr__(self, "prior", _checked_prior(self.prior, self.fix))

    def refit(self, **changes) -> FitConfig:
        """This config for a refit: no bootstrap, no backtest, and ``changes``."""
        return replace(self, **{"bootstrap": 0, "backtest": False, **changes})


def _checked_prior(prior, fix) -> dict:
    """{name: (mean, sd)} as floats: a finite mean, sd > 0, and no fixed parameter."""
    out = {}
    for k, v in (prior or {}).items():
        try:
            mean, sd = (float(x) for x in v)
        except (TypeError, ValueError):
            raise InputError(f"{k}: expected (mean, sd), got {v!r}", field="prior") from None
        if not (math.isfinite(mean) and math.isfinite(sd) and sd > 0):
            raise InputError(f"{k}: needs a finite mean and sd > 0, got {v!r}", field="prior")
        if k in fix:
            raise InputError(f"{k}: both fixed and given a prior", field="prior")
        out[k] = (mean, sd)
    return out
