"""Fitting the schedule-aware curve laws (fit.curve_forms) on whole curves: ``fit_curve_law``
on a points table of ``run, step, lr, loss`` (+ a size column).

Huber (delta 1e-3) of log residuals, summed (Besiroglu et al. 2024: averaging stops L-BFGS
early); starts from a grid over the nonlinear parameters with the linear ones solved by
non-negative least squares, the best few polished by fit.solver's batched L-BFGS within bounds.
The band's draws: a run-level bootstrap (:func:`_bootstrap`; the band itself: fit.curve_law).

With runs of several sizes the ``scaled`` parameters (default L0, A) are power laws of size and
the shape parameters shared; the joint fit starts from per-size fits (``diagnostics.per_size``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ladder.fit.config import HUBER_DELTA
from ladder.fit.curve_forms import (FORMS, LINEAR, SIZE_EXP, CurveModel, RunDesign, components,
                                    curve, curve_grad, design, safe_log, stack)
from ladder.fit.curve_law import CurveLaw
from ladder.fit.lr_schedules import lr_from_samples
from ladder.fit.solver import Refits, polish, run_bootstrap
from ladder.io import InputError, sha256_of


def _huber(r: np.ndarray, delta: float) -> np.ndarray:
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


def _objective(model: CurveModel, u: np.ndarray, runs, delta: float) -> float:
    run = stack(runs)
    pred = curve(model.form, model.run_params(model.values(u), run.size), run)
    tot = float(_huber(safe_log(pred) - np.log(run.y), delta).sum())
    return tot if math.isfinite(tot) else 1e300


def _objective_grad(model: CurveModel, u: np.ndarray, runs, delta: float,
                    eps: float = 1e-6, weights: np.ndarray | None = None
                    ) -> tuple[float, np.ndarray]:
    """The summed Huber objective and its exact gradient in u; ``weights``: one per point."""
    run = stack(runs)
    v = model.values(u)
    g = np.zeros(len(model.specs))
    index = {n: i for i, n in enumerate(model.names)}
    p = model.run_params(v, run.size)
    pred, d = curve_grad(model.form, p, run)
    r = safe_log(pred, eps) - np.log(run.y)
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


# The stopping test (fit.solver.lbfgs): a relative decrease below FIT_FTOL on two successive
# iterations, or max |projected gradient| below FIT_GTOL (scipy's absolute 1e-15 made relative to
# f; docs/LOG.md, 2026-12-01: the same held-out errors on Luo et al.'s curves).
FIT_FTOL = 1e-12
FIT_GTOL = 1e-12
FIT_MAX_ITER = 3000
# Bootstrap refits to the same tolerance (at 1e-9 one of Luo et al.'s 25M refits stopped early);
# a replicate of one or two schedules has a flat valley and stops at BOOT_MAX_ITER (docs/LOG.md)
BOOT_FTOL = FIT_FTOL
BOOT_MAX_ITER = 500


def _minimize(model: CurveModel, u0: np.ndarray, runs, delta: float, *,
              per_row: bool = False, weights=None, max_iter: int = FIT_MAX_ITER,
              ftol: float = FIT_FTOL):
    """Polish every row of ``u0`` (S, P) at once within the bounds, on ``runs`` or, ``per_row``,
    on ``runs[row]`` weighted by ``weights[row]``: (u, objective, converged, index of the best)."""
    u0 = np.atleast_2d(np.asarray(u0, dtype=float))
    rows_runs = [stack(r) for r in runs] if per_row else [stack(runs)] * len(u0)
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
    """Run OpenBLAS single-threaded inside the block (or the decorated function, each call
    afresh): the fits' BLAS calls are tiny, and threads made a bootstrap refit take 3.5x the CPU
    on 2 cores. Linux, OpenBLAS only; anything unexpected -> no change."""
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


def _nonlinear_grid(form: str, T: float) -> list[dict]:
    """The starts of the nonlinear parameters (the linear ones: :func:`_solve_linear`)."""
    if form == "mpl":
        return [{"alpha": a, "beta": b, "gamma": g, "C": c / T}
                for a in (0.2, 0.35, 0.5, 0.8) for b in (0.3, 0.6, 1.2) for g in (0.2, 0.5, 0.8)
                for c in (3.0, 30.0, 300.0, 3000.0)]
    return [{"alpha": a, "lam": 1.0 - q} for a in (0.15, 0.25, 0.4, 0.6, 0.9)
            for q in (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2)]


def _solve_linear(form: str, nl: dict, runs: Sequence[RunDesign]) -> dict | None:
    """Non-negative least squares (relative errors) for the linear parameters of one size."""
    from scipy.optimize import nnls

    p = dict(nl, L0=1.0, A=1.0, B=1.0, C=nl.get("C", 1.0))
    run = stack(runs)
    f1, f2 = components(form, p, run)
    M, b = np.c_[np.ones_like(f1), f1, -f2] / run.y[:, None], np.ones_like(run.y)
    if not np.all(np.isfinite(M)):
        return None
    scale = np.maximum(np.abs(M).max(axis=0), 1e-300)
    coef, _ = nnls(M / scale, b)
    return dict(nl, **{n: max(float(c), 1e-12) for n, c in zip(LINEAR[form], coef / scale)})


def _fit_one_size(model: CurveModel, runs: Sequence[RunDesign], delta: float, n_starts: int):
    """Multi-start fit; returns (u, objective, converged, n_local_fits)."""
    runs = stack(runs)
    T = float(runs.S.max())
    cands = []
    for nl in _nonlinear_grid(model.form, T):
        nl = {k: model.fix.get(k, v) for k, v in nl.items()}
        full = _solve_linear(model.form, nl, runs)
        if full is None:
            continue
        full.update(model.fix)
        for n in model.scaled:
            full.setdefault(f"{n}_size_exp", 0.0)
        try:
            th = model.clip(model.u_of(full))
        except (ValueError, KeyError):
            continue
        cands.append((_objective(model, th, runs, delta), th))
    if not cands:
        raise InputError("no valid starting point for the fit (check the data)", field="loss")
    cands.sort(key=lambda c: c[0])
    th, f, ok, i = _minimize(model, np.array([c[1] for c in cands[:n_starts]]), runs, delta)
    return th[i], float(f[i]), bool(ok[i]), min(n_starts, len(cands))


@dataclass
class CurveData:
    """The runs of a points table, ready for fitting: per run the LR sequence and observations."""

    names: list[str]
    lr: list[np.ndarray]
    steps: list[np.ndarray]
    loss: list[np.ndarray]
    size: list[float | None]


def curve_data_from_table(df, *, size_column: str | None = "active_params",
                          schedules: dict[str, np.ndarray] | None = None) -> CurveData:
    """Group a points table (``run, step, lr, loss`` [+ size]) into runs; rows without a loss
    give only their LR. ``schedules`` (run -> per-update LRs) overrides the table's LRs."""
    import pandas as pd

    if not isinstance(df, pd.DataFrame):
        raise InputError("expected a pandas DataFrame", field="points")
    need = ["run", "step", "loss"] + ([] if schedules else ["lr"])
    for col in need:
        if col not in df.columns:
            raise InputError("missing column (curve laws need run, step, lr, loss)", field=col)
    if len(df) == 0:
        raise InputError("no rows", field="points")
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
    # an empty size column (load_points always carries one) is none
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


