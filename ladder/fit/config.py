"""How a Chinchilla-family law is fitted: ``FitConfig``, one frozen value that travels through
the fit (fit.law.fit_law builds it; fit.estimate.fit_spec, fit.backtest's refits and fit.select's
candidate fits take it, each refit as ``dataclasses.replace(config, bootstrap=0, ...)``), and is
kept on the fitted law (``FitResult.config``), so its backtest refits with what it was fitted
with."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ladder.io import InputError

HUBER_DELTA = 1e-3   # on log residuals, every law's (Besiroglu et al. 2024's Chinchilla refit)
OBJECTIVES = ("huber", "ols")


@dataclass(frozen=True)
class FitConfig:
    """``bootstrap``: run-level replicates (0: none); ``level``: the intervals' and bands'
    level; ``seed``: the bootstrap's; ``params_column``: the column a form's N reads
    ("params" or "active_params"); ``metric``: the key fitted; ``delta``: the Huber threshold
    on log residuals; ``backtest``: run the rollout backtest; ``objective``: "huber" (summed
    Huber of log residuals) or "ols" (least squares of log(L - E) on log C, E fixed);
    ``prior``: {name: (mean, sd)} in natural units; ``bandwidth``: decades of the scale
    weights (ladder.fit.estimate.scale_weights), None for none. Bad values: InputError naming the
    field (exit 64)."""

    bootstrap: int = 200
    level: float = 0.9
    seed: int = 0
    params_column: str = "params"
    metric: str = "loss"
    delta: float = HUBER_DELTA
    backtest: bool = True
    objective: str = "huber"
    prior: dict = field(default_factory=dict)
    bandwidth: float | None = None

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
        object.__setattr__(self, "prior", dict(self.prior or {}))

    def refit(self, **changes) -> FitConfig:
        """This config for a refit (a backtest fold, a candidate): no bootstrap, no backtest,
        and ``changes``."""
        from dataclasses import replace
        return replace(self, **{"bootstrap": 0, "backtest": False, **changes})
