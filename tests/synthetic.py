"""A synthetic ladder whose truth is known: for calibration and detection checks of the watcher.

The truth is the trajectory form (the same shape as ``fit``'s "trajectory" law):
``L(C_T, g) = E + A C_T^-alpha g^-gamma exp(c1 (1-g) + c2 (1-g)^2)`` with C_T the planned total
compute and g the fraction of the run. Each synthetic run gets a run-level multiplicative offset
(seed-to-seed variation) and each eval an independent additive error (a finite eval set); train
rows carry train loss with larger per-step noise, a grad norm, a token-drop fraction, the router
entropy and parameter norms, so every rule of the watcher has something to read. Faults can be
injected from a given fraction on: ``shift`` (loss +2%), ``drift`` (loss rising linearly), ``nan``
(a non-finite loss and grad norm), ``drop`` (token-drop fraction jumps), ``lrspike`` (the learning
rate x10 from that step: train loss jumps by ``size`` relative within a few steps and stays up,
grad norm x3, evals follow), ``collapse`` (the router collapses: entropy falls to ``size`` x its
level and the expert load max/mean climbs towards its limit within 2% of the run).

:class:`TruthLaw` exposes the truth through the law API (``predict``/``to_json``), with a band
from the known run-to-run noise: the band a perfect fit would give.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ladder.fit.law import Prediction
from ladder.fit.prediction import Query
from ladder.predict.forecast import Target

FAULTS = ("none", "shift", "drift", "nan", "drop", "lrspike", "collapse")


@dataclass(frozen=True)
class Truth:
    E: float = 1.6
    A: float = 40.0
    alpha: float = 0.12
    gamma: float = 0.25
    c1: float = 0.3
    c2: float = 0.05

    def loss(self, compute_total, fraction):
        ct = np.asarray(compute_total, float)
        g = np.asarray(fraction, float)
        return self.E + self.A * ct ** -self.alpha * g ** -self.gamma * np.exp(
            self.c1 * (1 - g) + self.c2 * (1 - g) ** 2)


@dataclass(frozen=True)
class TruthLaw:
    """The truth as a law object (``fit.load_law`` API), band = known run-to-run noise."""

    truth: Truth
    run_sigma: float = 0.005         # sd of the run-level log offset
    metric: str = "eval_dropless/loss"
    form: str = "synthetic-trajectory"

    @property
    def params(self) -> dict:
        return dict(vars(self.truth))

    def predict(self, query: Query | None = None, /, *, level=0.9, extra_log_sigma=0.0,
                extrapolation: bool = True, **fields):
        """The truth at ``query`` (fit.prediction.Query, or its fields: compute so far and the
        fraction); it has no extrapolation error."""
        from scipy.stats import norm
        q = Query.of(query, **fields)
        g = np.asarray(1.0 if q.fraction is None else q.fraction, float)
        c = np.asarray(q.compute, float)
        loss = self.truth.loss(c / g, g)
        s = math.sqrt(self.run_sigma ** 2 + float(extra_log_sigma) ** 2)
        z = float(norm.ppf(0.5 + level / 2))
        return Prediction(loss=loss, lo=loss * np.exp(-z * s), hi=loss * np.exp(z * s),
                          level=level)

    def to_json(self) -> dict:
        return {"schema": "law/1", "form": self.form, "params": self.params,
                "metric": self.metric, "uncertainty": {"method": "known run-to-run noise",
                                                       "run_sigma": self.run_sigma},
                "expression": "E + A C_T^-alpha g^-gamma exp(c1 (1-g) + c2 (1-g)^2)"}


@dataclass(frozen=True)
class RunNoise:
    run_sigma: float = 0.005     # run-level multiplicative offset (log sd)
    eval_sigma: float = 0.004    # one eval's additive error
    train_sigma: float = 0.02    # one train step's additive error (one batch)
    drop_frac: float = 0.03      # typical token-drop fraction at 4k context (issue: ~3-4%)
    grad_norm: float = 0.3


@dataclass(frozen=True)
class Fault:
    kind: str = "none"
    at: float = 0.5              # onset, fraction of the run
    size: float = 0.02           # shift: +2% loss; drift: +size at the end; drop: new drop frac;
    #                              lrspike: relative jump of the loss; collapse: entropy factor

    def __post_init__(self):
        if self.kind not in FAULTS:
            raise ValueError(f"fault.kind: must be one of {FAULTS}, got {self.kind!r}")


@dataclass
class SyntheticRun:
    target: Target
    rows: list[dict]
    offset: float
    eval_steps: list[int] = field(default_factory=list)


def make_run(truth: Truth, target: Target, *, noise: RunNoise = RunNoise(), fault: Fault = Fault(),
             seed: int = 0, log_every: int = 1, eval_every: float = 0.01,
             offset: float | None = None) -> SyntheticRun:
    """Metrics rows (metrics.jsonl shape) of one run of ``target`` drawn from the truth."""
    rng = np.random.default_rng(seed)
    off = float(rng.normal(0, noise.run_sigma)) if offset is None else offset
    steps = target.steps
    s = np.arange(log_every, steps + 1, log_every)
    if s[-1] != steps:
        s = np.append(s, steps)
    g = s / steps
    clean = truth.loss(target.compute, g) * math.exp(off)
    factor = np.ones_like(g)
    if fault.kind == "shift":
        factor = np.where(g >= fault.at, 1 + fault.size, 1.0)
    elif fault.kind == "drift":
        factor = 1 + fault.size * np.clip((g - fault.at) / max(1 - fault.at, 1e-9), 0, None)
    elif fault.kind == "lrspike":  # the jump builds over ~3 steps, then persists
        ramp = np.clip((s - fault.at * steps) / 3.0 + 1.0 / 3.0, 0, 1)
        factor = 1 + fault.size * np.where(g >= fault.at, ramp, 0.0)
    curve = clean * factor
    n_eval = max(1, round(1 / eval_every))
    eval_steps = sorted({max(1, round(steps * i / n_eval)) for i in range(1, n_eval + 1)})
    eval_set = set(eval_steps)
    train = curve + rng.normal(0, noise.train_sigma, g.size)
    grad = noise.grad_norm * (1 + 0.5 * np.exp(-g / 0.02)) * np.exp(rng.normal(0, 0.1, g.size))
    drop = np.clip(noise.drop_frac * np.exp(rng.normal(0, 0.15, g.size)), 0, 1)
    if fault.kind == "drop":
        drop = np.where(g >= fault.at, np.clip(fault.size * np.exp(rng.normal(0, 0.1, g.size)),
                                               0, 1), drop)
    if fault.kind == "lrspike":
        grad = np.where(g >= fault.at, 3 * grad, grad)
    entropy = 1.8 + rng.normal(0, 0.02, g.size)
    # its own stream, so that adding this signal left the other draws of a seed unchanged
    load = 1.5 * np.exp(np.random.default_rng([seed, 1]).normal(0, 0.05, g.size))
    if fault.kind == "collapse":  # towards the fault's level over 2% of the run
        w = np.clip((g - fault.at) / 0.02, 0, 1)
        entropy = entropy * (1 - w * (1 - fault.size))
        load = load * (1 - w) + 3.9 * w
    # router z-loss growing over the run as the cpu ladder's does (4.8 -> 113, issue 37), on its
    # own stream like the load's
    zloss = 5.0 * np.exp(3.0 * g) * np.exp(np.random.default_rng([seed, 2]).normal(0, 0.05, g.size))
    pnorm = 50 * (1 + 0.5 * g) * np.exp(rng.normal(0, 0.002, g.size))
    bias = 0.5 * (1 + 2 * np.exp(-g / 0.03)) * np.exp(rng.normal(0, 0.05, g.size))
    tps = target.tokens / steps
    rows = []
    nan_step = int(s[np.argmax(g >= fault.at)]) if fault.kind == "nan" else None
    for i, step in enumerate(s.tolist()):
        r = {"step": step, "tokens": step * tps, "progress": step / steps, "time": 10.0 * step,
             "train/loss": float(train[i]), "grad/norm": float(grad[i]),
             "moe/drop_frac": float(drop[i]), "moe/router_entropy": float(entropy[i]),
             "moe/load_max_over_mean": float(load[i]), "moe/router_z_loss": float(zloss[i]),
             "params/norm/blocks": float(pnorm[i]), "params/norm/router_bias": float(bias[i]),
             "optim/lr": 1e-3}
        if step == nan_step:
            r["train/loss"] = "NaN"
            r["grad/norm"] = "NaN"
        if step in eval_set:
            v = float(curve[i] + rng.normal(0, noise.eval_sigma))
            r["eval_dropless/loss"] = v if step != nan_step else "NaN"
            r["eval/loss"] = v * 1.002
        rows.append(r)
    return SyntheticRun(target=target, rows=rows, offset=off, eval_steps=eval_steps)


def ladder_targets(n: int = 5, *, c0: float = 1e15, ratio: float = 4.0, steps0: int = 400,
                   seq_len: int = 128) -> list[Target]:
    """``n`` rungs at compute c0, c0*ratio, ... (tokens ~ 20 x params, Chinchilla-like)."""
    out = []
    for k in range(n):
        c = c0 * ratio ** k
        params = math.sqrt(c / 120.0)   # C = 6 N D, D = 20 N
        tokens = c / (6 * params)
        steps = int(steps0 * ratio ** (k / 2))
        out.append(Target(name=f"rung{k}", params=params * 4, active_params=params,
                          tokens=tokens, steps=steps, compute=c, seq_len=seq_len,
                          eval_steps=tuple(sorted({max(1, round(steps * i / 100))
                                                   for i in range(1, 101)}))))
    return out


def points_table(runs: list[SyntheticRun], metric: str = "eval_dropless/loss"):
    """The fit points table of the runs' evals (compute and tokens so far at each eval)."""
    import pandas as pd
    rec = []
    for run in runs:
        t = run.target
        for r in run.rows:
            v = r.get(metric)
            if not isinstance(v, float) or not math.isfinite(v):
                continue
            g = r["step"] / t.steps
            rec.append({"run": t.name, "params": t.params, "active_params": t.active_params,
                        "tokens": g * t.tokens, "compute": g * t.compute, "fraction": g,
                        "step": r["step"], "loss": v})
    return pd.DataFrame(rec)


