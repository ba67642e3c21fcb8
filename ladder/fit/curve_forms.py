"""Schedule-aware loss-curve laws, their forms: the loss at every step as a function of the whole
LR schedule, and its fast evaluation (fitted by fit.curve_fit into a fit.curve_law.CurveLaw).

``mpl`` -- the multi-power law of Luo et al. 2025 ("A Multi-Power Law for Loss Curve Prediction
Across Learning Rate Schedules", ICLR 2025, arXiv:2503.12811, eqs. of section 3)::

    L(t)  = L0 + A * (S1(t) + S_W)^(-alpha) - LD(t)
    LD(t) = B * sum_{k=W+1..t} (eta_{k-1} - eta_k) * G(eta_k^(-gamma) * S_k(t))
    G(x)  = 1 - (C * x + 1)^(-beta),   S_k(t) = sum_{tau=k..t} eta_tau

with S1 + S_W the sum of all LRs up to t (warmup included) and W the end of warmup.

``momentum`` -- the annealing law of Tissue et al. 2024 ("Scaling Law with Learning Rate
Annealing", arXiv:2408.11029)::

    L(t) = L0 + A * S1(t)^(-alpha) - C * S2(t),   S2(t) = sum_{i<=t} m_i,
    m_i  = lam * m_{i-1} + (eta_{i-1} - eta_i)

so S2(t) = sum_k (eta_{k-1} - eta_k) (1 - lam^(t-k+1)) / (1 - lam); S1 holds warmup, the
annealing increments start after it, as in MPL (negative during warmup).

Conventions (written into law.json):
- LRs per update as fit.lr_schedules says; warmup ends at the first update reaching the maximum
  LR (``W``).
- LRs are divided by ``lr_scale`` (the data's largest LR), so areas are in steps at that LR and
  ``A``, ``B``, ``C`` in those units (the law is invariant under the rescaling).
- The annealing sums are exact at LR jumps; where the LR changes every step they are summed over
  blocks of ``node_every`` updates (drop-weighted midpoint rule; a block never straddles an
  evaluated step nor ~5% of LR change), at most ~500 blocks a run (170 gave the same accuracy on
  Luo et al.'s anchors); ``node_every=1`` is exact.

With several sizes, the ``scaled`` parameters are ``P(N) = P * (N / size_ref)^P_size_exp`` and
the shape parameters are shared (:class:`CurveModel`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ladder.io import InputError

LOG_LR_STEP = 0.05      # blocks never span more than ~5% of LR change (see design)
MAX_NODES = 500         # annealing-sum blocks per run (see module doc)


# ------------------------------------------------------------------------------------ forms


# a parameter's transform: (value -> u, u -> value)
_TRANSFORMS = {"log": (math.log, math.exp), "raw": (float, float),
               "log1m": (lambda p: math.log(1.0 - p), lambda t: 1.0 - math.exp(t))}


@dataclass(frozen=True)
class CurveParam:
    """A curve-law parameter in fit.forms.Param's convention (``to_u``, ``to_display``); unlike
    those, ``lo``/``hi`` bound ``u`` itself and the solver keeps it inside."""
    name: str
    transform: str      # "log": u = log(p); "raw": u = p; "log1m": u = log(1 - p)
    lo: float           # bounds on u
    hi: float

    def to_u(self, p: float) -> float:
        return _TRANSFORMS[self.transform][0](p)

    def to_display(self, t: float) -> float:
        return _TRANSFORMS[self.transform][1](t)

    def u_or_nan(self, p: float) -> float:
        """``to_u(p)``, NaN where ``p`` is outside the transform's domain."""
        try:
            return self.to_u(p)
        except ValueError:
            return math.nan

    def interval_flags(self, interval, level: float) -> list[str]:
        """Why an interval ``[lo, hi]`` does not pin this parameter: an end at a bound of its
        range in ``u`` (a flat direction, as B and beta on curves without a decay)."""
        if interval is None:
            return []
        th = [self.u_or_nan(v) for v in interval]
        return [f"its {level:.0%} interval reaches the bound {self.to_display(b):.3g} of its "
                "range" for b in (self.lo, self.hi) if any(abs(t - b) < 1e-6 for t in th)]


