"""A batched L-BFGS: many independent smooth problems (starts x bootstrap replicates) at once.

scipy's L-BFGS-B solves one problem per call (4,500 Chinchilla starts: all call overhead). Here
every row of ``X`` is its own problem with its own history, step and stopping test, the
objective evaluated for all active rows in one call; converged rows leave the active set.

Method (Nocedal & Wright 2006, Alg. 7.4 and 7.5): two-loop recursion with m = 10 pairs, initial
Hessian scaling s'y / y'y, Armijo backtracking (c1 = 1e-4) with a safeguarded quadratic step,
curvature pairs kept only when s'y > 0. Stopping, per row: max |grad| <= gtol, or a relative
decrease of f below ftol on two successive iterations (scipy's factr test, but relative to |f|
itself: the summed Huber objective of a good fit is ~1e-3, far below scipy's floor of 1).

Box bounds make it a projected L-BFGS: a coordinate at a bound with an outward gradient is held,
trial points are clipped, the Armijo test uses the step taken, the stopping test the projected
gradient. Also here, for every law: ``polish`` and the run-level bootstrap (``run_bootstrap``).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

STATUS = ("converged", "max_iter", "line_search", "nonfinite")


@dataclass(frozen=True)
class BatchResult:
    x: np.ndarray          # (S, P)
    f: np.ndarray          # (S,)
    status: np.ndarray     # (S,) index into STATUS
    iterations: np.ndarray  # (S,)

    @property
    def converged(self) -> np.ndarray:
        return self.status == 0


def lbfgs(fg, x0: np.ndarray, *, m: int = 10, max_iter: int = 1000, gtol: float = 1e-9,
          ftol: float = 1e-12, max_ls: int = 40, patience: int = 2,
          bounds: tuple[np.ndarray, np.ndarray] | None = None) -> BatchResult:
    """Minimise each row of ``x0`` independently. ``fg(X, rows) -> (f, G)`` evaluates the
    objective of the problems ``rows`` (an index array) at ``X`` (len(rows), P). A row has
    converged when max |grad| <= gtol or its relative decrease of f stayed <= ftol for
    ``patience`` successive iterations. ``bounds``: (lo, hi), each (P,), the box every row is
    kept in (``x0`` is clipped into it)."""
    x = np.array(x0, dtype=float)
    S, P = x.shape
    if bounds is not None:
        lo, hi = (np.broadcast_to(np.asarray(b, dtype=float), (P,)) for b in bounds)
        x = np.clip(x, lo, hi)

        def held(xr, gr):  # at a bound with the gradient pointing out of the box
            return ((xr <= lo) & (gr > 0)) | ((xr >= hi) & (gr < 0))

        def pgrad(xr, gr):
            return np.where(held(xr, gr), 0.0, gr)
    else:
        def pgrad(xr, gr):
            return gr
    f, g = fg(x, np.arange(S))
    s_hist = np.zeros((S, m, P))
    y_hist = np.zeros((S, m, P))
    rho = np.zeros((S, m))
    status = np.full(S, -1)
    iters = np.zeros(S, dtype=int)
    small = np.zeros(S, dtype=int)  # successive small-decrease iterations
    status[~np.isfinite(f) | ~np.isfinite(g).all(axis=1)] = 3
    status[(status < 0) & (np.abs(pgrad(x, g)).max(axis=1) <= gtol)] = 0
    k = 0
    while True:
        act = np.flatnonzero(status < 0)
        if act.size == 0 or k >= max_iter:
            break
        ga = pgrad(x[act], g[act])
        d = _two_loop(ga, s_hist[act], y_hist[act], rho[act], k, m)
        if bounds is not None:
            d[held(x[act], g[act])] = 0.0
        gd = (ga * d).sum(axis=1)
        bad = ~(gd < 0) | ~np.isfinite(gd)
        if bad.any():  # not a descent direction: restart that row from steepest descent
            d[bad] = -ga[bad]
            gd[bad] = -(ga[bad] ** 2).sum(axis=1)
            rho[act[bad]] = 0.0
        # the first step of a fresh history has unit length, as in scipy's L-BFGS-B (the
        # gradient of a summed Huber objective is ~delta * n, far from unit scale)
        fresh = (rho[act] == 0).all(axis=1)
        t = np.ones(act.size)
        t[fresh] = 1.0 / np.maximum(np.linalg.norm(d[fresh], axis=1), 1e-300)
        x_new = np.empty_like(d)
        f_new = np.empty(act.size)
        g_new = np.empty_like(d)
        pending = np.arange(act.size)
        for _ in range(max_ls):
            xt = x[act[pending]] + t[pending, None] * d[pending]
            if bounds is None:
                decrease = t[pending] * gd[pending]
            else:  # the step actually taken, after clipping into the box
                xt = np.clip(xt, lo, hi)
                decrease = (g[act[pending]] * (xt - x[act[pending]])).sum(axis=1)
            ft, gt = fg(xt, act[pending])
            ok = np.isfinite(ft) & np.isfinite(gt).all(axis=1) & \
                (ft <= f[act[pending]] + 1e-4 * decrease)
            done = pending[ok]
            x_new[done], f_new[done], g_new[done] = xt[ok], ft[ok], gt[ok]
            rest = pending[~ok]
            if rest.size == 0:
                pending = rest
                break
            # safeguarded quadratic interpolation of f along d
            tr, fr = t[rest], ft[~ok]
            denom = 2.0 * (fr - f[act[rest]] - gd[rest] * tr)
            with np.errstate(divide="ignore", invalid="ignore"):
                tq = -gd[rest] * tr * tr / denom
            tq = np.where(np.isfinite(tq), tq, 0.5 * tr)
            t[rest] = np.clip(tq, 0.1 * tr, 0.5 * tr)
            pending = rest
        if pending.size:  # line search failed: keep x
            rows = act[pending]
            # a row with curvature history retries once from steepest descent; a row that was
            # already on steepest descent stops (a stationary point to working precision)
            retry = ~fresh[pending]
            status[rows[~retry]] = 2
            x_new[pending], f_new[pending], g_new[pending] = x[rows], f[rows], g[rows]
            rho[rows[retry]] = 0.0
        s = x_new - x[act]
        y = g_new - g[act]
        sy = (s * y).sum(axis=1)
        slot = k % m
        keep = sy > 1e-12 * np.linalg.norm(s, axis=1) * np.linalg.norm(y, axis=1)
        s_hist[act, slot] = s
        y_hist[act, slot] = y
        rho[act, slot] = np.where(keep, 1.0 / np.where(keep, sy, 1.0), 0.0)
        if pending.size:
            rho[act[pending]] = 0.0
        decrease = f[act] - f_new
        scale = np.maximum(np.abs(f[act]), np.abs(f_new))
        small[act] = np.where(decrease <= ftol * np.maximum(scale, 1e-300), small[act] + 1, 0)
        x[act], f[act], g[act] = x_new, f_new, g_new
        iters[act] += 1
        still = status[act] < 0
        conv = still & ((np.abs(pgrad(x_new, g_new)).max(axis=1) <= gtol)
                        | (small[act] >= patience))
        status[act[conv]] = 0
        nonfin = ~np.isfinite(f_new)
        status[act[nonfin]] = 3
        k += 1
    status[status < 0] = 1
    # a line search that cannot decrease f further at a point whose relative progress had
    # already stalled is converged to working precision
    ls = status == 2
    status[ls & (small >= 1)] = 0
    return BatchResult(x=x, f=f, status=status, iterations=iters)


def polish(fg, cands: np.ndarray, **kw) -> tuple[int, BatchResult]:
    """The last stage of a multi-start fit: every candidate to the tolerances ``kw``, all at
    once; (index of the lowest finite one, the whole result)."""
    r = lbfgs(fg, np.atleast_2d(cands), **kw)
    return int(np.argmin(np.where(np.isfinite(r.f), r.f, np.inf))), r


@dataclass(frozen=True)
class Refits:
    """A law's refits of the bootstrap's replicates: the usable draws in the law's own shape,
    the counts, and the law's own fields of the record."""
    draws: Any
    valid: int
    degenerate: int
    not_converged: int
    record: dict = field(default_factory=dict)