def make_multi_run(truths: dict[str, Truth], target: Target, *, noise: RunNoise = RunNoise(),
                   faults: dict[str, Fault] | None = None, seed: int = 0,
                   eval_every: float = 0.01) -> SyntheticRun:
    """One run logging several metrics (per-domain losses): the first key's run gives the train
    rows (and its eval under its key); every other key is an independent draw of its own truth
    (its own run offset and eval noise: independent metrics are the worst case for a family's
    false alarms), logged under its key at the same eval steps. ``faults`` by key."""
    faults = faults or {}
    keys = list(truths)
    base = make_run(truths[keys[0]], target, noise=noise, fault=faults.get(keys[0], Fault()),
                    seed=seed, eval_every=eval_every)
    rows = [dict(r) for r in base.rows]
    for r in rows:
        if "eval_dropless/loss" in r:
            r[keys[0]] = r.pop("eval_dropless/loss")
            r.pop("eval/loss", None)
    by_step = {r["step"]: r for r in rows}
    for j, k in enumerate(keys[1:], 1):
        other = make_run(truths[k], target, noise=noise, fault=faults.get(k, Fault()),
                         seed=seed * 1009 + j * 7919 + 1, eval_every=eval_every)
        for r in other.rows:
            if "eval_dropless/loss" in r:
                by_step[r["step"]][k] = r["eval_dropless/loss"]
    return SyntheticRun(target=target, rows=rows, offset=base.offset, eval_steps=base.eval_steps)
