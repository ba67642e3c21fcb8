"""Several metrics watched together (issue 23): a multi-metric pre-registration (``prereg/3``)
holds one forecast per metric key under ``forecasts`` and one decision rule; each metric is
judged with its own state and named in its alerts. The health rules read the run, not a metric:
they are judged once, with the first metric's state; the others see only their own column (and
the alignment keys).

Multiple comparisons (:func:`family_config`): a healthy run's m metrics should raise a false alarm
no more often than one metric does. The loss rules' thresholds are Gaussian quantiles, so each
moves to the family's Sidak level: the alert band's tail ``p = 1 - alert_level`` becomes
``p_m = 1 - (1 - p)^(1/m)`` per metric (exact for independent metrics, conservative for the
correlated per-domain losses of one run), and ``trend_noise_k``, ``rise_noise_k`` scale by
z(1 - p_m/2) / z(1 - p/2) (bench/watch_quality.py ``--family`` measures both rates).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ladder.predict.watch.alerts import SEVERITY_RANK, Alert, CheckResult, exit_code_for
from ladder.sources.batch import Batch
from ladder.predict.watch.config import WatchConfig
from ladder.predict.watch.state import check_state, new_state
from ladder.predict.watch.view import PreregView

SCHEMA = "prereg/3"
STATE_SCHEMA = "watch-state-multi/1"
# what a metric's view takes from the multi document besides its own forecast entry
SHARED = ("target", "applicability", "band_level", "decision_rule", "health_reference",
          "amends", "created", "sha256")
PER_METRIC = ("law", "law_sha256", "forecast", "final", "eval_noise", "extrapolation",
              "budget_curve")
ALIGN = ("step", "tokens", "progress", "time")


def family_config(cfg: WatchConfig, m: int) -> tuple[WatchConfig, dict]:
    """``cfg`` at the Sidak level of a family of ``m`` metrics, and the record of it
    (``decision_rule.family``)."""
    from scipy.special import ndtri
    if m < 1:
        raise ValueError("m: must be >= 1")
    p = 1.0 - cfg.alert_level
    p_m = -math.expm1(math.log1p(-p) / m)   # 1 - (1 - p)^(1/m), without cancellation
    z1, zm = float(ndtri(1 - p / 2)), float(ndtri(1 - p_m / 2))
    scale = zm / z1
    out = dataclasses.replace(cfg, alert_level=1.0 - p_m,
                              trend_noise_k=round(cfg.trend_noise_k * scale, 4),
                              rise_noise_k=round(cfg.rise_noise_k * scale, 4))
    rec = {"method": "sidak", "metrics": m, "family_alert_level": cfg.alert_level,
           "alert_level": out.alert_level, "z_scale": scale,
           "aim": "a healthy run of m metrics raises a false alarm no more often than one "
                  "metric does at family_alert_level (bench/watch_quality.py --family)"}
    return out, rec


def is_multi(doc) -> bool:
    return isinstance(doc, Mapping) and doc.get("schema") == SCHEMA


def metric_doc(doc: Mapping, key: str) -> dict:
    """The single-metric pre-registration of ``key`` inside a multi-metric one."""
    fc = doc["forecasts"][key]
    return {**{k: doc[k] for k in SHARED if k in doc}, **{k: fc[k] for k in PER_METRIC if k in fc},
            "schema": "prereg/1", "metric": key}


@dataclass(frozen=True)
class MultiView:
    """One :class:`PreregView` per registered metric, in registration order."""

    views: dict
    sha256: str

    @classmethod
    def of(cls, doc: Mapping) -> MultiView:
        keys = doc.get("metrics")
        fcs = doc.get("forecasts")
        if not isinstance(keys, list) or not keys or not isinstance(fcs, Mapping):
            raise ValueError("metrics/forecasts: a prereg/3 file lists its metrics and holds a "
                             "forecast for each")
        views = {}
        for k in keys:
            if k not in fcs:
                raise KeyError(f"forecasts.{k}")
            views[k] = PreregView.of(metric_doc(doc, k))
        return cls(views=views, sha256=str(doc.get("sha256")))

    @property
    def metrics(self) -> list[str]:
        return list(self.views)

    @property
    def metric(self) -> str:  # for messages: the keys, comma-separated
        return ", ".join(self.views)

    @property
    def first(self) -> PreregView:
        return next(iter(self.views.values()))

    def __getattr__(self, name):  # steps, tokens, config, applicability, health: shared
        if name in ("views", "sha256"):
            raise AttributeError(name)  # not set yet (unpickling, copying): no recursion
        return getattr(self.first, name)


def new_multi_state(keys) -> dict:
    return {"schema": STATE_SCHEMA, "metrics": {k: new_state() for k in keys},
            "last_step": None, "last_point_time": None, "n_points": 0, "n_evals": 0,
            "worst": None, "not_applicable": None}


def check_multi_state(st, keys, where: str = "state") -> dict:
    """A multi-metric watcher state, each metric's part checked as a single one; a ValueError
    naming the first bad field."""
    if not isinstance(st, dict) or st.get("schema") != STATE_SCHEMA:
        got = st.get("schema") if isinstance(st, dict) else None
        raise ValueError(f"{where}.schema: unknown schema {str(got)[:40]!r} (this tool reads "
                         f"{STATE_SCHEMA!r}, a multi-metric watch)")
    ms = st.get("metrics")
    if not isinstance(ms, dict):
        raise ValueError(f"{where}.metrics: expected an object")
    out = new_multi_state(keys)
    out.update({k: v for k, v in st.items() if k != "metrics"})
    for k in keys:
        if k in ms:
            out["metrics"][k] = check_state(ms[k], f"{where}.metrics.{k}")
    return out


def _own_columns(b: Batch, key: str) -> Batch:
    cols = {k: v for k, v in b.cols.items() if k in ALIGN or k == key}
    nf = {k: v for k, v in b.nonfinite.items() if k == key}
    return Batch(step=b.step, cols=cols, nonfinite=nf)


def _named(a: Alert, key: str) -> Alert:
    return dataclasses.replace(a, message=f"[{key}] {a.message}",
                               extra={**a.extra, "metric": key})


def check_multi(mv: MultiView, batch: Batch, state: dict | None, *, now: float,
                single) -> CheckResult:
    """Judge ``batch`` for every metric of ``mv``, as :func:`predict.watch.check` (which calls
    this one and passes itself as ``single``, so the two modules do not import each other).
    Each alert about a metric carries ``metric`` and its message starts with it."""
    keys = mv.metrics
    # a copy of the top level only: each metric's state is copied by its single check
    st = dict(state) if state and state.get("schema") == STATE_SCHEMA else new_multi_state(keys)
    st["metrics"] = dict(st["metrics"])
    for k in keys:
        st["metrics"].setdefault(k, new_state())
    alerts: list[Alert] = []
    for i, k in enumerate(keys):
        sub = batch if i == 0 else _own_columns(batch, k)
        if i > 0 and not len(sub):
            continue  # the stalled rule is the first metric's (the run's, said once)
        res = single(mv.views[k], sub, st["metrics"][k], now=now)
        st["metrics"][k] = res.state
        alerts += [a if (i == 0 and a.kind not in _METRIC_KINDS) else _named(a, k)
                   for a in res.alerts]
    subs = list(st["metrics"].values())
    worst = [s.get("worst") for s in subs if s.get("worst")]
    st["worst"] = max(worst, key=SEVERITY_RANK.get) if worst else None
    st["not_applicable"] = next((s["not_applicable"] for s in subs if s.get("not_applicable")),
                                None)
    st.update({f: subs[0].get(f) for f in ("last_step", "last_point_time", "n_points")})
    st["n_evals"] = sum(int(s.get("n_evals") or 0) for s in subs)
    return CheckResult(alerts, st)


def metric_summary(mv: MultiView, state: dict, alerts=()) -> list[dict]:
    """One row per metric for the verdict; ``absent`` when the source never held the key."""
    rows = []
    for k in mv.metrics:
        s = (state.get("metrics") or {}).get(k) or new_state()
        own = [a for a in alerts if (a.extra or {}).get("metric") == k]
        ema = (s.get("band") or {}).get("ema")
        fin = mv.views[k].final
        rel = ema / fin if isinstance(ema, (int, float)) and fin and np.isfinite(fin) else None
        rows.append({"metric": k, "worst": s.get("worst"),
                     "exit": exit_code_for(s.get("worst"), bool(s.get("not_applicable"))),
                     "evals": int(s.get("n_evals") or 0),
                     "absent": not (s.get("input") or {}).get("metric_seen"),
                     "residual_ema": ema, "residual_rel": rel,
                     "alerts": sum(1 for a in own if a.severity != "info")})
    return rows


# alert kinds about the metric itself (named even for the first metric)
_METRIC_KINDS = frozenset({"above_band", "below_band", "trend", "rising", "contingency",
                           "missing_metric", "cleared", "nan_metric"})


def residual_order(mv: MultiView, state: dict) -> list[str]:
    """The metric keys, largest |smoothed residual| relative to the forecast first (the report's
    small multiples); metrics never seen last."""
    def key(k):
        s = (state.get("metrics") or {}).get(k) or {}
        ema = (s.get("band") or {}).get("ema")
        level = mv.views[k].final
        if not (isinstance(ema, (int, float)) and np.isfinite(ema)):
            return math.inf
        return -abs(ema / level) if np.isfinite(level) and level else -abs(ema)
    return sorted(mv.metrics, key=key)