_LOG_BIG = 40.0
FORMS: dict[str, tuple[CurveParam, ...]] = {
    "mpl": (
        CurveParam("L0", "log", math.log(1e-4), math.log(1e4)),
        CurveParam("A", "log", -_LOG_BIG, _LOG_BIG),
        CurveParam("alpha", "log", math.log(1e-3), math.log(5.0)),
        CurveParam("B", "log", -_LOG_BIG, _LOG_BIG),
        CurveParam("C", "log", -_LOG_BIG, _LOG_BIG),
        CurveParam("beta", "log", math.log(1e-3), math.log(20.0)),
        CurveParam("gamma", "raw", -1.0, 5.0),
    ),
    "momentum": (
        CurveParam("L0", "log", math.log(1e-4), math.log(1e4)),
        CurveParam("A", "log", -_LOG_BIG, _LOG_BIG),
        CurveParam("alpha", "log", math.log(1e-3), math.log(5.0)),
        CurveParam("C", "log", -_LOG_BIG, _LOG_BIG),
        CurveParam("lam", "log1m", math.log(1e-6), math.log(0.5)),
    ),
}
EXPRESSIONS = {
    "mpl": "L(t) = L0*(N/N0)^L0_size_exp + A*(N/N0)^A_size_exp * S(t)^-alpha - B * sum_k "
           "(eta_{k-1}-eta_k) * (1 - (1 + C*eta_k^-gamma*S_k(t))^-beta)  [Luo et al. 2025]",
    "momentum": "L(t) = L0*(N/N0)^L0_size_exp + A*(N/N0)^A_size_exp * S1(t)^-alpha - C * S2(t), "
                "S2 = momentum (lam) area of LR drops  [Tissue et al. 2024]",
}
LINEAR = {"mpl": ("L0", "A", "B"), "momentum": ("L0", "A", "C")}
SIZE_EXP = CurveParam("", "raw", -3.0, 3.0)
SIZE_VARIABLES = ("active_params", "params")


# ---------------------------------------------------------------------------- run designs


@dataclass
class RunDesign:
    """Runs precomputed for fast evaluation, one row per evaluated (run, step); ``stack`` joins
    several (blocks padded with zero drops) for one numpy expression."""

    name: str
    size0: float           # the run's size (the first run's, for a stack)
    size: np.ndarray       # size per row, shape (n,)
    t: np.ndarray          # evaluation steps (completed), shape (n,)
    y: np.ndarray          # observed losses (NaN when only predicting)
    S: np.ndarray          # LR area up to t, shape (n,)
    D: np.ndarray          # LR drop per block, shape (n, m) (0 for blocks after t, padding)
    eta: np.ndarray        # representative LR per block, shape (n, m)
    Sk: np.ndarray         # LR area from block to t, shape (n, m), 0 where the block is later
    dt: np.ndarray         # steps from block to t (+1), shape (n, m), 0 where the block is later
    _sparse: Any = None    # the nonzero (row, block) entries, built once (see _sparse_view)


@dataclass(frozen=True)
class _Sparse:
    """The (row, block) entries with a nonzero LR drop before ``t``, the only ones the
    annealing sums need (about half of a run's (n, m) matrix is after ``t``)."""
    row: np.ndarray        # (nnz,) row index, non-decreasing
    starts: np.ndarray     # first entry of each row that has entries
    rows_with: np.ndarray  # those rows
    Sk: np.ndarray
    D: np.ndarray
    log_eta: np.ndarray
    dt: np.ndarray
    n: int
    work: np.ndarray       # (4, nnz) scratch: temporaries cost as much system time as the math


def _sparse_view(run: RunDesign) -> _Sparse:
    if run._sparse is None:
        nz = (run.D != 0) & (run.Sk > 0)
        row, _col = np.nonzero(nz)                      # row-major: rows non-decreasing
        rows_with, starts = np.unique(row, return_index=True)
        run._sparse = _Sparse(row=row, starts=starts, rows_with=rows_with, Sk=run.Sk[nz],
                              D=run.D[nz], log_eta=np.log(run.eta[nz]), dt=run.dt[nz],
                              n=run.t.size, work=np.empty((4, row.size)))
    return run._sparse


def stack(runs: Sequence[RunDesign]) -> RunDesign:
    if isinstance(runs, RunDesign):
        return runs
    runs = list(runs)
    if len(runs) == 1:
        return runs[0]
    m = max(r.D.shape[1] for r in runs)

    def pad(a, fill):
        return np.pad(a, ((0, 0), (0, m - a.shape[1])), constant_values=fill)
    cat = np.concatenate
    return RunDesign("+".join(r.name for r in runs), runs[0].size0, cat([r.size for r in runs]),
                cat([r.t for r in runs]), cat([r.y for r in runs]), cat([r.S for r in runs]),
                cat([pad(r.D, 0.0) for r in runs]), cat([pad(r.eta, 1.0) for r in runs]),
                cat([pad(r.Sk, 0.0) for r in runs]), cat([pad(r.dt, 0.0) for r in runs]))