@_single_thread_blas()
def fit_curve_law(df, form: str = "mpl", bootstrap: int = 200, level: float = 0.9,
                  seed: int = 0, *, metric: str | None = None, fix: dict | None = None,
                  size_column: str | None = "active_params", scaled: Sequence[str] = ("L0", "A"),
                  schedules: dict[str, np.ndarray] | None = None, n_starts: int = 4,
                  node_every: int | None = None, huber_delta: float = HUBER_DELTA) -> CurveLaw:
    """Fit a curve law (``form`` "mpl" or "momentum") on the whole curves of ``df``
    (:func:`curve_data_from_table`). ``fix``: values held fixed (natural units, LRs in units of
    the data's largest); ``scaled``: power laws of size with several sizes; ``bootstrap``: draws."""
    if form not in FORMS:
        raise InputError(f"unknown curve form {form!r}; choose one of {sorted(FORMS)}",
                         field="form")
    if not 0 < level < 1:
        raise InputError(f"must be in (0, 1), got {level}", field="level")
    if bootstrap < 0:
        raise InputError("must be >= 0", field="bootstrap")
    bad = sorted(set(scaled) - set(LINEAR[form]))
    if bad:
        raise InputError(f"only the linear parameters {LINEAR[form]} can scale with size, "
                         f"not {bad[0]!r}", field="scaled")
    data = curve_data_from_table(df, size_column=size_column, schedules=schedules)
    lr_scale = float(max(seq.max() for seq in data.lr))
    if not lr_scale > 0:
        raise InputError("all learning rates are zero", field="lr")
    sizes = sorted({s for s in data.size if s is not None})
    multi = len(sizes) > 1
    size_ref = float(np.exp(np.mean(np.log(sizes)))) if multi else None
    runs = [design(n, lr, t, y, s or 1.0, lr_scale, node_every)
            for n, lr, t, y, s in zip(data.names, data.lr, data.steps, data.loss, data.size)]
    fix = dict(fix or {})
    model = CurveModel(form, scaled if multi else (), size_ref, fix)
    n_points = int(sum(r.t.size for r in runs))
    if n_points <= len(model.free):
        raise InputError(f"{n_points} points cannot determine {len(model.free)} parameters",
                         field="loss")

    diagnostics: dict[str, Any] = {"sizes": sizes}
    stacked = stack(runs)
    if not multi:
        u, obj, ok, n_local = _fit_one_size(model, stacked, huber_delta, n_starts)
    else:
        # stage 1: each size on its own (shape parameters free per size)
        per_size = {}
        m1 = CurveModel(form, (), None,
                        {k: v for k, v in fix.items() if not k.endswith("_size_exp")})
        for s in sizes:
            rs = [r for r in runs if r.size0 == s]
            per_size[s] = m1.values(_fit_one_size(m1, rs, huber_delta, max(1, n_starts // 2))[0])
        diagnostics["per_size"] = [dict(size=s, **v) for s, v in per_size.items()]
        # stage 2: scaled params as power laws of size (regression of the per-size fits), shape
        # params from each size's fit in turn, then one joint fit
        logn = np.log(np.array(sizes) / size_ref)
        reg = {}
        for n in model.scaled:
            yv = np.log([per_size[s][n] for s in sizes])
            slope, icpt = np.polyfit(logn, yv, 1)
            reg[n] = float(np.exp(icpt))
            reg[f"{n}_size_exp"] = float(np.clip(slope, SIZE_EXP.lo, SIZE_EXP.hi))
        us = [model.clip(model.u_of({**per_size[s], **reg, **fix})) for s in sizes]
        cands = sorted(((_objective(model, u, stacked, huber_delta), u) for u in us),
                       key=lambda c: c[0])
        th, f, conv, i = _minimize(model, np.array([c[1] for c in cands[:max(1, n_starts // 2)]]),
                                   stacked, huber_delta)
        u, obj, ok = th[i], float(f[i]), bool(conv[i])
        n_local = len(cands)

    values = model.values(u)
    resid = (safe_log(curve(form, model.run_params(values, stacked.size), stacked))
             - np.log(stacked.y))
    dof = max(1, resid.size - len(model.free))
    sigma = float(np.sqrt(np.sum(resid ** 2) / dof))
    at_bounds = [model.names[i] for i in model.free
                 if min(u[i] - model.specs[i].lo, model.specs[i].hi - u[i]) < 1e-6]
    diagnostics.update(objective=obj, converged=ok, at_bounds=at_bounds, n_starts=n_local,
                       huber_delta=huber_delta, rms_log_residual=float(np.sqrt(np.mean(resid**2))),
                       mean_abs_rel_error=float(np.mean(np.abs(np.expm1(resid)))))

    draws, boot_info = _bootstrap(model, runs, u, bootstrap, seed, huber_delta, multi)
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


def _bootstrap(model: CurveModel, runs: list[RunDesign], u: np.ndarray, n: int, seed: int,
               delta: float, multi: bool) -> tuple[list[dict], dict]:
    """Run-level bootstrap (fit.solver.run_bootstrap) by counts, not Dirichlet weights: a
    replicate is a multiset of whole schedules, refitted once per distinct multiset from the
    estimate. A size-scaled law's draw keeps more sizes than size exponents (else they
    interpolate two points: a +120% band at 3.6x on synthetic ladders). (draws, the record)."""
    need = len(model.scaled) + 1 if multi else 1

    def refit(counts, _rng):
        # each distinct multiset fitted once (3 runs: 10 refits for 200 replicates), all at once
        keys = [tuple(np.repeat(np.arange(len(runs)), c.astype(int))) for c in counts]
        distinct = sorted(set(keys))
        if not distinct:
            return Refits(draws=[], valid=0, degenerate=int(n), not_converged=0,
                          record={"distinct_refits": 0})
        # each distinct run once, its points weighted by its count (as stacking the copies)
        picked = [np.unique(key, return_counts=True) for key in distinct]
        th, _f, ok, _i = _minimize(
            model, np.tile(u, (len(distinct), 1)), [[runs[i] for i in idx] for idx, _ in picked],
            delta, per_row=True, max_iter=BOOT_MAX_ITER, ftol=BOOT_FTOL,
            weights=[np.concatenate([np.full(runs[i].t.size, float(c))
                                     for i, c in zip(idx, cnt)]) for idx, cnt in picked])
        fitted = {key: model.values(th[j]) for j, key in enumerate(distinct)}
        stopped = {key for j, key in enumerate(distinct) if not ok[j]}
        # a refit stopped at BOOT_MAX_ITER is kept (a flat valley, above) and counted
        return Refits(draws=[dict(fitted[key]) for key in keys], valid=len(keys),
                      degenerate=int(n) - len(keys),
                      not_converged=sum(key in stopped for key in keys),
                      record={"distinct_refits": len(distinct)})

    possible = len(runs) >= 2 and (not multi or len({r.size0 for r in runs}) >= need)
    draws, info = run_bootstrap(
        len(runs), n, seed, refit, bayesian=False, possible=possible, usable=2,
        accept=lambda pick: len({runs[i].size0 for i in pick}) >= need,
        without="too few runs or sizes for the band's parameter part: bands are NaN")
    return draws or [], info