def run_bootstrap(n_runs: int, replicates: int, seed: int,
              refit: Callable[[np.ndarray, np.random.Generator], Refits], *,
              bayesian: bool = True, accept=None, usable: int = 1, possible: bool = True,
              without: str = "") -> tuple[Any, dict]:
    """The run-level bootstrap of every law: ``replicates`` draws of run weights, refitted by
    ``refit(weights, rng)``: (draws, the record law.json shows). Fewer than ``usable`` (or none
    ``possible``): a warning saying what the band does ``without`` them, and None."""
    info = {"replicates": int(replicates), "valid": 0, "degenerate": int(replicates),
            "not_converged": 0, "seed": int(seed), "resampled": "runs"}
    r = None
    if replicates > 0 and possible:
        t0 = time.perf_counter()
        rng = np.random.default_rng(seed)
        r = refit(run_weights(rng, n_runs, replicates, bayesian=bayesian, accept=accept), rng)
        info.update(valid=int(r.valid), degenerate=int(r.degenerate),
                    not_converged=int(r.not_converged), **r.record,
                    seconds=round(time.perf_counter() - t0, 3))
    if replicates > 0 and info["valid"] < usable:
        warnings.warn(f"bootstrap: only {info['valid']} of {replicates} run-level replicates "
                      f"usable; {without}", stacklevel=3)
        return None, info
    return (r.draws if r is not None else None), info