def design(name: str, lr: np.ndarray, t: np.ndarray, y: np.ndarray | None, size: float,
            lr_scale: float, node_every: int | None = None) -> RunDesign:
    lr = np.asarray(lr, float) / lr_scale
    t = np.asarray(t, dtype=np.int64)
    T = int(t.max())
    if lr.size < T:
        raise InputError(f"run {name!r}: LR sequence shorter ({lr.size}) than last step {T}",
                         field="lr")
    lr = lr[:T]
    cum = np.r_[0.0, np.cumsum(lr)]
    if np.any(cum[t] <= 0):
        raise InputError(f"run {name!r}: zero LR area at an evaluated step", field="lr")
    peak = lr.max()
    W = int(np.argmax(lr >= peak * (1 - 1e-9))) + 1          # 1-based end of warmup
    s = np.arange(W + 1, T + 1)                                # updates after warmup
    d = lr[s - 2] - lr[s - 1]                                  # eta_{s-1} - eta_s
    keep = d != 0
    s, d = s[keep], d[keep]
    if node_every is None:
        node_every = max(1, math.ceil((T - W) / MAX_NODES))
    if s.size:
        # blocks: runs of node_every updates, split at every evaluation step
        cuts = np.unique(np.r_[t, np.arange(node_every, T + node_every, node_every)])
        blk = np.searchsorted(cuts, s, side="left")            # block ends at cuts[blk] >= s
        # also split where log LR has moved by LOG_LR_STEP: eta^-gamma is very convex near a
        # zero LR (decay to 0), where one representative LR per long block is not enough
        band = np.floor(np.log(np.maximum(lr[s - 1], 1e-12)) / LOG_LR_STEP)
        new_block = np.r_[True, (np.diff(blk) != 0) | (np.diff(band) != 0)]
        gid = np.cumsum(new_block) - 1
        _ids, inv = np.unique(gid, return_inverse=True)
        last = np.flatnonzero(np.r_[new_block[1:], True])        # last update of each block
        w = np.abs(d)
        wsum = np.bincount(inv, weights=w)
        D = np.bincount(inv, weights=d)
        eta = np.bincount(inv, weights=w * lr[s - 1]) / wsum
        c = np.bincount(inv, weights=w * cum[s - 1]) / wsum    # area before the block's updates
        p = np.bincount(inv, weights=w * s) / wsum
        end = cuts[blk[last]]
    else:
        D = eta = c = p = end = np.zeros(0)
    valid = end[None, :] <= t[:, None]
    # the block representatives are weighted means, so Sk > 0 and dt > 0 wherever valid
    Sk = np.where(valid, cum[t][:, None] - c[None, :], 0.0)
    dt = np.where(valid, t[:, None] - p[None, :] + 1.0, 0.0)
    eta = np.maximum(eta, 1e-12)
    n = t.size
    yy = np.full(t.shape, np.nan) if y is None else np.asarray(y, float)
    return RunDesign(name, float(size), np.full(n, float(size)), t, yy, cum[t],
                np.where(valid, D[None, :], 0.0), np.broadcast_to(eta, (n, eta.size)).copy(),
                Sk, dt)


def components(form: str, p: dict, run: RunDesign, grad: bool = False):
    """(f1, f2[, df2]) with L = L0 + A*f1 - (B or C)*f2 for the run's parameters ``p``; ``df2``:
    d f2 / d each nonlinear annealing parameter."""
    f1 = run.S ** (-p["alpha"])
    df2: dict[str, np.ndarray] = {}
    if run.D.shape[1] == 0:
        z = np.zeros_like(f1)
        if grad:
            df2 = {k: z for k in (("C", "beta", "gamma") if form == "mpl" else ("lam",))}
        return (f1, z, df2) if grad else (f1, z)
    sp = _sparse_view(run)

    def rowsum(w):  # sum over each row's entries (contiguous segments)
        out = np.zeros(sp.n)
        if sp.starts.size:
            out[sp.rows_with] = np.add.reduceat(w, sp.starts)
        return out
    if form == "mpl":
        x, cx, lu, w = sp.work
        np.multiply(-p["gamma"], sp.log_eta, out=x)
        np.exp(x, out=x)
        x *= sp.Sk                                                # x = Sk * eta^-gamma
        np.multiply(p["C"], x, out=cx)
        np.log1p(cx, out=lu)
        ub = np.multiply(-p["beta"], lu, out=cx if not grad else None)
        np.exp(ub, out=ub)                                        # (1 + Cx)^-beta
        np.subtract(1.0, ub, out=w)
        w *= sp.D
        f2 = rowsum(w)                                            # G(x) = 1 - (1 + Cx)^-beta
        if grad:
            np.multiply(p["C"], x, out=cx)
            cx += 1.0                                             # 1 + Cx
            np.multiply(x, ub, out=w)
            w /= cx
            w *= sp.D
            w *= p["beta"]                                        # beta x ub / (1 + Cx) * D
            df2["C"] = rowsum(w)
            w *= sp.log_eta
            df2["gamma"] = rowsum(w) * (-p["C"])
            np.multiply(ub, lu, out=w)
            w *= sp.D
            df2["beta"] = rowsum(w)
    else:
        lam = p["lam"]
        pw = np.exp(sp.dt * math.log(lam))                        # lam^dt
        k = (1.0 - pw) / (1.0 - lam)                              # (1 - lam^dt) / (1 - lam)
        f2 = rowsum(k * sp.D)
        if grad:
            dk = (-sp.dt * pw / lam * (1.0 - lam) + (1.0 - pw)) / (1.0 - lam) ** 2
            df2["lam"] = rowsum(dk * sp.D)
    return (f1, f2, df2) if grad else (f1, f2)


