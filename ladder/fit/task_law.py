"""The downstream-accuracy law (form ``task``): step 1's law of the task loss chained into the
paper's sigmoid (Bhagia et al. 2024, arXiv:2412.04403), fitted by fit.task; below the fitter so
that law.json's reader knows the form.
"""

from __future__ import annotations

import datetime as _dt
import math
import warnings

import numpy as np
from scipy.special import ndtri

import ladder.fit.lawjson as lawjson
from ladder.fit.prediction import Prediction, Query
from ladder.fit.report import parameter_lines
from ladder.fit.result import LawResult
from ladder.io import InputError

FORM = "task"
TASK_SCHEMA = "task-law/1"   # the "task" block of a law.json file of form "task"
NAMES = ("a", "L0", "k", "b")
LOWER = np.array([-1.0, 0.0, 0.0, 0.0])
UPPER = np.array([0.0, np.inf, 1e3, 1.0])
ANCHOR = (0.0, 1.0)   # the paper's "ideal point": zero loss, every answer right
SMOOTH, SKIP = 5, 0.1  # the paper's step-2 settings (moving average 5, first 10% skipped)
N_DRAWS = 4000


def sigmoid(L, a, L0, k, b):
    """acc = a / (1 + exp(-k (L - L0))) + b (Bhagia et al. 2024, eq. 2)."""
    z = np.clip(-k * (np.asarray(L, dtype=float) - L0), -700, 700)
    return a / (1.0 + np.exp(z)) + b


