"""A fitted schedule-aware curve law (fit.curve_forms, fitted by fit.curve_fit): ``CurveLaw``,
its prediction along a schedule, its law.json fields and report lines.

The band: the bootstrap draws plus the RMS log residual as noise, by Monte Carlo in log space;
fewer than 2 draws: a NaN band with a warning, never a zero-width one.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

import ladder.fit.lawjson as lawjson
from ladder.fit.curve_forms import (EXPRESSIONS, FORMS, SIZE_VARIABLES, CurveModel, curve,
                                    design, safe_log)
from ladder.fit.identify import identifiability
from ladder.fit.lr_schedules import NamedSchedule, parse_schedule
from ladder.fit.prediction import Prediction, Query
from ladder.fit.report import auto_lines, bootstrap_line, parameter_lines
from ladder.fit.result import LawResult, stamp
from ladder.fit.solver import percentile_interval
from ladder.io import InputError, number

MC_SEED = 0   # the band's Monte Carlo draws: the same band for the same law and query


@dataclass(repr=False)  # LawResult's short repr, not every field
class CurveLaw(LawResult, forms=tuple(FORMS)):
    """A fitted curve law (``mpl`` or ``momentum``): ``predict`` takes a schedule; law.json
    holds its LR unit, size scaling and bootstrap draws."""

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
    # a planned run's schedule for queries without one (:meth:`on`); not in law.json
    plan: NamedSchedule | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        for k, v in stamp(self.created, self.conventions, self.tool_version).items():
            setattr(self, k, v)

    @property
    def expression(self) -> str:
        return EXPRESSIONS[self.form]

    @property
    def intervals(self) -> dict:
        """name -> [lo, hi]: the draws' percentiles at ``level`` (none below 2 draws)."""
        if len(self.draws) < 2:
            return {}
        return {k: [float(v) for v in percentile_interval(np.array([d[k] for d in self.draws]),
                                                            self.level)] for k in self.params}

    @property
    def identifiability(self) -> dict:
        """Parameters the curves do not pin down, recomputed from the estimate and the draws
        (so law.json files before the flags have them too)."""
        m = self._model()
        at = set(self.diagnostics.get("at_bounds") or ())
        return identifiability([m.specs[i] for i in m.free], self.intervals, self.level,
                               estimate={n: ["estimate at a bound of its range"] for n in at})

    def diagnostics_json(self) -> dict:
        return dict(self.diagnostics, identifiability=self.identifiability)

    # -- evaluation ---------------------------------------------------------------------
    def _model(self) -> CurveModel:
        return CurveModel(self.form, self.scaled, self.size_ref, self.fixed)

    def _size(self, params, active_params) -> float | None:
        if self.size_ref is None:
            return None
        value = {"active_params": active_params, "params": params}[self.size_variable]
        if value is None:
            raise InputError(f"this law scales with {self.size_variable}; give --"
                             f"{self.size_variable.replace('_', '-')}",
                             field=self.size_variable)
        v = np.unique(np.asarray(value, dtype=float))   # one run's size, maybe repeated
        if v.size != 1 or not (np.isfinite(v[0]) and v[0] > 0):
            raise InputError(f"one size > 0, got {value!r}", field=self.size_variable)
        return float(v[0])

    def on(self, plan: NamedSchedule) -> CurveLaw:
        """This law with ``plan`` (a planned run's NamedSchedule, with its tokens per step)
        answering queries without a schedule (the forecaster's). Not written to law.json."""
        return replace(self, plan=plan)

    def _predict(self, q: Query, *, level, extra_log_sigma, extrapolation) -> Prediction:
        """Predicted curve with a band (no extrapolation term of its own). The schedule:
        ``q.schedule`` (every update's LR, a NamedSchedule, or ``kind:steps=..,peak=..``), else
        the plan (:meth:`on`); where: ``q.step`` or ``q.fraction`` (default every 1%). With a
        planned schedule, ``tokens`` so far at ``fraction`` set the run's length."""
        if q.compute is not None and q.params is None and q.active_params is None \
                and self.size_ref is not None:
            raise InputError(f"a curve law takes the target size as {self.size_variable}, "
                             "not compute", field="compute")
        level = self.level if level is None else float(level)
        if not 0 < level < 1:
            raise InputError(f"must be in (0, 1), got {level}", field="level")
        schedule = self.plan if q.schedule is None else q.schedule
        if schedule is None:
            raise InputError("a curve law needs the LR schedule (schedule=)", field="schedule")
        if isinstance(schedule, str):
            schedule = parse_schedule(schedule)
        size = self._size(q.params, q.active_params)
        if isinstance(schedule, NamedSchedule) and schedule.tokens_per_step is not None \
                and q.tokens is not None and q.step is None:
            return self._along_plan(schedule, q, size, level, extra_log_sigma)
        if isinstance(schedule, NamedSchedule):
            lr = schedule.lr()
        elif isinstance(schedule, (np.ndarray, list, tuple)):
            lr = np.asarray(schedule, float)
        else:
            raise InputError(f"unsupported schedule {type(schedule).__name__}", field="schedule")
        return self._along(lr, q.step, q.fraction, size, level, extra_log_sigma)

    def _along_plan(self, plan, q, size, level, extra_log_sigma) -> Prediction:
        """The planned run at ``q.fraction`` (default its end), ``tokens / fraction /
        tokens_per_step`` steps long (a shortened run keeps the schedule's shape)."""
        g = np.atleast_1d(np.asarray(1.0 if q.fraction is None else q.fraction, float))
        total = np.broadcast_to(np.asarray(q.tokens, float), g.shape) / np.maximum(g, 1e-12)
        steps = np.maximum(1, np.rint(total / plan.tokens_per_step)).astype(np.int64)
        loss, lo, hi = (np.full(g.shape, np.nan) for _ in range(3))
        step_out = np.zeros(g.shape, dtype=np.int64)
        for n in np.unique(steps):
            idx = np.flatnonzero(steps == n)
            lr = NamedSchedule(plan.schedule, int(n), plan.peak).lr()
            p = self._along(lr, None, g[idx], size, level, extra_log_sigma)
            loss[idx], lo[idx], hi[idx], step_out[idx] = p.loss, p.lo, p.hi, p.step
        return Prediction(step=step_out, fraction=g, loss=loss, lo=lo, hi=hi, level=level)

    def _along(self, lr, at_steps, fraction, size, level, extra_log_sigma) -> Prediction:
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

        m = self._model()
        run = design("predict", lr, at, None, size or 1.0, self.lr_scale, self.node_every)

        def curve_for(values):
            return curve(self.form, m.run_params(values, size), run)

        center = curve_for(self.params)
        lo = np.full(center.shape, np.nan)
        hi = np.full(center.shape, np.nan)
        if len(self.draws) >= 2 and np.isfinite(self.sigma):
            logs = np.array([safe_log(curve_for(d)) for d in self.draws])   # (B, n)
            rng = np.random.default_rng(MC_SEED)
            extra = np.broadcast_to(np.asarray(extra_log_sigma, float), center.shape)
            # the residual sigma, with eval noise in quadrature
            sd = self.sigma if not np.any(extra) else np.sqrt(self.sigma ** 2 + extra ** 2)
            z = rng.standard_normal((logs.shape[0], 64))
            noise = z * sd if np.ndim(sd) == 0 else z[:, :, None] * sd
            sims = (logs[:, None, :] + (noise[:, :, None] if np.ndim(sd) == 0 else noise)
                    ).reshape(-1, logs.shape[1])
            q = (1 - level) / 2
            lo = np.exp(np.quantile(sims, q, axis=0))
            hi = np.exp(np.quantile(sims, 1 - q, axis=0))
        else:
            warnings.warn("curve law has no bootstrap draws (or no residual scale): the band "
                          "cannot be computed and is reported as NaN", stacklevel=4)
        return Prediction(step=at, fraction=at / n, loss=center, lo=lo, hi=hi, level=level)

    # -- artifacts ----------------------------------------------------------------------
    @property
    def band_method(self) -> str:
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
        obj = lawjson.upgrade(obj, path=path)
        form = lawjson.check_envelope(obj, path=path, forms=tuple(FORMS))
        for key in ("curve", "params"):
            if not isinstance(obj.get(key), dict):
                raise bad(key, "missing or not an object")
        curve, params = obj["curve"], obj["params"]
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
        lines += parameter_lines(self, {}, "fix it with --fix NAME=VALUE")

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