def run_weights(rng: np.random.Generator, n_runs: int, replicates: int, *,
                bayesian: bool = True, accept=None, tries: int = 50) -> np.ndarray:
    """(replicates, n_runs) run weights (points of one run are correlated). ``bayesian``:
    Dirichlet(1, ..., 1) x ``n_runs`` (Rubin 1981: every run keeps a positive weight, so no
    replicate of a 5-run ladder drops to an exact 4-run fit); else multinomial counts, redrawn up
    to ``tries`` times until ``accept(picked run indices)``, else left out."""
    if bayesian:
        return rng.dirichlet(np.ones(n_runs), size=replicates) * n_runs
    out = []
    for _ in range(replicates):
        for _try in range(tries):
            pick = rng.integers(0, n_runs, n_runs)
            if accept is None or accept(pick):
                out.append(np.bincount(pick, minlength=n_runs).astype(float))
                break
    return np.array(out).reshape(len(out), n_runs)


def percentile_interval(draws: np.ndarray, level: float, axis: int = 0) -> list:
    """The central ``level`` percentile interval of bootstrap ``draws`` (along ``axis``)."""
    q = 0.5 + level / 2
    return [np.quantile(draws, 1 - q, axis=axis), np.quantile(draws, q, axis=axis)]


def _two_loop(g, s_hist, y_hist, rho, k, m):
    """H_k g by the L-BFGS two-loop recursion, batched over rows; returns the direction -H g."""
    q = g.copy()
    n = min(k, m)
    order = [(k - 1 - i) % m for i in range(n)]  # newest first
    alphas = []
    for j in order:
        a = rho[:, j] * (s_hist[:, j] * q).sum(axis=1)
        q -= a[:, None] * y_hist[:, j]
        alphas.append(a)
    # initial scaling from the newest kept pair of each row
    gamma = np.ones(len(g))
    found = np.zeros(len(g), dtype=bool)
    for j in order:
        use = ~found & (rho[:, j] > 0)
        if use.any():
            yy = (y_hist[use, j] ** 2).sum(axis=1)
            gamma[use] = 1.0 / (rho[use, j] * yy)
            found |= use
    r = gamma[:, None] * q
    for j, a in zip(reversed(order), reversed(alphas), strict=True):
        b = rho[:, j] * (y_hist[:, j] * r).sum(axis=1)
        r += (a - b)[:, None] * s_hist[:, j]
    return -r
