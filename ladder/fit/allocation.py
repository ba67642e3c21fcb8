"""Compute-optimal allocation of a Chinchilla-form law (IsoFLOP Approaches 1 and 2: fit.isoflop).

Hoffmann et al. 2022, Eq. 4 / App. A: minimising E + A/N^alpha + B/D^beta under C = k N D gives
N_opt(C) = G (C/k)^a, D_opt(C) = G^-1 (C/k)^b with a = beta/(alpha+beta), b = alpha/(alpha+beta),
G = (alpha A / (beta B))^(1/(alpha+beta)); k = 6, Chinchilla's convention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Allocation:
    """N_opt and D_opt as powers of compute; NaN where not defined or beyond float64, and
    ``reason`` says why."""
    a: float
    b: float
    G: float
    k: float = 6.0
    reason: str | None = None

    @property
    def defined(self) -> bool:
        return self.reason is None

    def n_opt(self, C):
        return self._power(C, self.a, math.log(self.G) if self.G > 0 else math.nan)

    def d_opt(self, C):
        return self._power(C, self.b, -math.log(self.G) if self.G > 0 else math.nan)

    def _power(self, C, e, log_coef):
        # in log space: an optimum beyond float64 is NaN, never an overflow
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            out = np.exp(log_coef + e * np.log(np.asarray(C, dtype=float) / self.k))
        return np.where(np.isfinite(out), out, np.nan)


# exp() of more than this overflows float64 (max ~ e^709.78)
LOG_MAX = 709.0


def allocation(params: dict, k: float = 6.0) -> Allocation:
    """The compute-optimal allocation of a Chinchilla-form law, defined for alpha, beta, A,
    B > 0 (else the optimum runs off to a boundary); G in log space."""
    al, be, A, B = (float(params[n]) for n in ("alpha", "beta", "A", "B"))
    nan = math.nan
    if not all(math.isfinite(v) for v in (al, be, A, B)):
        return Allocation(nan, nan, nan, k, reason="a parameter is not finite")
    if not (al > 0 and be > 0):
        return Allocation(nan, nan, nan, k, reason=f"needs alpha > 0 and beta > 0 (alpha = "
                          f"{al:.4g}, beta = {be:.4g}): the loss does not fall in N or in D")
    if not (A > 0 and B > 0):
        return Allocation(nan, nan, nan, k, reason=f"needs A > 0 and B > 0 (A = {A:.4g}, B = "
                          f"{B:.4g})")
    s = al + be
    a, b = be / s, al / s
    log_g = (math.log(al) + math.log(A) - math.log(be) - math.log(B)) / s
    if not abs(log_g) <= LOG_MAX:
        return Allocation(a, b, nan, k, reason=f"G = exp({log_g:.4g}) overflows float64 "
                          f"(1/(alpha + beta) = {1 / s:.4g})")
    return Allocation(a, b, math.exp(log_g), k)


def allocation_diagnostics(params: dict, boot_u, spec, level: float) -> dict:
    """diagnostics.allocation of a Chinchilla fit: a, b, G (None where not defined, with why) and
    a's bootstrap interval."""
    al = allocation(params)

    def num(v):
        return float(v) if math.isfinite(v) else None
    out = {"a": num(al.a), "b": num(al.b), "G": num(al.G), "k": al.k,
           "formula": "N_opt = G (C/k)^a, D_opt = (C/k)^b / G, a = beta/(alpha+beta)"}
    if al.reason:
        out["not_defined"] = al.reason
    if boot_u is not None:
        names = spec.form.names
        alpha = boot_u[:, names.index("alpha")]
        beta = boot_u[:, names.index("beta")]
        ok = (alpha > 0) & (beta > 0)
        if ok.any():
            a = beta[ok] / (alpha[ok] + beta[ok])
            q = 0.5 + level / 2
            out["a_interval"] = [float(np.quantile(a, 1 - q)), float(np.quantile(a, q))]
            out["a_interval_draws"] = int(ok.sum())
    return out
