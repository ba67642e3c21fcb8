"""W&B as home for a forecast: the frozen pre-registration as its own run, the watcher as another,
in the ladder's group, so W&B's default panel of the watched key shows the live curve beside its
forecast with no hand-built chart.

- :func:`log_forecast` (`ladder preregister --wandb`): a ``forecast`` run (id from the prereg's
  sha256, ``ladder.wandbrun.forecast_run_id``) whose rows are the forecast grid at the target's
  steps: the watched key itself = the centre, ``<key>_lo``/``_hi`` its band, ``forecast/*``; the
  prereg file as an artifact.
- :class:`WatchRunSink` (`ladder watch --wandb`): the watcher's own run (``watch_run_id``): each
  judged eval (``watch/loss``, ``watch/expected``, ``watch/lo``, ``watch/hi``,
  ``watch/residual``, ``watch/residual_rel``), the alerts (the ``watch/alerts`` table and
  ``wandb.alert`` for warnings and worse), the updated forecast's final (``watch/updated_final``,
  issue 40), the verdict in its summary. Rows carry ``step`` and W&B's step is explicit, so a
  watcher resumed offline (W&B restarts its counter at 0) still logs at the watched run's steps.

Both log one chart with the band (:func:`band_chart`, key ``band``): W&B's built-in
``wandb.plot.line_series`` over the run's own table, written offline and carried by `wandb sync`
(a saved workspace view or a shaded band needs the server). ``wandb_module`` is injectable for
tests; WANDB_MODE=offline works without network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ladder import wandbrun
from ladder.io import InputError, as_float, sha256_file
from ladder.predict.sinks import Sink, wandb_alert
from ladder.predict.watch import SEVERITIES, Alert, Batch, PreregView, exit_code_for, row_fractions
from ladder.predict.watch.alerts import finite_or_none

PREFIXES = ("forecast", "watch")
CHART_KEY = "band"
# the watcher re-logs its chart (a new table, and a run_table artifact, each time) at most this
# often, and at exit: a 30 s poll would otherwise add one artifact per poll
CHART_EVERY_S = 300.0


def require_wandb():
    """The wandb module, or a one-line error naming the extra that installs it."""
    try:
        import wandb
    except ImportError as e:
        raise InputError(f"--wandb needs the wandb package (pip install 'ladder[wandb]'): {e}",
                         field="--wandb", exit_code=69) from None
    return wandb


def _group_of(doc: dict, group: str | None) -> tuple[str | None, str]:
    """The ladder (group) and rung of the target: ``LADDER/RUNG`` names, else the target name."""
    name = str((doc.get("target") or {}).get("name") or "target")
    sep = ":" if ":" in name else "/"  # Target.from_rung names LADDER:RUNG
    ladder, _, rung = name.rpartition(sep)
    return (group or ladder or None), (rung or name)


def forecast_grid(doc: dict) -> tuple[np.ndarray, np.ndarray]:
    """The pre-registration's forecast grid as (fraction, step) arrays, the first grid point of
    each step, in step order (W&B's steps only increase)."""
    frac, step, last = [], [], None
    for p in sorted(doc.get("forecast") or [], key=lambda p: as_float(p.get("fraction")) or 0):
        s, f = as_float(p.get("step")), finite_or_none(p.get("fraction"))
        if s is None or f is None or (last is not None and int(s) <= last):
            continue
        last = int(s)
        frac.append(f)
        step.append(last)
    return np.asarray(frac, dtype=float), np.asarray(step, dtype=np.int64)


def band_chart(wandb, metric: str, grid_step, centre, lo, hi, live_step=(), live=(), *,
               title: str = ""):
    """One W&B chart (``wandb.plot.line_series``) of the forecast centre, the band's edges and
    the live curve (when given) against the watched run's step; non-finite values are left out
    of their line (a missing band is never drawn at zero)."""
    xs, ys, keys = [], [], []
    series = [(f"{metric} (live)", live_step, live), ("forecast", grid_step, centre),
              ("band lo", grid_step, lo), ("band hi", grid_step, hi)]
    for name, x, y in series:
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        ok = np.isfinite(x) & np.isfinite(y)
        if ok.any():
            xs.append([int(v) for v in x[ok]])
            ys.append([float(v) for v in y[ok]])
            keys.append(name)
    if not keys:
        return None
    return wandb.plot.line_series(xs=xs, ys=ys, keys=keys, title=title or metric, xname="step")


def log_forecast(doc: dict, path: str | Path, *, entity: str | None = None,
                 project: str | None = None, group: str | None = None,
                 wandb_module: Any = None) -> dict:
    """Log the pre-registration ``doc`` (written at ``path``) as its own W&B run; returns where
    it went (id, entity, project, group, name, dir). The run is finished before returning."""
    wandb = wandb_module if wandb_module is not None else require_wandb()
    entity, project = wandbrun.resolve(entity, project)
    sha = str(doc["sha256"])
    ladder, rung = _group_of(doc, group)
    metric = str(doc.get("metric") or "eval_dropless/loss")
    path = Path(path)
    run = wandb.init(entity=entity, project=project, group=ladder, name=f"{rung} forecast",
                     job_type="forecast", id=wandbrun.forecast_run_id(sha), resume="allow",
                     tags=wandbrun.tags(ladder, rung, "forecast", f"prereg:{sha[:12]}"),
                     dir=str(path.parent), reinit="finish_previous",
                     config={"prereg_sha256": sha, "metric": metric,
                             "band_level": doc.get("band_level"), "target": doc.get("target"),
                             "law_form": (doc.get("law") or {}).get("form"),
                             "watch_run": wandbrun.watch_run_id(sha)})
    wandbrun.define_axes(run, PREFIXES)
    keys = wandbrun.band_keys(metric)
    for k in keys:  # the watched key against `step`, as the train runs define it
        run.define_metric(k, step_metric="step")
    last = None
    for p in sorted(doc.get("forecast") or [], key=lambda p: as_float(p.get("fraction")) or 0):
        step = as_float(p.get("step"))
        if step is None or (last is not None and int(step) <= last):
            continue  # W&B steps only increase: the first grid point of each step
        last = int(step)
        row = {"step": last, "tokens": finite_or_none(p.get("tokens")),
               "forecast/fraction": finite_or_none(p.get("fraction"))}
        for k, key in zip(("loss", "lo", "hi"), keys):
            # a missing band is left out, never drawn as zero width
            row[f"forecast/{k}"] = row[key] = finite_or_none(p.get(k))
        run.log({k: v for k, v in row.items() if v is not None}, step=last)
    chart = band_chart(wandb, metric, *_grid_band(doc),
                       title=f"{metric}: forecast of {rung} and its band")
    if chart is not None:
        run.log({CHART_KEY: chart}, step=last if last is not None else 0)
    fin = doc.get("final") or {}
    for k in ("loss", "lo", "hi"):
        if finite_or_none(fin.get(k)) is not None:
            run.summary[f"forecast/final_{k}"] = finite_or_none(fin.get(k))
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


def _grid_band(doc: dict, view: PreregView | None = None):
    """The forecast grid's steps with its centre and band (the view's, else the document's)."""
    frac, step = forecast_grid(doc)
    view = view or PreregView.of(doc)
    e, lo, hi = view.expected(frac, alert=False)
    return step, e, lo, hi


def previous_live(wandb_dir: Path, run_id: str, current: Path, metric: str) -> dict[int, float]:
    """The live curve (step -> value) of the last band chart an earlier offline segment of run
    ``run_id`` under ``wandb_dir`` logged (the segment ``current`` left out); {} when there is
    none (a first watcher, an online run: its tables are on the server)."""
    import json
    live: dict[int, float] = {}
    segs = sorted(p for p in wandb_dir.glob(f"offline-run-*-{run_id}") if p != current)
    for seg in reversed(segs):
        tables = sorted((seg / "files" / "media" / "table").glob(f"{CHART_KEY}_table_*.table.json"),
                        key=lambda f: int(f.name.split("_")[2]) if f.name.split("_")[2].isdigit()
                        else -1)
        if not tables:
            continue
        try:
            data = json.loads(tables[-1].read_text()).get("data") or []
        except (OSError, ValueError):
            continue
        for row in data:
            if len(row) == 3 and row[1] == f"{metric} (live)" and \
                    finite_or_none(row[2]) is not None:
                live[int(row[0])] = float(row[2])
        break
    return live


ALERT_COLUMNS = ["time", "step", "fraction", "kind", "severity", "value", "expected", "message"]


class WatchRunSink(Sink):
    """The watcher's own W&B run: residuals at the watched run's steps, alerts as they come."""

    name = "wandb-watch"

    def __init__(self, doc: dict, *, entity: str | None = None, project: str | None = None,
                 group: str | None = None, wandb_module: Any = None, dir: str | None = None):
        self._wandb = wandb_module if wandb_module is not None else require_wandb()
        self.entity, self.project = wandbrun.resolve(entity, project)
        self.metric = str(doc.get("metric"))
        sha = str(doc["sha256"])
        ladder, rung = _group_of(doc, group)
        self.doc, self.rung_name = doc, rung
        self.live: dict[int, float] = {}  # step -> the watched value (the chart's live line)
        self.view: PreregView | None = None  # the pre-registration view last judged by
        self._chart_at: float | None = None  # when the chart was last logged (monotonic)
        self._chart_stale = False
        self.run = self._wandb.init(
            entity=self.entity, project=self.project, group=ladder, name=f"{rung} watch",
            job_type="watch", id=wandbrun.watch_run_id(sha), resume="allow", dir=dir,
            reinit="finish_previous", tags=wandbrun.tags(ladder, rung, "watch",
                                                         f"prereg:{sha[:12]}"),
            config={"prereg_sha256": sha, "metric": self.metric,
                    "forecast_run": wandbrun.forecast_run_id(sha)})
        wandbrun.define_axes(self.run, ("watch",))
        # a watcher restarted with --state reads only what is new: its chart's live curve starts
        # from the one the run's earlier offline segments logged last
        self.live.update(previous_live(Path(dir or ".") / "wandb", self.run.id,
                                       Path(self.run.dir).parent, self.metric))
        # a run resumed online continues at the server's step: rows at or before it were
        # logged by the watcher that ran before (offline the counter restarts at 0)
        resumed = getattr(self.run, "step", 0)
        self.last_step: int | None = int(resumed) if isinstance(resumed, int) and resumed > 0 \
            else None
        self.resumed_at = self.last_step
        self.rows: list[list] = []        # every alert row sent (the non-incremental table)
        self._new_alerts: list[list] = []  # alert rows since the last flush
        self._pending: dict[int, dict] = {}  # step -> the row to log there at the next flush
        self.table = self._new_table()
        self.worst: str | None = None
        self.not_applicable = False
        self.failed = False
        self.updated: Any = None  # the updated forecast, read after each poll (:meth:`attach`)

    def _new_table(self):
        """An INCREMENTAL table (each log adds the rows since the last: the alerts as they
        come; wandb >= 0.19.x, W&B Server >= 0.70), else None: each log sends the whole table."""
        import inspect
        try:
            if "log_mode" in inspect.signature(self._wandb.Table).parameters:
                return self._wandb.Table(columns=ALERT_COLUMNS, log_mode="INCREMENTAL")
        except (TypeError, ValueError):
            pass
        return None

    def attach(self, watcher) -> None:
        """Log what ``watcher`` (ladder.predict.live.Watcher) judges, as one of its listeners
        (which see the rows after it dropped those judged already: each row is logged once),
        and the updated forecast after each poll."""
        from ladder.predict.watch.rules.heading import updated_forecast
        watcher.listeners.append(self.on_batch)
        self.updated = lambda: updated_forecast(watcher.view, watcher.state.get("heading"))

    def on_batch(self, view: PreregView, batch: Batch) -> None:
        """A judged batch's finite evals of ``view.metric`` to :meth:`log_evals`."""
        y = batch.cols.get(view.metric)
        if y is None or not len(batch):
            return
        ok = np.isfinite(y)
        if ok.any():
            frac = row_fractions(view, batch)
            self.log_evals(view, batch.step[ok], batch.col("tokens")[ok], frac[ok], y[ok])

    def log_evals(self, view: PreregView, step, tokens, frac, y) -> None:
        """Hold this poll's judged evals until :meth:`flush` (after the alerts about them)."""
        e, lo, hi = view.expected(np.asarray(frac, dtype=float), alert=False)
        self.view = view
        self._chart_stale = self._chart_stale or len(step) > 0
        for s, t, f, v, ex, a, b in zip(step, tokens, frac, y, e, lo, hi):
            self.live[int(s)] = float(v)
            row = {"tokens": finite_or_none(t), "watch/fraction": finite_or_none(f),
                   "watch/loss": float(v), "watch/expected": finite_or_none(ex),
                   "watch/lo": finite_or_none(a), "watch/hi": finite_or_none(b)}
            if row["watch/expected"] is not None:
                row["watch/residual"] = float(v - ex)
                row["watch/residual_rel"] = float(v / ex - 1)
            self._pending.setdefault(int(s), {}).update(
                {k: x for k, x in row.items() if x is not None})

    def send(self, alert: Alert, context: dict) -> None:
        if alert.severity != "info" and (self.worst is None or SEVERITIES.index(alert.severity)
                                         > SEVERITIES.index(self.worst)):
            self.worst = alert.severity
        self.not_applicable = self.not_applicable or alert.kind == "not_applicable"
        self._new_alerts.append([getattr(alert, c) for c in ALERT_COLUMNS])
        at = self._pending.setdefault(alert.step if alert.step is not None else -1, {})
        sev = SEVERITIES.index(alert.severity)
        at["watch/alert_severity"] = max(sev, at.get("watch/alert_severity", sev))
        if alert.severity == "info" and alert.kind != "contingency" or self.failed:
            return
        self.failed = not wandb_alert(lambda: (self._wandb, self.run),
                                      f"{self.metric}: {alert.kind} ({alert.severity})", alert)

    def _chart(self):
        """The band chart with the live curve so far (the view the watcher judged by last)."""
        steps = sorted(self.live)
        return band_chart(self._wandb, self.metric, *_grid_band(self.doc, self.view),
                          live_step=steps, live=[self.live[s] for s in steps],
                          title=f"{self.metric}: {self.rung_name} against its forecast")

    def flush(self, *, final: bool = False) -> None:
        """Log what this poll brought, in step order: each eval and alert at its own step as
        W&B's step (an alert without a step, at the last one), the new rows of the alerts
        table once, at the last of those steps (the watcher calls this after every poll)."""
        pending, self._pending = self._pending, {}
        new, self._new_alerts = self._new_alerts, []
        up = self.updated() if self.updated is not None and pending else None
        if up:
            at = max([s for s in pending if s >= 0] or [self.last_step or 0])
            pending.setdefault(at, {}).update({
                "watch/updated_final": up["final"]["loss"], "watch/updated_lo": up["final"]["lo"],
                "watch/updated_hi": up["final"]["hi"]})
            self.last_updated = up
        if new:
            self.rows += new
            if self.table is not None:
                for r in new:
                    self.table.add_data(*r)
            last = max([s for s in pending if s >= 0] or [self.last_step or 0])
            pending.setdefault(last, {})["watch/alerts"] = (
                self.table if self.table is not None else
                self._wandb.Table(columns=ALERT_COLUMNS, data=list(self.rows)))
        for s in sorted(pending):
            row = pending[s]
            if s < 0:  # no step (an input note, the source): at the last step logged
                s = self.last_step or 0
            elif self.resumed_at is not None and s <= self.resumed_at and \
                    "watch/alerts" not in row and "watch/alert_severity" not in row:
                continue  # an eval the watcher this one resumes logged already
            # never below the last step: W&B drops a row logged to an earlier step
            s = s if self.last_step is None else max(s, self.last_step)
            self.run.log({"step": s, **row}, step=s)
            self.last_step = s
        import time
        now = time.monotonic()
        if self._chart_stale and self.live and (final or self._chart_at is None
                                                or now - self._chart_at >= CHART_EVERY_S):
            chart = self._chart()
            if chart is not None:
                s = self.last_step or 0
                self.run.log({"step": s, CHART_KEY: chart}, step=s)
                self._chart_at, self._chart_stale = now, False

    def close(self) -> None:
        self.flush(final=True)
        self.run.summary["watch/worst"] = self.worst or "none"
        self.run.summary["watch/alerts_n"] = len(self.rows)
        self.run.summary["watch/exit"] = exit_code_for(self.worst, self.not_applicable)
        up = getattr(self, "last_updated", None)
        if up:  # labelled: the frozen final stays the forecast run's
            self.run.summary["watch/updated_final"] = up["final"]["loss"]
            self.run.summary["watch/updated_at_fraction"] = up["at_fraction"]
        self.run.finish()