class TaskLaw(LawResult, forms=(FORM,)):
    """Accuracy through task loss: step 1 (any fitted law of the loss) chained into step 2 (the
    sigmoid). ``predict`` takes step 1's inputs and returns the accuracy with its band."""

    def __init__(self, *, via: str, metric: str, step1, theta, boot_theta, resid, ext: dict,
                 loss_range, level: float, intervals: dict | None = None,
                 smooth: int = SMOOTH, skip: float = SKIP, inputs: dict | None = None,
                 diagnostics: dict | None = None, created: str | None = None,
                 tool_version: str | None = None, conventions: dict | None = None):
        self.via, self.metric, self.step1 = via, metric, step1
        self.theta = np.asarray(theta, dtype=float)
        self.boot_theta = np.asarray(boot_theta, dtype=float).reshape(-1, len(NAMES))
        self.resid = np.asarray(resid, dtype=float)
        self.ext = dict(ext)
        self.loss_range = (float(loss_range[0]), float(loss_range[1]))
        self.level = float(level)
        self.intervals = intervals or {n: [math.nan, math.nan] for n in NAMES}
        self.smooth, self.skip = int(smooth), float(skip)
        self.inputs = inputs or {}
        self.diagnostics = diagnostics or {}
        self.created = created or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        self.tool_version = tool_version or step1.tool_version
        self.conventions = conventions or step1.conventions

    form = FORM

    @property
    def params(self) -> dict:
        return dict(zip(NAMES, map(float, self.theta), strict=True))

    @property
    def expression(self) -> str:
        return (f"acc = a / (1 + exp(-k ({self.via} - L0))) + b;  {self.via} = "
                f"{self.step1.form} law: {self.step1.expression}")

    @property
    def band_method(self) -> str:
        return "step-1 band x step-2 bootstrap + residual + extrapolation (monte carlo)"

    def accuracy(self, loss):
        """Step 2 alone: the accuracy the sigmoid gives a task loss."""
        return sigmoid(loss, *self.theta)

    def predict_loss(self, level: float | None = None, **inputs) -> Prediction:
        """Step 1 alone: the task loss at ``inputs`` (step 1's keywords)."""
        return self.step1.predict(level=level or self.level, **inputs)

    def predict(self, query: Query | None = None, /, *, level: float | None = None,
                draws: int = N_DRAWS, seed: int = 0, **fields) -> Prediction:
        """Accuracy and its band at step 1's ``query`` (or its fields; its options pass through)."""
        level = self.level if level is None else float(level)
        if not 0 < level < 1:
            raise ValueError(f"level: must be in (0, 1), got {level!r}")
        options = {k: fields.pop(k) for k in ("extra_log_sigma", "extrapolation") if k in fields}
        p1 = self.step1.predict(Query.of(query, **fields), level=self.level, **options)
        L, lo1, hi1 = (np.atleast_1d(np.asarray(x, dtype=float)) for x in (p1.loss, p1.lo, p1.hi))
        center = np.clip(self.accuracy(L), 0.0, 1.0)
        lo, hi = np.full_like(center, np.nan), np.full_like(center, np.nan)
        if len(self.boot_theta) and np.all(np.isfinite(lo1)) and np.all(np.isfinite(hi1)):
            rng = np.random.default_rng(seed)
            zq = float(ndtri((1 + self.level) / 2))
            for i in range(len(L)):
                z = rng.standard_normal(draws)
                s = np.where(z < 0, np.log(L[i] / lo1[i]), np.log(hi1[i] / L[i])) / zq
                lo[i], hi[i] = self._band(L[i] * np.exp(z * s), level, rng)
        else:
            warnings.warn("task law: no bootstrap draws of step 2, or step 1 has no band: the "
                          "band cannot be computed and is reported as NaN", stacklevel=2)
        shape = np.shape(p1.loss)
        return Prediction(loss=center.reshape(shape), lo=lo.reshape(shape),
                          hi=hi.reshape(shape), level=level)

    def _band(self, losses: np.ndarray, level: float, rng) -> tuple[float, float]:
        """Quantiles at ``level`` of step 2's accuracy over draws of the task loss (fit.task)."""
        n = len(losses)
        th = self.boot_theta[np.arange(n) % len(self.boot_theta)]
        acc = sigmoid(losses, th[:, 0], th[:, 1], th[:, 2], th[:, 3])
        acc = acc + rng.choice(self.resid, size=n)
        dist = np.maximum(0.0, self.loss_range[0] - losses)
        acc = acc + rng.standard_normal(n) * self.ext.get("rate", 0.0) * dist
        lo, hi = np.clip(np.quantile(acc, ((1 - level) / 2, (1 + level) / 2)), 0.0, 1.0)
        return float(lo), float(hi)

    # -- artifacts ----------------------------------------------------------------------
    def _uncertainty_own(self) -> dict:
        return {"method": self.band_method + " (ladder.fit.task)",
                "bootstrap_theta": self.boot_theta.tolist(),
                "residuals": self.resid.tolist(),
                "extrapolation_rate": self.ext.get("rate", 0.0)}

    def _json_own(self) -> dict:
        return {"task": {"schema": TASK_SCHEMA, "via": self.via,
                         "step1": self.step1.to_json(), "loss_range": list(self.loss_range),
                         "smooth": self.smooth, "skip": self.skip, "anchor": list(ANCHOR),
                         "draws": N_DRAWS}}

    @classmethod
    def from_json(cls, obj: dict, *, path=None) -> TaskLaw:
        where = str(path) if path else "<law>"

        def bad(field_, msg):
            return InputError(msg, path=where, field=field_)
        obj = lawjson.upgrade(obj, path=path)
        lawjson.check_envelope(obj, path=path, forms=(FORM,))
        task = obj.get("task")
        if not isinstance(task, dict):
            raise bad("task", "missing or not an object")
        if task.get("schema") != TASK_SCHEMA:
            raise bad("task.schema", f"expected {TASK_SCHEMA!r}, got {task.get('schema')!r}")
        via = task.get("via")
        if not isinstance(via, str) or not via:
            raise bad("task.via", "missing or not a string")
        if not isinstance(task.get("step1"), dict) or task["step1"].get("form") == FORM:
            raise bad("task.step1", "missing, or not a law of the task loss")
        step1 = LawResult.from_json(task["step1"], path=f"{where}: task.step1")
        params = obj.get("params")
        if not isinstance(params, dict):
            raise bad("params", "missing or not an object")
        for n in NAMES:
            v = params.get(n)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(f"params.{n}", "missing or not a finite number")
        theta = np.array([float(params[n]) for n in NAMES])
        if np.any(theta < LOWER) or np.any(theta > UPPER):
            raise bad("params", "outside the sigmoid's bounds (a in [-1, 0], L0 >= 0, "
                                "k in [0, 1000], b in [0, 1])")
        unc = obj.get("uncertainty") or {}
        try:
            boot = np.asarray(unc.get("bootstrap_theta") or [], dtype=float).reshape(
                -1, len(NAMES))
            resid = np.asarray(unc.get("residuals") or [0.0], dtype=float).ravel()
            rate = float(unc.get("extrapolation_rate", 0.0))
            lr = [float(x) for x in task.get("loss_range")]
            level = float(unc.get("level", 0.9))
        except (TypeError, ValueError):
            raise bad("uncertainty", "bootstrap_theta, residuals, extrapolation_rate, "
                                     "level and task.loss_range must be numbers") from None
        if not (np.all(np.isfinite(boot)) and np.all(np.isfinite(resid)) and len(resid)
                and math.isfinite(rate) and rate >= 0 and len(lr) == 2 and 0 < level < 1):
            raise bad("uncertainty", "non-finite or out-of-range numbers")
        diag = obj.get("diagnostics") or {}
        ext = dict(diag.get("step2_extrapolation") or {})
        ext["rate"] = rate
        return cls(via=via, metric=obj.get("metric"), step1=step1, theta=theta,
                   boot_theta=boot, resid=resid, ext=ext, loss_range=lr, level=level,
                   intervals=unc.get("intervals"), smooth=int(task.get("smooth", SMOOTH)),
                   skip=float(task.get("skip", SKIP)), inputs=obj.get("inputs") or {},
                   diagnostics=diag, created=obj.get("created"),
                   tool_version=obj.get("tool_version"), conventions=obj.get("conventions"))

    def _report_lines(self) -> list[str]:
        d = self.diagnostics
        ext = self.ext
        lines = [f"step 2: sigmoid of {self.via} on {self.inputs.get('n_points')} smoothed evals "
                 f"(moving average {self.smooth}, first {self.skip:.0%} of each run skipped) "
                 f"+ the point (L=0, acc=1); RMS residual "
                 f"{d.get('step2_rms_residual', math.nan):.4g}"]
        lines += parameter_lines(self, {}, "")
        lines.append(f"step 2 rollout over sizes: extrapolation rate {ext.get('rate', 0):.4g} "
                     f"accuracy per unit of loss below the fitted range "
                     f"[{self.loss_range[0]:.4g}, {self.loss_range[1]:.4g}]")
        lines.append(f"band: {self.band_method}")
        lines.append(f"step 1 ({self.via}):")
        lines += ["  " + s for s in self.step1.report().splitlines()]
        return lines
