"""W&B as home for a forecast: the frozen pre-registration as its own run, the watcher's residuals
and alerts added to it, so one W&B panel shows the live curve inside the band.

- :func:`log_forecast` (`ladder preregister --wandb`): a run of job type ``forecast`` in the
  ladder's group whose rows are the forecast grid (``forecast/loss``, ``forecast/lo``,
  ``forecast/hi`` with ``step``, ``tokens`` and ``forecast/fraction``), the prereg file attached as
  an artifact whose metadata carries its sha256. Its id is a function of that sha256
  (``ladder.wandbrun.forecast_run_id``).
- :class:`ForecastRunSink` (`ladder watch --wandb`): resumes that run, logs every judged eval
  (``watch/loss``, ``watch/expected``, ``watch/residual``, ``watch/residual_rel``) and every alert
  (``watch/alerts`` table, ``wandb.alert`` for warnings and worse), and the verdict in its summary.
  The eval rows come from :class:`TeeSource`, which passes the watcher's source through unchanged
  and hands each poll's evals to the sink with the pre-registration view in use (an amendment the
  watcher moves to is followed).

``wandb_module`` is injectable for tests; WANDB_MODE=offline works without network.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ladder import wandbrun
from ladder.io import InputError, as_float, sha256_file
from predict.watch import SEVERITIES, Alert, Batch, PreregView, exit_code_for, row_fractions

PREFIXES = ("forecast", "watch")


def require_wandb():
    """The wandb module, or a one-line error naming the extra that installs it."""
    try:
        import wandb
    except ImportError as e:
        raise InputError(f"--wandb needs the wandb package (pip install 'ladder[wandb]'): {e}",
                         field="--wandb", exit_code=69) from None
    return wandb


def _wandb(module):
    return module if module is not None else require_wandb()


def _group_of(doc: dict, group: str | None) -> tuple[str | None, str]:
    """The ladder (group) and rung of the target: ``LADDER/RUNG`` names, else the target name."""
    name = str((doc.get("target") or {}).get("name") or "target")
    sep = ":" if ":" in name else "/"  # Target.from_rung names LADDER:RUNG
    ladder, _, rung = name.rpartition(sep)
    return (group or ladder or None), (rung or name)


def _finite(v) -> float | None:
    x = as_float(v)
    return x if x is not None and math.isfinite(x) else None


def log_forecast(doc: dict, path: str | Path, *, entity: str | None = None,
                 project: str | None = None, group: str | None = None,
                 wandb_module: Any = None) -> dict:
    """Log the pre-registration ``doc`` (written at ``path``) as its own W&B run; returns where
    it went (id, entity, project, group, name, dir). The run is finished before returning."""
    wandb = _wandb(wandb_module)
    entity, project = wandbrun.resolve(entity, project)
    sha = str(doc["sha256"])
    ladder, rung = _group_of(doc, group)
    path = Path(path)
    run = wandb.init(entity=entity, project=project, group=ladder, name=f"{rung} forecast",
                     job_type="forecast", id=wandbrun.forecast_run_id(sha), resume="allow",
                     tags=wandbrun.tags(ladder, rung, "forecast", f"prereg:{sha[:12]}"),
                     dir=str(path.parent), reinit="finish_previous",
                     config={"prereg_sha256": sha, "metric": doc.get("metric"),
                             "band_level": doc.get("band_level"), "target": doc.get("target"),
                             "law_form": (doc.get("law") or {}).get("form")})
    wandbrun.define_axes(run, PREFIXES)
    last = None
    for p in sorted(doc.get("forecast") or [], key=lambda p: as_float(p.get("fraction")) or 0):
        step = as_float(p.get("step"))
        if step is None or (last is not None and int(step) <= last):
            continue  # W&B steps only increase: the first grid point of each step
        last = int(step)
        row = {"step": last, "tokens": _finite(p.get("tokens")),
               "forecast/fraction": _finite(p.get("fraction"))}
        for k in ("loss", "lo", "hi"):  # a missing band is left out, never drawn as zero width
            row[f"forecast/{k}"] = _finite(p.get(k))
        run.log({k: v for k, v in row.items() if v is not None}, step=last)
    fin = doc.get("final") or {}
    for k in ("loss", "lo", "hi"):
        if _finite(fin.get(k)) is not None:
            run.summary[f"forecast/final_{k}"] = _finite(fin.get(k))
    art = wandb.Artifact(name=f"prereg-{sha[:12]}", type="prereg",
                         description=f"pre-registration of {doc.get('target', {}).get('name')}",
                         metadata={"sha256": sha, "file_sha256": sha256_file(path),
                                   "metric": doc.get("metric"), "created": doc.get("created")})
    art.add_file(str(path), name=path.name)
    run.log_artifact(art)
    info = {"id": run.id, "entity": entity, "project": project, "group": ladder,
            "name": f"{rung} forecast", "dir": str(Path(run.dir).parent)}
    run.finish()
    return info


class TeeSource:
    """A watcher source passed through unchanged; every poll's eval rows of ``view.metric`` also go
    to ``on_evals(view, step, tokens, fraction, value)`` (numpy arrays), ``view`` being
    ``view_of()`` at that poll (the watcher's current pre-registration)."""

    def __init__(self, source, view_of, on_evals):
        self._source, self._view_of, self._on_evals = source, view_of, on_evals

    def __getattr__(self, name):
        attr = getattr(self._source, name)
        if name in ("poll", "poll_batch"):
            def wrapped(*a, **kw):
                p = attr(*a, **kw)
                self._tee(p)
                return p
            return wrapped
        return attr

    def _tee(self, p) -> None:
        view: PreregView = self._view_of()
        b = p.batch if p.batch is not None else Batch.from_rows(p.rows, keys=[view.metric,
                                                                              "tokens",
                                                                              "progress"])
        y = b.cols.get(view.metric)
        if y is None or not len(b):
            return
        ok = np.isfinite(y)
        if ok.any():
            frac = row_fractions(view, b)
            self._on_evals(view, b.step[ok], b.col("tokens")[ok], frac[ok], y[ok])


class ForecastRunSink:
    """Adds the watcher's residuals and alerts to the pre-registration's forecast run."""

    def __init__(self, doc: dict, *, entity: str | None = None, project: str | None = None,
                 group: str | None = None, wandb_module: Any = None, dir: str | None = None):
        self._wandb = _wandb(wandb_module)
        self.entity, self.project = wandbrun.resolve(entity, project)
        self.metric = str(doc.get("metric"))
        ladder, rung = _group_of(doc, group)
        self.run = self._wandb.init(
            entity=self.entity, project=self.project, group=ladder, name=f"{rung} forecast",
            job_type="forecast", id=wandbrun.forecast_run_id(str(doc["sha256"])),
            resume="allow", dir=dir, reinit="finish_previous",
            tags=wandbrun.tags(ladder, rung, "forecast", f"prereg:{str(doc['sha256'])[:12]}"))
        wandbrun.define_axes(self.run, PREFIXES)
        self.rows: list[list] = []
        self.worst: str | None = None
        self.not_applicable = False
        self.failed = False

    def log_evals(self, view: PreregView, step, tokens, frac, y) -> None:
        e, lo, hi = view.expected(np.asarray(frac, dtype=float), alert=False)
        for s, t, f, v, ex, a, b in zip(step, tokens, frac, y, e, lo, hi):
            row = {"step": int(s), "tokens": _finite(t), "watch/fraction": _finite(f),
                   "watch/loss": float(v), "watch/expected": _finite(ex),
                   "watch/lo": _finite(a), "watch/hi": _finite(b)}
            if row["watch/expected"] is not None:
                row["watch/residual"] = float(v - ex)
                row["watch/residual_rel"] = float(v / ex - 1)
            # no explicit W&B step: the forecast rows already took the run's steps up to the end
            self.run.log({k: x for k, x in row.items() if x is not None})

    def send(self, alert: Alert, context: dict) -> None:
        if alert.severity != "info" and (self.worst is None or SEVERITIES.index(alert.severity)
                                         > SEVERITIES.index(self.worst)):
            self.worst = alert.severity
        self.not_applicable = self.not_applicable or alert.kind == "not_applicable"
        self.rows.append([alert.time, alert.step, alert.fraction, alert.kind, alert.severity,
                          alert.value, alert.expected, alert.message])
        self.run.log({"step": alert.step, "watch/alert_severity":
                      SEVERITIES.index(alert.severity)} if alert.step is not None else
                     {"watch/alert_severity": SEVERITIES.index(alert.severity)})
        if alert.severity == "info" and alert.kind != "contingency" or self.failed:
            return
        try:
            levels = getattr(self._wandb, "AlertLevel", None)
            level = None if levels is None else {"info": levels.INFO, "warn": levels.WARN,
                                                 "critical": levels.ERROR}[alert.severity]
            self.run.alert(title=f"{self.metric}: {alert.kind} ({alert.severity})",
                           text=alert.message, level=level)
        except Exception as e:  # noqa: BLE001 - never let a sink stop the watcher
            self.failed = True
            print(f"ladder watch: wandb.alert failed ({type(e).__name__}: {e}); further W&B "
                  f"alerts are skipped", file=sys.stderr)

    def close(self) -> None:
        cols = ["time", "step", "fraction", "kind", "severity", "value", "expected", "message"]
        self.run.log({"watch/alerts": self._wandb.Table(columns=cols, data=self.rows)})
        self.run.summary["watch/worst"] = self.worst or "none"
        self.run.summary["watch/alerts_n"] = len(self.rows)
        self.run.summary["watch/exit"] = exit_code_for(self.worst, self.not_applicable)
        self.run.finish()
