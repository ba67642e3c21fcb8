"""Schedule-aware loss-curve laws: the loss at every step as a function of the whole LR schedule.

Two forms, fitted on whole curves (points tables with ``run, step, lr, loss`` rows):

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

so S2(t) = sum_k (eta_{k-1} - eta_k) (1 - lam^(t-k+1)) / (1 - lam). Here S1 is the forward area
of all LRs (warmup included) and the annealing increments start after warmup, as in MPL (during
warmup they are negative and would make S2 meaningless).

Conventions (ours, written into law.json):
- ``lr[s-1]`` is the LR of update ``s``; the loss at completed step ``t`` has seen updates 1..t
  (see :mod:`fit.lr_schedules`, which also documents how sampled LRs are interpolated).
- Warmup ends at the first update whose LR reaches the schedule's maximum (``W`` above).
- LRs are divided by ``lr_scale`` (the largest LR of the fitting data) before use, so all areas
  are in "steps at the reference LR"; ``A``, ``B``, ``C`` are in those units (the law is invariant
  under this rescaling: e.g. MPL's C becomes C * lr_scale^(1-gamma)). ``lr_scale`` is stored.
- The annealing sums are exact for steps at which the LR changes by a jump; where it changes
  every step they are summed over blocks of ``node_every`` updates (LR-drop-weighted midpoint
  rule; blocks never straddle a step where the loss is evaluated, nor more than ~5% of LR
  change). ``node_every`` is chosen so a run has at most ~500 blocks (on the Luo et al. anchors
  500 and 170 blocks give the same accuracy); with 1 the sums are exact (tested against a naive
  per-step implementation).

Fitting: Huber loss (delta 1e-3) on log residuals, summed (not averaged: averaging stops L-BFGS
early, the Chinchilla-refit lesson of Besiroglu et al. 2024); starts from a grid over the
nonlinear parameters with the linear ones (L0, A, B or L0, A, C) solved by non-negative least
squares, then the best few polished together by fit.solver's batched L-BFGS within the
parameters' bounds (``fit.solver.polish``, the Chinchilla family's last stage too). Bands:
run-level bootstrap (resample whole runs with replacement: ``fit.solver.run_weights``; every
distinct resample refitted from the estimate, all at once) for parameter uncertainty, plus the
RMS log residual of the fit as run-to-run and point noise, combined by Monte Carlo in log space.
Fewer than 2 draws -> NaN band with a warning, never a zero-width one.

Across model sizes: with runs of several sizes (``active_params`` column by default), the
parameters named in ``scaled`` (default L0 and A) are power laws of size,
``P(N) = P * (N / size_ref)^P_size_exp``, and the shape parameters are shared; the joint fit
starts from per-size fits (kept in ``diagnostics.per_size``) and a log-linear regression of their
parameters on log N. So a ladder yields a curve forecast for a target of any size under any
schedule.

No JAX here.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import fit.lawjson as lawjson
from fit.lr_schedules import NamedSchedule, lr_from_samples, parse_schedule
from fit.prediction import Prediction
from fit.report import auto_lines, bootstrap_line, parameter_lines
from fit.result import LawResult
from fit.solver import percentile_interval, polish, run_weights
from ladder.io import InputError, number, sha256_of

HUBER_DELTA = 1e-3      # on log residuals, as the Chinchilla refits (Besiroglu et al. 2024)
LOG_LR_STEP = 0.05      # blocks never span more than ~5% of LR change (see _design)
MAX_NODES = 500         # annealing-sum blocks per run (see module doc)


# ------------------------------------------------------------------------------------ forms


@dataclass(frozen=True)
class _Param:
    """A curve-law parameter in the solver's convention of fit.forms.Param: the solver works on
    ``u`` (``to_u``; ``to_display`` back). Unlike a Chinchilla-family parameter, whose
    ``bounds`` are a plausible display-space range that is flagged, not enforced, ``lo``/``hi``
    bound ``u`` itself and the solver keeps it inside (fit.solver.lbfgs ``bounds``, as scipy's
    L-BFGS-B did before)."""
    name: str
    transform: str      # "log": u = log(p); "raw": u = p; "log1m": u = log(1 - p)
    lo: float           # bounds on u
    hi: float

    def to_u(self, p: float) -> float:
        if self.transform == "log":
            return math.log(p)
        if self.transform == "log1m":
            return math.log(1.0 - p)
        return float(p)

    def to_display(self, t: float) -> float:
        if self.transform == "log":
            return math.exp(t)
        if self.transform == "log1m":
            return 1.0 - math.exp(t)
        return float(t)


_LOG_BIG = 40.0
FORMS: dict[str, tuple[_Param, ...]] = {
    "mpl": (
        _Param("L0", "log", math.log(1e-4), math.log(1e4)),
        _Param("A", "log", -_LOG_BIG, _LOG_BIG),
        _Param("alpha", "log", math.log(1e-3), math.log(5.0)),
        _Param("B", "log", -_LOG_BIG, _LOG_BIG),
        _Param("C", "log", -_LOG_BIG, _LOG_BIG),
        _Param("beta", "log", math.log(1e-3), math.log(20.0)),
        _Param("gamma", "raw", -1.0, 5.0),
    ),
    "momentum": (
        _Param("L0", "log", math.log(1e-4), math.log(1e4)),
        _Param("A", "log", -_LOG_BIG, _LOG_BIG),
        _Param("alpha", "log", math.log(1e-3), math.log(5.0)),
        _Param("C", "log", -_LOG_BIG, _LOG_BIG),
        _Param("lam", "log1m", math.log(1e-6), math.log(0.5)),
    ),
}
EXPRESSIONS = {
    "mpl": "L(t) = L0*(N/N0)^L0_size_exp + A*(N/N0)^A_size_exp * S(t)^-alpha - B * sum_k "
           "(eta_{k-1}-eta_k) * (1 - (1 + C*eta_k^-gamma*S_k(t))^-beta)  [Luo et al. 2025]",
    "momentum": "L(t) = L0*(N/N0)^L0_size_exp + A*(N/N0)^A_size_exp * S1(t)^-alpha - C * S2(t), "
                "S2 = momentum (lam) area of LR drops  [Tissue et al. 2024]",
}
_LINEAR = {"mpl": ("L0", "A", "B"), "momentum": ("L0", "A", "C")}
_SIZE_EXP = _Param("", "raw", -3.0, 3.0)
SIZE_VARIABLES = ("active_params", "params")


# ---------------------------------------------------------------------------- run designs


@dataclass
class _Run:
    """Runs precomputed for fast evaluation: one row per evaluated (run, step). Several runs are
    stacked into one (``_stack``), blocks padded with zero drops, so that one numpy expression
    evaluates them all."""

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
    """The (row, block) entries with a nonzero LR drop and the block before ``t``: blocks after
    ``t`` (about half of a run's (n, m) matrix, and all of the padding of a stack) contribute
    exactly 0, so the annealing sums run over these entries only, as weighted bincounts."""
    row: np.ndarray        # (nnz,) row index, non-decreasing
    starts: np.ndarray     # first entry of each row that has entries
    rows_with: np.ndarray  # those rows
    Sk: np.ndarray
    D: np.ndarray
    log_eta: np.ndarray
    dt: np.ndarray
    n: int
    work: np.ndarray       # (4, nnz) scratch: reused, so that an evaluation allocates (and
    # page-faults in) no nnz-sized temporaries (they cost as much system time as the math)


def _sparse_view(run: _Run) -> _Sparse:
    if run._sparse is None:
        nz = (run.D != 0) & (run.Sk > 0)
        row, _col = np.nonzero(nz)                      # row-major: rows non-decreasing
        rows_with, starts = np.unique(row, return_index=True)
        run._sparse = _Sparse(row=row, starts=starts, rows_with=rows_with, Sk=run.Sk[nz],
                              D=run.D[nz], log_eta=np.log(run.eta[nz]), dt=run.dt[nz],
                              n=run.t.size, work=np.empty((4, row.size)))
    return run._sparse


def _stack(runs: Sequence[_Run]) -> _Run:
    if isinstance(runs, _Run):
        return runs
    runs = list(runs)
    if len(runs) == 1:
        return runs[0]
    m = max(r.D.shape[1] for r in runs)

    def pad(a, fill):
        return np.pad(a, ((0, 0), (0, m - a.shape[1])), constant_values=fill)
    cat = np.concatenate
    return _Run("+".join(r.name for r in runs), runs[0].size0, cat([r.size for r in runs]),
                cat([r.t for r in runs]), cat([r.y for r in runs]), cat([r.S for r in runs]),
                cat([pad(r.D, 0.0) for r in runs]), cat([pad(r.eta, 1.0) for r in runs]),
                cat([pad(r.Sk, 0.0) for r in runs]), cat([pad(r.dt, 0.0) for r in runs]))


def _design(name: str, lr: np.ndarray, t: np.ndarray, y: np.ndarray | None, size: float,
            lr_scale: float, node_every: int | None = None) -> _Run:
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
    return _Run(name, float(size), np.full(n, float(size)), t, yy, cum[t],
                np.where(valid, D[None, :], 0.0), np.broadcast_to(eta, (n, eta.size)).copy(),
                Sk, dt)


def _components(form: str, p: dict, run: _Run, grad: bool = False):
    """(f1, f2[, df2]) with L = L0 + A*f1 - (B or C)*f2 for the run's parameters ``p``; ``df2``
    maps the nonlinear annealing parameters to d f2 / d parameter. Blocks after ``t`` have
    ``Sk = dt = 0`` and so contribute exactly 0 (G(0) = 0, (1 - lam^0) = 0)."""
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


def _curve(form: str, p: dict, run: _Run) -> np.ndarray:
    f1, f2 = _components(form, p, run)
    lin = _LINEAR[form][2]
    return p["L0"] + p["A"] * f1 - p[lin] * f2


def _curve_grad(form: str, p: dict, run: _Run) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Prediction and its derivatives with respect to each (natural, per-run) parameter."""
    f1, f2, df2 = _components(form, p, run, grad=True)
    lin = _LINEAR[form][2]
    pred = p["L0"] + p["A"] * f1 - p[lin] * f2
    d = {"L0": np.ones_like(f1), "A": f1, "alpha": -p["A"] * f1 * np.log(run.S), lin: -f2}
    for k, v in df2.items():
        d[k] = -p[lin] * v
    return pred, d


def _huber(r: np.ndarray, delta: float) -> np.ndarray:
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


def _safe_log(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """log(x), continued linearly below eps so that the objective stays smooth for x <= 0."""
    xs = np.maximum(x, eps)
    return np.where(x >= eps, np.log(xs), math.log(eps) + (x - eps) / eps)


# --------------------------------------------------------------------------- the model spec


class _Model:
    """Parameter vector <-> per-run parameters, for one form, fixed values and size scaling."""

    def __init__(self, form: str, scaled: Sequence[str], size_ref: float | None,
                 fix: dict[str, float]):
        self.form = form
        self.base = FORMS[form]
        self.scaled = tuple(scaled) if size_ref is not None else ()
        self.size_ref = size_ref
        self.specs = list(self.base) + [
            _Param(f"{n}_size_exp", "raw", _SIZE_EXP.lo, _SIZE_EXP.hi) for n in self.scaled]
        self.names = [s.name for s in self.specs]
        unknown = sorted(set(fix) - set(self.names))
        if unknown:
            raise InputError(f"cannot fix unknown parameter {unknown[0]!r} of form {form!r}; "
                             f"parameters are {self.names}", field="fix")
        self.fix = {k: float(v) for k, v in fix.items()}
        self.free = [i for i, n in enumerate(self.names) if n not in self.fix]
        for k, v in self.fix.items():
            spec = self.specs[self.names.index(k)]
            try:
                th = spec.to_u(v)
            except ValueError:
                th = float("nan")
            if not spec.lo <= th <= spec.hi:
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


def _objective(model: _Model, u: np.ndarray, runs, delta: float) -> float:
    run = _stack(runs)
    pred = _curve(model.form, model.run_params(model.values(u), run.size), run)
    tot = float(_huber(_safe_log(pred) - np.log(run.y), delta).sum())
    return tot if math.isfinite(tot) else 1e300


def _objective_grad(model: _Model, u: np.ndarray, runs, delta: float,
                    eps: float = 1e-6, weights: np.ndarray | None = None
                    ) -> tuple[float, np.ndarray]:
    """The summed Huber objective and its exact gradient in u (all parameters).
    ``weights``: one per point (a bootstrap replicate's run counts), else all 1."""
    run = _stack(runs)
    v = model.values(u)
    g = np.zeros(len(model.specs))
    index = {n: i for i, n in enumerate(model.names)}
    p = model.run_params(v, run.size)
    pred, d = _curve_grad(model.form, p, run)
    r = _safe_log(pred, eps) - np.log(run.y)
    h = _huber(r, delta)
    w = np.clip(r, -delta, delta) / np.where(pred >= eps, pred, eps)   # dHuber/dpred
    if weights is not None:
        h, w = h * weights, w * weights
    tot = float(h.sum())
    for name, dp in d.items():
        if name in model.scaled:                 # p_row = p * (size/ref)^e
            wdp = w * dp * p[name]
            g[index[f"{name}_size_exp"]] += float(wdp @ np.log(run.size / model.size_ref))
            g[index[name]] += float(wdp.sum()) / v[name]
        else:
            g[index[name]] += float(w @ dp)
    # chain rule to u
    for i, spec in enumerate(model.specs):
        val = v[spec.name]
        g[i] *= val if spec.transform == "log" else (-(1.0 - val) if spec.transform == "log1m"
                                                      else 1.0)
    if not (math.isfinite(tot) and np.all(np.isfinite(g))):
        return 1e300, np.zeros_like(g)
    return tot, g


# The curve fits' stopping test (fit.solver.lbfgs, per row): a relative decrease of the summed
# Huber objective below FIT_FTOL on two successive iterations, or max |projected gradient| below
# FIT_GTOL. scipy's L-BFGS-B, which these fits used before, stopped at an absolute decrease of
# 1e-15 (its ftol relative to max(|f|, 1); the objective here is ~1e-4-1e-2); this is that test
# relative to f itself (docs/LOG.md, 2026-12-01: the same held-out errors on Luo et al.'s curves).
FIT_FTOL = 1e-12
FIT_GTOL = 1e-12
FIT_MAX_ITER = 3000
# a bootstrap refit starts at the estimate, to the same tolerance (at 1e-9 or 1e-10 one of the 10
# distinct refits on Luo et al.'s 25M curves stopped early along a flat direction). Replicates of
# one or two distinct schedules (one schedule drawn three times) leave B, C and beta unidentified
# and stop at BOOT_MAX_ITER, as they did with scipy's L-BFGS-B, at other points of the same flat
# valley (on 100M: 0.3% and 0.9% above scipy's objective, 5.5% below): bands differ from main's
# by up to 0.8% of the loss on 100M, 0.03% on 25M, 4e-6 on 400M (docs/LOG.md, 2026-12-01); every
# other refit reaches scipy's optimum to 1e-12
BOOT_FTOL = FIT_FTOL
BOOT_MAX_ITER = 500


def _minimize(model: _Model, u0: np.ndarray, runs, delta: float, *,
              per_row: bool = False, weights=None, max_iter: int = FIT_MAX_ITER,
              ftol: float = FIT_FTOL):
    """Polish every row of ``u0`` (S, P: full parameter vectors), all at once by
    fit.solver's batched L-BFGS within the parameters' bounds, on ``runs`` (every row the same
    runs) or with ``per_row``, on ``runs[row]`` with per-point ``weights[row]`` (a bootstrap
    replicate's runs and counts). (u (S, P), objective (S,), converged (S,), index of the
    lowest objective)."""
    u0 = np.atleast_2d(np.asarray(u0, dtype=float))
    rows_runs = [_stack(r) for r in runs] if per_row else [_stack(runs)] * len(u0)
    rows_w = weights if per_row and weights is not None else [None] * len(u0)
    free = model.free
    if not free:
        f = np.array([_objective(model, th, r, delta) for th, r in zip(u0, rows_runs)])
        return u0, f, np.ones(len(f), dtype=bool), int(np.argmin(f))

    def fg(X, rows):
        F = np.empty(len(rows))
        G = np.empty((len(rows), len(free)))
        for j, r in enumerate(rows):
            F[j], g = _objective_grad(model, model.full_u(X[j], u0[r]), rows_runs[r],
                                      delta, weights=rows_w[r])
            G[j] = g[free]
        return F, G

    lo, hi = (np.array(b) for b in zip(*model.bounds()))
    i, res = polish(fg, u0[:, free], bounds=(lo, hi), ftol=ftol, gtol=FIT_GTOL,
                    max_iter=max_iter)
    u = u0.copy()
    u[:, free] = res.x
    return u, res.f, res.converged, i


@contextlib.contextmanager
def _single_thread_blas():
    """Run OpenBLAS single-threaded inside the block (restored after). The fits' BLAS calls
    (the gradient's dot products, NNLS of the starts) are tiny; multithreaded they spend most of
    their time starting and spinning threads: a bootstrap refit took 3.5x the CPU time with the
    default threads on a 2-core machine (measured here, with scipy's L-BFGS-B, before
    fit.solver's L-BFGS took over). Linux, OpenBLAS only; anything unexpected -> no change."""
    import ctypes

    handles = []
    try:
        with open("/proc/self/maps") as f:
            libs = sorted({ln.split()[-1] for ln in f if "openblas" in ln.lower()
                           and ln.split()[-1].startswith("/")})
        for lib in libs:
            dll = ctypes.CDLL(lib)
            for suffix in ("64_", "", "_64_"):
                get = getattr(dll, f"scipy_openblas_get_num_threads{suffix}", None) \
                    or getattr(dll, f"openblas_get_num_threads{suffix}", None)
                set_ = getattr(dll, f"scipy_openblas_set_num_threads{suffix}", None) \
                    or getattr(dll, f"openblas_set_num_threads{suffix}", None)
                if get is not None and set_ is not None:
                    handles.append((set_, int(get())))
                    set_(ctypes.c_int(1))
                    break
    except (OSError, AttributeError, ValueError):
        pass
    try:
        yield
    finally:
        for set_, n in handles:
            try:
                set_(ctypes.c_int(n))
            except (OSError, ValueError):
                pass


# ------------------------------------------------------------------------------- start grid


def _nonlinear_grid(form: str, T: float) -> list[dict]:
    if form == "mpl":
        return [{"alpha": a, "beta": b, "gamma": g, "C": c / T}
                for a in (0.2, 0.35, 0.5, 0.8) for b in (0.3, 0.6, 1.2) for g in (0.2, 0.5, 0.8)
                for c in (3.0, 30.0, 300.0, 3000.0)]
    return [{"alpha": a, "lam": 1.0 - q} for a in (0.15, 0.25, 0.4, 0.6, 0.9)
            for q in (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2)]


def _solve_linear(form: str, nl: dict, runs: Sequence[_Run]) -> dict | None:
    """Non-negative least squares (relative errors) for the linear parameters of one size."""
    from scipy.optimize import nnls

    p = dict(nl, L0=1.0, A=1.0, B=1.0, C=nl.get("C", 1.0))
    run = _stack(runs)
    f1, f2 = _components(form, p, run)
    M, b = np.c_[np.ones_like(f1), f1, -f2] / run.y[:, None], np.ones_like(run.y)
    if not np.all(np.isfinite(M)):
        return None
    scale = np.maximum(np.abs(M).max(axis=0), 1e-300)
    coef, _ = nnls(M / scale, b)
    coef = coef / scale
    names = _LINEAR[form]
    out = dict(nl)
    for n, c in zip(names, coef):
        out[n] = max(float(c), 1e-12)
    if form == "mpl" and "C" not in out:
        out["C"] = nl["C"]
    return out


def _fit_one_size(model: _Model, runs: Sequence[_Run], delta: float, n_starts: int,
                  extra_starts: Iterable[dict] = ()):
    """Multi-start fit; returns (u, objective, converged, n_local_fits)."""
    runs = _stack(runs)
    T = float(runs.S.max())
    cands = []
    for nl in list(_nonlinear_grid(model.form, T)) + list(extra_starts):
        nl = {k: model.fix.get(k, v) for k, v in nl.items()}
        full = _solve_linear(model.form, nl, runs)
        if full is None:
            continue
        full.update(model.fix)
        for n in model.scaled:
            full.setdefault(f"{n}_size_exp", 0.0)
        try:
            th = model.u_of(full)
        except (ValueError, KeyError):
            continue
        lo = np.array([s.lo for s in model.specs])
        hi = np.array([s.hi for s in model.specs])
        th = np.clip(th, lo, hi)
        cands.append((_objective(model, th, runs, delta), th))
    if not cands:
        raise InputError("no valid starting point for the fit (check the data)", field="loss")
    cands.sort(key=lambda c: c[0])
    th, f, ok, i = _minimize(model, np.array([c[1] for c in cands[:n_starts]]), runs, delta)
    return th[i], float(f[i]), bool(ok[i]), min(n_starts, len(cands))


# ------------------------------------------------------------------------------- results


@dataclass
class CurveLaw(LawResult, forms=tuple(FORMS)):
    """A fitted schedule-aware curve law (form ``mpl`` or ``momentum``); see the module doc.
    What it shares with every law (intervals, band, report layout, law.json envelope) is
    fit.result.LawResult's; what is its own: ``predict`` takes a schedule, and law.json holds
    its LR unit, size scaling and bootstrap draws."""

    form: str
    params: dict[str, float]
    lr_scale: float
    metric: str | None = None
    scaled: tuple[str, ...] = ()
    size_variable: str | None = None
    size_ref: float | None = None
    fixed: dict[str, float] = field(default_factory=dict)
    draws: list[dict[str, float]] = field(default_factory=list)
    sigma: float = float("nan")
    level: float = 0.9
    node_every: int | None = None
    diagnostics: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    created: str | None = None
    conventions: dict | None = None
    tool_version: str | None = None

    def __post_init__(self):
        from ladder import __version__
        from ladder.counting import conventions

        self.created = self.created or _dt.datetime.now(_dt.timezone.utc).isoformat(
            timespec="seconds")
        self.conventions = self.conventions or conventions()
        self.tool_version = self.tool_version or __version__

    @property
    def expression(self) -> str:
        return EXPRESSIONS[self.form]

    @property
    def intervals(self) -> dict:
        """name -> [lo, hi]: percentiles of the bootstrap draws at ``level`` (none with fewer
        than 2 draws)."""
        if len(self.draws) < 2:
            return {}
        return {k: [float(v) for v in percentile_interval(np.array([d[k] for d in self.draws]),
                                                            self.level)] for k in self.params}

    @property
    def identifiability(self) -> dict:
        """Parameters the curves do not pin down (see ``_identifiability``); recomputed from
        the estimate and the draws, so law.json files that predate the flags have them too."""
        return _identifiability(self._model(), self.diagnostics.get("at_bounds") or (),
                                self.intervals, self.level)

    def diagnostics_json(self) -> dict:
        return dict(self.diagnostics, identifiability=self.identifiability)

    # -- evaluation ---------------------------------------------------------------------
    def _model(self) -> _Model:
        return _Model(self.form, self.scaled, self.size_ref, self.fixed)

    def _size(self, params, active_params) -> float | None:
        if self.size_ref is None:
            return None
        value = {"active_params": active_params, "params": params}[self.size_variable]
        if value is None:
            raise InputError(f"this law scales with {self.size_variable}; give --"
                             f"{self.size_variable.replace('_', '-')}",
                             field=self.size_variable)
        if not (np.isfinite(value) and value > 0):
            raise InputError(f"must be > 0, got {value!r}", field=self.size_variable)
        return float(value)

    def predict(self, *, lr=None, schedule=None, steps: int | None = None,
                peak_lr: float | None = None, at_steps=None, fraction=None,
                params: float | None = None, active_params: float | None = None,
                level: float | None = None, tokens=None, compute=None,
                seed: int = 0) -> Prediction:
        """Predicted curve with a band.

        The schedule: ``lr`` (LR of every update, ``lr[s-1]`` for update ``s``), or ``schedule``
        (a :class:`ladder.specs.Schedule` with ``steps`` and ``peak_lr``, a
        :class:`fit.lr_schedules.NamedSchedule`, or a string ``kind:steps=..,peak=..``).
        Where: ``at_steps`` (completed steps), or ``fraction`` of the schedule's length, default
        every 1% of it. Size: ``active_params`` or ``params`` (whichever the law scales with).
        ``tokens``/``compute`` are not inputs of a curve law (they follow from the schedule).
        """
        from ladder.specs import Schedule

        if compute is not None and params is None and active_params is None \
                and self.size_ref is not None:
            raise InputError(f"a curve law takes the target size as {self.size_variable}, "
                             "not compute", field="compute")
        if lr is None:
            if schedule is None:
                raise InputError("a curve law needs the LR schedule (lr= or schedule=)",
                                 field="schedule")
            if isinstance(schedule, str):
                schedule = parse_schedule(schedule)
            if isinstance(schedule, Schedule):
                if steps is None or peak_lr is None:
                    raise InputError("a Schedule needs steps= and peak_lr=", field="schedule")
                schedule = NamedSchedule(schedule, int(steps), float(peak_lr))
            if not isinstance(schedule, NamedSchedule):
                raise InputError(f"unsupported schedule {type(schedule).__name__}",
                                 field="schedule")
            lr = schedule.lr()
        lr = np.asarray(lr, float)
        if lr.ndim != 1 or lr.size == 0 or not np.all(np.isfinite(lr)) or np.any(lr < 0):
            raise InputError("LR sequence must be finite, non-negative and non-empty", field="lr")
        n = lr.size
        if at_steps is None:
            if fraction is None:
                fraction = np.arange(1, 101) / 100.0
            fr = np.atleast_1d(np.asarray(fraction, float))
            if np.any(~np.isfinite(fr)) or np.any(fr <= 0) or np.any(fr > 1):
                raise InputError("must be in (0, 1]", field="fraction")
            at_steps = np.maximum(1, np.round(fr * n)).astype(np.int64)
        at = np.atleast_1d(np.asarray(at_steps))
        if at.size == 0 or np.any(at < 1) or np.any(at > n) or np.any(at != np.round(at)):
            raise InputError(f"steps must be integers in [1, {n}]", field="step")
        at = at.astype(np.int64)
        level = self.level if level is None else float(level)
        if not 0 < level < 1:
            raise InputError(f"must be in (0, 1), got {level}", field="level")
        size = self._size(params, active_params)

        m = self._model()
        run = _design("predict", lr, at, None, size or 1.0, self.lr_scale, self.node_every)

        def curve_for(values):
            p = m.run_params(values, size) if m.scaled else {s.name: values[s.name]
                                                             for s in m.base}
            return _curve(self.form, p, run)

        center = curve_for(self.params)
        lo = np.full(center.shape, np.nan)
        hi = np.full(center.shape, np.nan)
        if len(self.draws) >= 2 and np.isfinite(self.sigma):
            logs = np.array([_safe_log(curve_for(d)) for d in self.draws])   # (B, n)
            rng = np.random.default_rng(seed)
            z = rng.standard_normal((logs.shape[0], 64)) * self.sigma
            sims = (logs[:, None, :] + z[:, :, None]).reshape(-1, logs.shape[1])
            q = (1 - level) / 2
            lo = np.exp(np.quantile(sims, q, axis=0))
            hi = np.exp(np.quantile(sims, 1 - q, axis=0))
        else:
            warnings.warn("curve law has no bootstrap draws (or no residual scale): the band "
                          "cannot be computed and is reported as NaN", stacklevel=2)
        return Prediction(step=at, fraction=at / n, loss=center, lo=lo, hi=hi, level=level)

    # -- artifacts ----------------------------------------------------------------------
    @property
    def band_method(self) -> str:
        """The band's method by name (law.json ``uncertainty.band_method``)."""
        return "bootstrap + residual-rms (monte carlo)"

    def _uncertainty_own(self) -> dict:
        return {"method": "run-level bootstrap (refit from the estimate) + RMS log residual",
                "n_draws": len(self.draws), "draws": [dict(d) for d in self.draws],
                "residual_sigma_log": self.sigma}

    def _json_own(self) -> dict:
        return {
            "fixed": dict(self.fixed),
            "curve": {
                "lr_scale": self.lr_scale, "lr_convention": "lr[s-1] is the LR of update s; "
                "sampled LRs linearly interpolated, linear warmup from 0 before the first sample",
                "warmup": "ends at the first update reaching the maximum LR",
                "node_every": self.node_every, "scaled": list(self.scaled),
                "size_variable": self.size_variable, "size_ref": self.size_ref,
            },
        }

    @classmethod
    def from_json(cls, obj: dict, *, path=None) -> CurveLaw:
        def bad(field_, msg):
            return InputError(msg, path=str(path) if path else "<law>", field=field_)
        form = lawjson.check_envelope(obj, path=path, forms=tuple(FORMS))
        curve = obj.get("curve")
        if not isinstance(curve, dict):
            raise bad("curve", "missing or not an object")
        params = obj.get("params")
        if not isinstance(params, dict):
            raise bad("params", "missing or not an object")
        scaled = tuple(curve.get("scaled") or ())
        need = [p.name for p in FORMS[form]] + [f"{n}_size_exp" for n in scaled]
        for n in need:
            if not isinstance(params.get(n), (int, float)) or isinstance(params.get(n), bool):
                raise bad(f"params.{n}", "missing or not a number")
        try:
            lr_scale = float(curve["lr_scale"])
        except (KeyError, TypeError, ValueError):
            raise bad("curve.lr_scale", "missing or not a number") from None
        unc = obj.get("uncertainty") or {}
        draws = unc.get("draws") or []
        if not isinstance(draws, list) or not all(
                isinstance(d, dict) and all(isinstance(d.get(n), (int, float)) for n in need)
                for d in draws):
            raise bad("uncertainty.draws", "each draw must name every parameter")
        sigma = unc.get("residual_sigma_log")
        sigma = float("nan") if not isinstance(sigma, (int, float)) else float(sigma)
        size_variable = curve.get("size_variable")
        size_ref = curve.get("size_ref")
        if scaled and (size_variable not in SIZE_VARIABLES
                       or not isinstance(size_ref, (int, float))):
            raise bad("curve.size_ref", "a size-scaled law needs size_variable and size_ref")
        level = number(unc.get("level", 0.9), field="uncertainty.level",
                       path=str(path) if path else "<law>", lo=0, hi=1, lo_open=True,
                       hi_open=True)
        order = need + sorted(set(params) - set(need))   # the form's order (files may sort)
        return cls(form=form, params={k: float(params[k]) for k in order},
                   lr_scale=lr_scale, metric=obj.get("metric"), scaled=scaled,
                   size_variable=size_variable if scaled else None,
                   size_ref=float(size_ref) if scaled else None,
                   fixed={k: float(v) for k, v in (obj.get("fixed") or {}).items()},
                   draws=[{k: float(v) for k, v in d.items()} for d in draws], sigma=sigma,
                   level=level, node_every=curve.get("node_every"),
                   diagnostics=obj.get("diagnostics") or {}, inputs=obj.get("inputs") or {},
                   created=obj.get("created"), conventions=obj.get("conventions"),
                   tool_version=obj.get("tool_version"))

    def _report_lines(self) -> list[str]:
        d = self.diagnostics
        lines = [f"schedule: LRs in units of {self.lr_scale:.4g} (the largest LR fitted)"]
        if self.size_ref is not None:
            lines.append(f"size scaling: {', '.join(self.scaled)} are power laws of "
                         f"{self.size_variable} around {self.size_ref:.4g}")
        lines += parameter_lines(self, {k: " (fixed)" for k in self.fixed}, {},
                                 "fix it with --fix NAME=VALUE")

        def g(key):
            v = d.get(key)
            return "n/a" if not isinstance(v, (int, float)) else f"{v:.4g}"
        lines.append(f"solver: summed Huber(delta={d.get('huber_delta')}) on log loss = "
                     f"{g('objective')}; {d.get('n_starts')} starts; best converged: "
                     f"{d.get('converged')}")
        lines.append(f"fit: rmse(log) {g('rms_log_residual')}, mean |rel residual| "
                     f"{g('mean_abs_rel_error')}, residual sigma (log) {self.sigma:.3g}")
        b = d.get("bootstrap") or {"replicates": len(self.draws), "valid": len(self.draws)}
        lines.append(bootstrap_line(b, "whole runs resampled, each distinct resample refitted "
                                       "from the estimate") if len(self.draws) >= 2 else
                     "bootstrap: none (fewer than 2 draws): the band cannot be computed and is "
                     "NaN")
        return lines + auto_lines(d.get("auto"))


# ------------------------------------------------------------------------------ fitting


@dataclass
class CurveData:
    """The runs of a points table, ready for fitting: per run the LR sequence and observations."""

    names: list[str]
    lr: list[np.ndarray]
    steps: list[np.ndarray]
    loss: list[np.ndarray]
    size: list[float | None]


def curve_data_from_table(df, *, size_column: str | None = "active_params",
                          schedules: dict[str, np.ndarray] | None = None,
                          what: str = "points") -> CurveData:
    """Group a points table (``run, step, lr, loss`` [+ size]) into runs.

    Rows with a NaN/empty loss contribute only their LR (e.g. per-step ``optim/lr`` between
    evaluations). ``schedules`` (run -> full per-update LR array) overrides the table's LRs.
    """
    import pandas as pd

    if not isinstance(df, pd.DataFrame):
        raise InputError("expected a pandas DataFrame", field=what)
    need = ["run", "step", "loss"] + ([] if schedules else ["lr"])
    for col in need:
        if col not in df.columns:
            raise InputError("missing column (curve laws need run, step, lr, loss)", field=col)
    if len(df) == 0:
        raise InputError("no rows", field=what)
    step = pd.to_numeric(df["step"], errors="coerce").to_numpy(float)
    loss = pd.to_numeric(df["loss"], errors="coerce").to_numpy(float)
    lr = (pd.to_numeric(df["lr"], errors="coerce").to_numpy(float) if "lr" in df.columns
          else np.full(len(df), np.nan))
    if np.any(~np.isfinite(step)):
        raise InputError("non-numeric or missing step", field="step")
    if np.any(np.isfinite(loss) & (loss <= 0)):
        raise InputError("losses must be > 0", field="loss")
    if np.any(np.isinf(loss)):
        raise InputError("infinite loss (diverged run?)", field="loss")
    # a size column that is entirely empty (a points table of one model size: load_points
    # always carries the column) is no size column: one size needs none
    use_size = size_column is not None and size_column in df.columns and \
        bool(pd.to_numeric(df[size_column], errors="coerce").notna().any())
    sizes_col = (pd.to_numeric(df[size_column], errors="coerce").to_numpy(float)
                 if use_size else None)
    runs = df["run"].astype(str).to_numpy()
    out = CurveData([], [], [], [], [])
    for name in pd.unique(runs):
        idx = np.flatnonzero(runs == name)
        obs = idx[np.isfinite(loss[idx])]
        if obs.size == 0:
            raise InputError(f"run {name!r} has no finite loss", field="loss")
        st = step[obs].astype(np.int64)
        if np.unique(st).size != st.size:
            # last row of a repeated step wins, as ladder.io.read_metrics does
            _, last = np.unique(st[::-1], return_index=True)
            obs = obs[::-1][last]
            st = step[obs].astype(np.int64)
        order = np.argsort(st)
        obs, st = obs[order], st[order]
        if schedules and name in schedules:
            seq = np.asarray(schedules[name], float)
            if seq.size < st.max():
                raise InputError(f"run {name!r}: schedule shorter than its last step",
                                 field="lr")
        else:
            ok = idx[np.isfinite(lr[idx])]
            if ok.size == 0:
                raise InputError(f"run {name!r} has no learning rates", field="lr")
            seq = lr_from_samples(step[ok], lr[ok], until=int(st.max()))
        size = None
        if use_size:
            sv = sizes_col[idx]
            if not np.all(np.isfinite(sv)) or np.any(sv <= 0):
                raise InputError(f"run {name!r}: missing or non-positive size", field=size_column)
            if np.ptp(sv) > 1e-9 * sv.max():
                raise InputError(f"run {name!r}: size changes within the run", field=size_column)
            size = float(sv[0])
        out.names.append(str(name))
        out.lr.append(seq)
        out.steps.append(st)
        out.loss.append(loss[obs])
        out.size.append(size)
    return out


def fit_curve_law(df, form: str = "mpl", bootstrap: int = 200, level: float = 0.9,
                  seed: int = 0, *, metric: str | None = None, fix: dict | None = None,
                  size_column: str | None = "active_params", scaled: Sequence[str] = ("L0", "A"),
                  schedules: dict[str, np.ndarray] | None = None, n_starts: int = 4,
                  node_every: int | None = None, huber_delta: float = HUBER_DELTA) -> CurveLaw:
    """Fit a curve law (``form`` "mpl" or "momentum") on the whole curves of a points table.

    ``df``: columns ``run, step, lr, loss`` (+ ``size_column`` for several model sizes); see
    :func:`curve_data_from_table`. ``fix``: parameter values held fixed (natural units, LRs in
    units of the largest LR of the data). ``scaled``: parameters that become power laws of size
    when the table holds more than one size. ``bootstrap``: run-level bootstrap draws for bands.
    """
    with _single_thread_blas():
        return _fit_curve_law(df, form, bootstrap, level, seed, metric=metric, fix=fix,
                              size_column=size_column, scaled=scaled, schedules=schedules,
                              n_starts=n_starts, node_every=node_every, huber_delta=huber_delta)


def _fit_curve_law(df, form, bootstrap, level, seed, *, metric, fix, size_column, scaled,
                   schedules, n_starts, node_every, huber_delta) -> CurveLaw:
    if form not in FORMS:
        raise InputError(f"unknown curve form {form!r}; choose one of {sorted(FORMS)}",
                         field="form")
    if not 0 < level < 1:
        raise InputError(f"must be in (0, 1), got {level}", field="level")
    if bootstrap < 0:
        raise InputError("must be >= 0", field="bootstrap")
    bad = sorted(set(scaled) - set(_LINEAR[form]))
    if bad:
        raise InputError(f"only the linear parameters {_LINEAR[form]} can scale with size, "
                         f"not {bad[0]!r}", field="scaled")
    data = curve_data_from_table(df, size_column=size_column, schedules=schedules)
    lr_scale = float(max(seq.max() for seq in data.lr))
    if not lr_scale > 0:
        raise InputError("all learning rates are zero", field="lr")
    sizes = sorted({s for s in data.size if s is not None})
    multi = len(sizes) > 1
    size_ref = float(np.exp(np.mean(np.log(sizes)))) if multi else None
    runs = [_design(n, lr, t, y, s or 1.0, lr_scale, node_every)
            for n, lr, t, y, s in zip(data.names, data.lr, data.steps, data.loss, data.size)]
    fix = dict(fix or {})
    model = _Model(form, scaled if multi else (), size_ref, fix)
    n_points = int(sum(r.t.size for r in runs))
    if n_points <= len(model.free):
        raise InputError(f"{n_points} points cannot determine {len(model.free)} parameters",
                         field="loss")

    diagnostics: dict[str, Any] = {"sizes": sizes}
    stacked = _stack(runs)
    if not multi:
        u, obj, ok, n_local = _fit_one_size(model, stacked, huber_delta, n_starts)
    else:
        # stage 1: each size on its own (shape parameters free per size)
        per_size, starts = {}, []
        m1 = _Model(form, (), None, {k: v for k, v in fix.items() if not k.endswith("_size_exp")})
        for s in sizes:
            rs = [r for r in runs if r.size0 == s]
            th, o, k_ok, _ = _fit_one_size(m1, rs, huber_delta, max(1, n_starts // 2))
            per_size[s] = m1.values(th)
        diagnostics["per_size"] = [dict(size=s, **v) for s, v in per_size.items()]
        # stage 2: scaled params as power laws of size (regression of the per-size fits), shape
        # params from each size's fit in turn, then one joint fit
        logn = np.log(np.array(sizes) / size_ref)
        reg = {}
        for n in model.scaled:
            yv = np.log([per_size[s][n] for s in sizes])
            slope, icpt = np.polyfit(logn, yv, 1)
            reg[n] = (float(np.exp(icpt)), float(np.clip(slope, _SIZE_EXP.lo, _SIZE_EXP.hi)))
        for s in sizes:
            v = dict(per_size[s])
            for n in model.scaled:
                v[n], v[f"{n}_size_exp"] = reg[n]
            v.update(fix)
            starts.append(v)
        lo = np.array([p.lo for p in model.specs])
        hi = np.array([p.hi for p in model.specs])
        cands = sorted(((_objective(model, np.clip(model.u_of(v), lo, hi), stacked,
                                    huber_delta),
                         np.clip(model.u_of(v), lo, hi)) for v in starts),
                       key=lambda c: c[0])
        th, f, conv, i = _minimize(model, np.array([c[1] for c in cands[:max(1, n_starts // 2)]]),
                                   stacked, huber_delta)
        u, obj, ok = th[i], float(f[i]), bool(conv[i])
        n_local = len(cands)

    values = model.values(u)
    resid = (_safe_log(_curve(form, model.run_params(values, stacked.size), stacked))
             - np.log(stacked.y))
    dof = max(1, resid.size - len(model.free))
    sigma = float(np.sqrt(np.sum(resid ** 2) / dof))
    at_bounds = [model.names[i] for i in model.free
                 if min(u[i] - model.specs[i].lo, model.specs[i].hi - u[i]) < 1e-6]
    diagnostics.update(objective=obj, converged=ok, at_bounds=at_bounds, n_starts=n_local,
                       huber_delta=huber_delta, rms_log_residual=float(np.sqrt(np.mean(resid**2))),
                       mean_abs_rel_error=float(np.mean(np.abs(np.expm1(resid)))))

    draws, boot_info = _bootstrap(model, runs, u, bootstrap, seed, huber_delta, multi)
    if bootstrap and len(draws) < 2:
        warnings.warn("run-level bootstrap impossible (too few runs or sizes): bands are NaN",
                      stacklevel=2)
    diagnostics["n_bootstrap_ok"] = len(draws)
    diagnostics["bootstrap"] = boot_info
    import pandas as pd
    inputs = {"sha256": sha256_of(pd.DataFrame(df).astype(str).to_dict(orient="list")),
              "n_points": n_points, "n_runs": len(runs), "runs": data.names}
    return CurveLaw(form=form, params=values, lr_scale=lr_scale, metric=metric,
                    scaled=model.scaled, size_variable=size_column if multi else None,
                    size_ref=size_ref, fixed={k: float(v) for k, v in fix.items()}, draws=draws,
                    sigma=sigma, level=level, node_every=node_every, diagnostics=diagnostics,
                    inputs=inputs)


def _identifiability(model: _Model, at_bounds, intervals: dict, level: float) -> dict:
    """Parameters the curves do not pin down, with why (fit.result.LawResult.identifiability):
    the estimate at a bound of its range, or its bootstrap interval reaching one (a flat
    direction: the replicates run to the edge, as B and beta do on curves without a decay)."""
    flags: dict[str, list[str]] = {}
    for i in model.free:
        spec, why = model.specs[i], []
        if spec.name in at_bounds:
            why.append("estimate at a bound of its range")
        iv = intervals.get(spec.name)
        if iv is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                th = []
                for v in iv:
                    try:
                        th.append(spec.to_u(v))
                    except ValueError:
                        th.append(math.nan)
            for b in (spec.lo, spec.hi):
                if any(abs(t - b) < 1e-6 for t in th):
                    why.append(f"its {level:.0%} interval reaches the bound "
                               f"{spec.to_display(b):.3g} of its range")
        if why:
            flags[spec.name] = why
    return {"flags": flags, "unidentified": sorted(flags)}


def _bootstrap(model: _Model, runs: list[_Run], u: np.ndarray, n: int, seed: int,
               delta: float, multi: bool) -> list[dict]:
    """Run-level bootstrap: resample whole runs, refit from the estimate (once per distinct
    multiset of runs). For a size-scaled law
    a draw must keep more distinct sizes than it has size exponents (else the exponents are an
    exact interpolation of two points and extrapolate wildly: with 4 rungs and 2-size draws the
    90% band of a 3.6x extrapolation reached +120%, measured on synthetic ladders); such draws
    are redrawn, up to 50 times each. (draws, the record report() and law.json show: the
    Chinchilla family's keys, fit.estimate._bootstrap)."""
    t0 = time.perf_counter()
    info = {"replicates": int(n), "valid": 0, "degenerate": int(n), "not_converged": 0,
            "seed": int(seed), "resampled": "runs"}
    if n <= 0 or len(runs) < 2:
        return [], info
    need = len(model.scaled) + 1 if multi else 1
    if multi and len({r.size0 for r in runs}) < need:
        return [], info
    rng = np.random.default_rng(seed)
    counts = run_weights(rng, len(runs), n, bayesian=False,
                         accept=lambda pick: len({runs[i].size0 for i in pick}) >= need)
    # a replicate is a multiset of runs: the same multiset is the same refit, so each distinct
    # one is fitted once (3 runs of one size have only 10 multisets: 200 replicates cost 10
    # refits instead of 200, with identical draws); all of them at once (fit.solver's batched
    # L-BFGS), each from the estimate
    keys = [tuple(np.repeat(np.arange(len(runs)), c.astype(int))) for c in counts]
    distinct = sorted(set(keys))
    if not distinct:
        return [], info
    # each distinct run of a replicate evaluated once, its points weighted by its count (the
    # same objective as stacking the copies; a third less work on 3 runs)
    picked = [np.unique(key, return_counts=True) for key in distinct]
    th, _f, _ok, _i = _minimize(
        model, np.tile(u, (len(distinct), 1)), [[runs[i] for i in idx] for idx, _ in picked],
        delta, per_row=True, max_iter=BOOT_MAX_ITER, ftol=BOOT_FTOL,
        weights=[np.concatenate([np.full(runs[i].t.size, float(c)) for i, c in zip(idx, cnt)])
                 for idx, cnt in picked])
    fitted = {key: model.values(th[j]) for j, key in enumerate(distinct)}
    stopped = {key for j, key in enumerate(distinct) if not _ok[j]}
    # a refit that stopped at BOOT_MAX_ITER is kept, as it always was (a replicate of one or two
    # schedules has a flat direction; see BOOT_FTOL), and counted
    info.update(valid=len(keys), degenerate=int(n) - len(keys),
                not_converged=sum(key in stopped for key in keys),
                distinct_refits=len(distinct), seconds=round(time.perf_counter() - t0, 3))
    return [dict(fitted[key]) for key in keys], info


def schedules_from_sources(sources) -> dict[str, np.ndarray]:
    """Exact per-update LRs of the ladder runs below ``sources`` (run directories or folders of
    them; other sources, e.g. CSV tables, give nothing), keyed as :func:`fit.load_points` names
    runs (``LADDER/RUNG``). Rebuilt from each run's ``config.json`` exactly as the trainer builds
    its LR table (``ladder.lrtable``: peak LR x ``Schedule.lr_frac(i, steps)`` for 0-based
    update i, with the ``lr-spike`` fault applied), so that fits need not interpolate the
    ``optim/lr`` values logged only at evaluation steps."""
    from pathlib import Path

    from ladder.runs import read_runs

    out: dict[str, np.ndarray] = {}
    for src in sources if isinstance(sources, (list, tuple)) else [sources]:
        if not Path(src).is_dir():
            continue
        for run in read_runs(src, metrics=False):
            if run.rung is not None and run.metrics_path.is_file():
                out[run.key] = run.lr_table()
    return out


# --------------------------------------------------------------------- forecasts, the CLI


def load_curve_law(path, metric: str | None = None) -> CurveLaw:
    """A law.json file that must hold a curve law (the one reader, fit.law.load_law; of a
    multi-metric file, the law of ``metric``)."""
    from fit.lawjson import select, within
    from ladder.io import read_json

    obj, prefix = select(read_json(path, schema="law"), path=path, metric=metric)
    try:
        law = LawResult.from_json(obj, path=path)
    except InputError as e:
        raise (within(e, prefix, path) if prefix else e) from None
    if not isinstance(law, CurveLaw):
        raise InputError(f"a {law.form} law predicts at points, not along a schedule: "
                         "--schedule needs a curve law (--form mpl or momentum)", path=path,
                         field="form")
    return law


def predict_schedule_main(args) -> int:
    """``ladder predict law.json --schedule FILE|KIND:k=v,...``: CSV ``step,loss,lo,hi``."""
    import sys

    from fit.lr_schedules import schedule_source

    if getattr(args, "tokens", None) is not None:
        raise InputError("has no meaning with --schedule (the schedule sets the run's length)",
                         field="--tokens", exit_code=64)
    law = load_curve_law(args.law, metric=getattr(args, "metric", None))
    at, lr = schedule_source(args.schedule)
    fraction = getattr(args, "fraction", None)
    if fraction is not None:
        at = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pred = law.predict(lr=lr, at_steps=at, fraction=fraction,
                           params=getattr(args, "params", None),
                           active_params=getattr(args, "active_params", None),
                           compute=getattr(args, "compute", None),
                           level=getattr(args, "level", None))
    for w in caught:
        print(f"ladder predict: warning: {w.message}", file=sys.stderr)
    sys.stdout.write(pred.to_csv())
    return 0