def curve(form: str, p: dict, run: RunDesign) -> np.ndarray:
    f1, f2 = components(form, p, run)
    lin = LINEAR[form][2]
    return p["L0"] + p["A"] * f1 - p[lin] * f2


def curve_grad(form: str, p: dict, run: RunDesign) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Prediction and its derivatives with respect to each (natural, per-run) parameter."""
    f1, f2, df2 = components(form, p, run, grad=True)
    lin = LINEAR[form][2]
    pred = p["L0"] + p["A"] * f1 - p[lin] * f2
    d = {"L0": np.ones_like(f1), "A": f1, "alpha": -p["A"] * f1 * np.log(run.S), lin: -f2}
    for k, v in df2.items():
        d[k] = -p[lin] * v
    return pred, d


def safe_log(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """log(x), continued linearly below eps so that the objective stays smooth for x <= 0."""
    xs = np.maximum(x, eps)
    return np.where(x >= eps, np.log(xs), math.log(eps) + (x - eps) / eps)


# --------------------------------------------------------------------------- the model spec


class CurveModel:
    """Parameter vector <-> per-run parameters, for one form, fixed values and size scaling."""

    def __init__(self, form: str, scaled: Sequence[str], size_ref: float | None,
                 fix: dict[str, float]):
        self.form = form
        self.base = FORMS[form]
        self.scaled = tuple(scaled) if size_ref is not None else ()
        self.size_ref = size_ref
        self.specs = list(self.base) + [
            CurveParam(f"{n}_size_exp", "raw", SIZE_EXP.lo, SIZE_EXP.hi) for n in self.scaled]
        self.names = [s.name for s in self.specs]
        unknown = sorted(set(fix) - set(self.names))
        if unknown:
            raise InputError(f"cannot fix unknown parameter {unknown[0]!r} of form {form!r}; "
                             f"parameters are {self.names}", field="fix")
        self.fix = {k: float(v) for k, v in fix.items()}
        self.free = [i for i, n in enumerate(self.names) if n not in self.fix]
        for k, v in self.fix.items():
            spec = self.specs[self.names.index(k)]
            if not spec.lo <= spec.u_or_nan(v) <= spec.hi:
                raise InputError(f"fixed value {k}={v} is outside the allowed range", field="fix")

    def full_u(self, free_u: np.ndarray, template: np.ndarray) -> np.ndarray:
        th = template.copy()
        th[self.free] = free_u
        return th

    def u_of(self, values: dict) -> np.ndarray:
        return np.array([s.to_u(values[s.name]) for s in self.specs])

    def values(self, u: np.ndarray) -> dict:
        v = {s.name: s.to_display(t) for s, t in zip(self.specs, u)}
        v.update(self.fix)
        return v

    def run_params(self, values: dict, size: float) -> dict:
        p = {s.name: values[s.name] for s in self.base}
        for n in self.scaled:
            p[n] = p[n] * (size / self.size_ref) ** values[f"{n}_size_exp"]
        return p

    def bounds(self):
        return [(self.specs[i].lo, self.specs[i].hi) for i in self.free]

    def clip(self, u: np.ndarray) -> np.ndarray:
        """``u`` inside every parameter's bounds."""
        return np.clip(u, [s.lo for s in self.specs], [s.hi for s in self.specs])
