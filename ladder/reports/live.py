"""The live page: the watch chart, the verdict and the alerts, served on 127.0.0.1 and refreshed in
the browser as points and alerts arrive (`ladder watch --serve`, `ladder report --serve`).

Standard library only (``http.server``), no external assets: ``/`` is one HTML page whose
JavaScript polls ``/state.json`` every ``poll_ms`` and redraws when its ``version`` changes;
``/chart.png`` is the report's own figure (``plots.plot_watch``; ``metrics.plot_metrics`` for a
multi-metric watch), drawn in one thread only for a new version, at most once per ``REDRAW_S``.
Two feeds: :meth:`LivePage.for_watcher` folds the batches a running watcher judges into
:class:`Downsampled` series (memory bounded over a 100-day run; the metrics file is never read
again); :meth:`LivePage.for_files` (`report --serve`) re-reads the report's inputs on a change.

The server binds a loopback address, answers only one loopback ``Host`` header with this page's
port (else 403, against DNS rebinding) from a bounded pool of threads, and a request head must
arrive whole within ``HEAD_DEADLINE_S`` (a deadline, not a timeout per read: clients trickling a
byte every 2 s held every worker, issue 39).
"""

from __future__ import annotations

import html
import io
import ipaddress
import json
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import numpy as np

from ladder.io import EX_USAGE, InputError, as_float, to_jsonable

ALERTS_SHOWN = 200  # the newest alerts in the table (the page stays light over 100 days)
BUCKETS = 1000      # per unit of run fraction: <= 2 points each (min and max) per series
FRACTION_MAX = 1.25  # a run that overshoots its plan (its last bucket takes the rest)
# at most one drawing of the chart per REDRAW_S: a drawing costs ~0.2-0.5 s of CPU
# (bench/live_page_speed.py) and a hero logging train loss every step brings a new version at
# nearly every poll
REDRAW_S = 5.0
WORKERS = 16        # threads answering requests (each answer is a cached object: ~ms)
QUEUE = 256         # the listen backlog (http.server's default of 5 drops a crowd)
TIMEOUT_S = 5.0     # per connection: a client that sends nothing is dropped after this
# the whole request head (request line and headers): a browser on this machine sends it in one
# write, well under a millisecond; a client still sending after this is dropped
HEAD_DEADLINE_S = 2.0
# matplotlib's rcParams are global (plots draw under rc_context): one drawing at a time per process
_DRAWING = threading.Lock()

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>%(title)s</title>
<style>%(css)s
#status { color: #666; font-size: 13px; }
</style></head><body><main>
<h1>%(title)s</h1>
<p id="status">connecting...</p>
<div id="verdict" class="verdict"><ul id="verdict-lines"></ul></div>
<figure id="fig" style="display: none"><img id="chart" alt="the run against its forecast band">
</figure>
<h2>Alerts (<span id="n-alerts">0</span>)</h2>
<table><thead><tr><th>step</th><th>fraction</th><th>severity</th><th>kind</th><th>value</th>
<th>message</th></tr></thead><tbody id="alerts"></tbody></table>
<script>
(function () {
  var seen = null, POLL = %(poll_ms)d;
  function cell(tr, text, cls) {
    var td = document.createElement('td'); td.textContent = text;
    if (cls) { td.className = cls; } tr.appendChild(td);
  }
  function draw(s) {
    var img = document.getElementById('chart');
    document.getElementById('fig').style.display = s.chart ? '' : 'none';
    if (s.chart && img.getAttribute('src') !== s.chart) { img.setAttribute('src', s.chart); }
    var ul = document.getElementById('verdict-lines'); ul.textContent = '';
    s.verdict.forEach(function (x) {
      var li = document.createElement('li'); li.textContent = x; ul.appendChild(li); });
    document.getElementById('verdict').className = 'verdict ' + s.tone;
    var tb = document.getElementById('alerts'); tb.textContent = '';
    s.alerts.forEach(function (a) {
      var tr = document.createElement('tr');
      cell(tr, a.step); cell(tr, a.fraction); cell(tr, a.severity, 'sev-' + a.severity);
      cell(tr, a.kind); cell(tr, a.value); cell(tr, a.message);
      tb.appendChild(tr); });
    document.getElementById('n-alerts').textContent = s.n_alerts;
    document.body.setAttribute('data-version', s.version);
  }
  function tick() {
    fetch('state.json', {cache: 'no-store'}).then(function (r) { return r.json(); })
      .then(function (s) {
        if (s.version + ' ' + s.chart !== seen) { seen = s.version + ' ' + s.chart; draw(s); }
        document.getElementById('status').textContent = 'updated ' + s.updated + ' (version '
          + s.version + '; refreshes every ' + POLL / 1000 + ' s)';
      })
      .catch(function () { document.getElementById('status').textContent = 'disconnected'; })
      .then(function () { setTimeout(tick, POLL); });
  }
  tick();
})();
</script></main></body></html>
"""


# ------------------------------------------------------------------------ bounded series


class Downsampled:
    """A series along the run (x = fraction of the planned run) kept as each bucket's (width
    1/BUCKETS) lowest and highest point: a spike survives, memory is O(BUCKETS)."""

    def __init__(self, buckets: int = BUCKETS, x_max: float = FRACTION_MAX):
        self.per_unit = buckets
        n = int(math.ceil(buckets * x_max))
        self.lo_y = np.full(n, np.inf)
        self.lo_x = np.full(n, np.nan)
        self.hi_y = np.full(n, -np.inf)
        self.hi_x = np.full(n, np.nan)
        self.n = 0           # points added in all
        self.last: tuple[float, float] | None = None  # the point of the largest x so far

    def add(self, x, y) -> None:
        x = np.asarray(x, float).ravel()
        y = np.asarray(y, float).ravel()
        ok = np.isfinite(x) & np.isfinite(y) & (x >= 0)
        x, y = x[ok], y[ok]
        if not len(x):
            return
        self.n += len(x)
        i = np.minimum((x * self.per_unit).astype(np.int64), len(self.lo_y) - 1)
        for ys, xs, sign in ((self.lo_y, self.lo_x, 1.0), (self.hi_y, self.hi_x, -1.0)):
            order = np.lexsort((sign * y, i))  # by bucket, then the extreme first
            first = order[np.unique(i[order], return_index=True)[1]]
            b = i[first]
            better = sign * y[first] < sign * ys[b]
            ys[b[better]] = y[first][better]
            xs[b[better]] = x[first][better]
        k = int(np.argmax(x))
        if self.last is None or x[k] >= self.last[0]:
            self.last = (float(x[k]), float(y[k]))

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """The kept points in x order (a bucket's low and high; one when they coincide)."""
        full = np.isfinite(self.lo_x)
        xs = np.concatenate([self.lo_x[full], self.hi_x[full]])
        ys = np.concatenate([self.lo_y[full], self.hi_y[full]])
        order = np.argsort(xs, kind="stable")
        xs, ys = xs[order], ys[order]
        if len(xs) > 1:
            keep = np.r_[True, (xs[1:] != xs[:-1]) | (ys[1:] != ys[:-1])]
            xs, ys = xs[keep], ys[keep]
        return xs, ys


# ------------------------------------------------------------------------ the state


def _answer(lines: list[str], tone: str, alerts: list[dict], n_alerts: int,
            chart: Callable[[], object] | None = None) -> dict:
    """The page's state: the verdict lines, their tone, the newest alerts first and ``chart``, a
    function returning the chart's matplotlib figure (None: no chart)."""
    return {"chart": chart, "verdict": lines, "tone": {"ok": ""}.get(tone, tone),
            "alerts": [_alert_row(a) for a in alerts[-ALERTS_SHOWN:][::-1]],
            "n_alerts": n_alerts}


def _panel_lines(ps: list[dict], absent=()) -> list[str]:
    return [f"{p['metric']}: residual {p['residual']}, worst alert {p['worst'] or 'none'}"
            + (" (absent from the source)" if p["metric"] in absent else "") for p in ps]


def _residual(v) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:+.2%}"


def _alert_row(a: dict) -> dict:
    g = as_float(a.get("fraction"))
    v = as_float(a.get("value"))
    return {"severity": str(a.get("severity", "")), "kind": str(a.get("kind", "")),
            "step": "" if a.get("step") is None else str(a.get("step")),
            "fraction": "" if g is None else f"{g:.1%}",
            "value": "" if v is None else f"{v:.4g}", "message": str(a.get("message", ""))}


def _png(draw: Callable[[], object]) -> bytes | None:
    """The PNG of the figure ``draw()`` returns (None: no figure), on matplotlib's Agg."""
    import matplotlib
    matplotlib.use("Agg")
    from ladder.reports.plots import png_bytes
    with _DRAWING:
        fig = draw()
        return None if fig is None else png_bytes(fig)


# ------------------------------------------------------------------------ the page


class LivePage:
    """Serve the page of ``state()`` (:func:`_answer`'s dict) on ``host:port`` (0: a free port).
    ``version()`` is a cheap fingerprint of what the state shows: the state is rebuilt only when
    it changes, and its chart drawn in the page's drawing thread, at most once per
    ``redraw_s``."""

    def __init__(self, state: Callable[[], dict], version: Callable[[], Hashable], *,
                 port: int = 0, host: str = "127.0.0.1", poll_ms: int = 2000,
                 title: str = "ladder: live watch", redraw_s: float = REDRAW_S):
        if not (isinstance(port, int) and 0 <= port <= 65535):
            raise InputError(f"must be in 0..65535, got {port!r}", field="--port",
                             exit_code=EX_USAGE)
        if not _loopback(host):
            raise InputError(f"the live page serves this machine only: expected a loopback "
                             f"address (127.0.0.1, localhost, ::1), got {str(host)[:60]!r}",
                             field="--host", exit_code=EX_USAGE)
        self.state_of, self.version, self.poll_ms = state, version, int(poll_ms)
        self.title, self.redraw_s = title, redraw_s
        self._lock = threading.Lock()
        self._key: Hashable = object()
        self._n = 0
        self._state: dict = {}
        self._body, self._body_of = b"{}", None
        # the chart: the newest state's drawing function waiting for the drawing thread, the
        # bytes of the last drawing and its number (0: none yet)
        self._pending: Callable[[], object] | None = None
        self._png: bytes | None = None
        self.drawings = 0
        self.draw_error: str | None = None
        self._wake, self._stop = threading.Event(), threading.Event()
        try:
            self.httpd = _PoolServer((host, port), _handler(self))
        except OSError as e:
            raise InputError(f"cannot serve on {host}:{port} ({e.strerror or e})",
                             field="--port", exit_code=EX_USAGE) from None
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        threading.Thread(target=self._draw_loop, daemon=True, name="live-page-chart").start()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def page(self) -> bytes:
        from ladder.reports.page import CSS  # the report's own look
        return (PAGE % {"title": html.escape(self.title), "poll_ms": self.poll_ms,
                        "css": CSS}).encode()

    def snapshot(self) -> dict:
        """The state object for the current version (rebuilt when the version changed)."""
        self.body()
        return self._state

    def body(self) -> bytes:
        """``/state.json``'s bytes for the current version and the newest drawing."""
        with self._lock:
            key = self.version()
            if key != self._key:
                self._key = key
                self._n += 1
                st = dict(self.state_of())
                self._pending = st.pop("chart", None)
                if self._pending is not None:
                    self._wake.set()
                st["version"] = self._n
                st["updated"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
                self._state = to_jsonable(st)
            if self._body_of != (self._n, self.drawings):
                self._body_of = (self._n, self.drawings)
                self._state = {**self._state, "chart": None if self._png is None
                               else f"chart.png?v={self.drawings}"}
                self._body = json.dumps(self._state, allow_nan=False,
                                        separators=(",", ":")).encode()
            return self._body

    def chart(self) -> bytes | None:
        """``/chart.png``'s bytes: the last drawing (None before the first)."""
        return self._png

    def _draw_loop(self) -> None:
        """The drawing thread: the newest pending chart, no sooner than ``redraw_s`` after the
        last drawing (the versions in between are never drawn)."""
        last = -math.inf
        while self._wake.wait() and not self._stop.is_set():
            if self._stop.wait(max(0.0, last + self.redraw_s - time.monotonic())):
                return
            with self._lock:
                draw, self._pending = self._pending, None
                self._wake.clear()
            if draw is None:
                continue
            try:
                png, error = _png(draw), None
            except Exception as e:  # noqa: BLE001 - the page lives on; the last chart stays
                png, error = self._png, f"{type(e).__name__}: {e}"
            last = time.monotonic()
            with self._lock:
                self._png, self.draw_error = png, error
                self.drawings += 1

    def host_allowed(self, header: str | None) -> bool:
        """``Host`` is a loopback name (127.0.0.1, localhost, [::1]), with this page's port when a
        port is given; no Host header is refused (HTTP/1.1 requires one)."""
        if not header:
            return False
        h = header.strip().lower()
        if h.startswith("["):
            name, _, rest = h.partition("]")
            name += "]"
            port = rest[1:] if rest.startswith(":") else ""
        else:
            name, _, port = h.partition(":")
        return not (port and port != str(self.port)) and _loopback(name)

    # ---------------------------------------------------------------- the two ways to feed it
    @classmethod
    def for_files(cls, *, runs=None, law=None, prereg=None, alerts=None, target_run=None,
                  **kw) -> LivePage:
        """The report's inputs from files, re-read when one of them changes (size or mtime)."""
        from ladder.reports.inputs import load_inputs

        def watched() -> list[Path]:
            paths = [Path(p) for p in (law, prereg, alerts) if p is not None]
            for d in (runs, target_run):
                if d is not None and Path(d).is_dir():
                    paths += sorted(Path(d).rglob("metrics.jsonl"))
                    paths += sorted(Path(d).rglob("summary.json"))
            return paths

        def version():
            out = []
            for p in watched():
                try:
                    st = p.stat()
                    out.append((str(p), st.st_size, st.st_mtime_ns))
                except OSError:
                    out.append((str(p), None, None))
            return tuple(out)

        def state():
            return files_state(load_inputs(runs=runs, law=law, prereg=prereg, alerts=alerts,
                                           target_run=target_run))
        return cls(state, version, **kw)

    @classmethod
    def for_watcher(cls, watcher, *, source: str | None = None, keymap=None, **kw) -> LivePage:
        """The page of a running :class:`ladder.predict.live.Watcher`, from the batches it judges
        (:class:`WatcherFeed`). ``source`` (the watcher's ``--source``, read through ``keymap``
        when given): a watcher restarted from its state file does not read what it judged
        before, so the page reads the run once more, in the background, from its start."""
        feed = WatcherFeed(watcher)
        if source is not None and (watcher.state.get("n_points") or 0) > 0:
            feed.backfill(source, keymap)
        kw.setdefault("title", f"ladder watch: {watcher.doc.get('target', {}).get('name')}")
        page = cls(feed.state, feed.version, **kw)
        page.feed = feed
        return page


class _LiveRun:
    """The watched run as the report's figures read a target (``RunData``'s name, status, plan,
    series), its series the page's downsampled points."""

    def __init__(self, name: str, steps, tokens, series: dict[str, Downsampled]):
        from ladder.reports.inputs import Series
        self.name, self.status, self.steps, self.planned_tokens = name, "running", steps, tokens
        self._series = {}
        for key, ds in series.items():
            x, y = ds.points()
            self._series[key] = Series(np.full(len(x), np.nan), x,
                                       x * (tokens or np.nan), y)

    def series(self, key: str):
        from ladder.reports.inputs import Series
        empty = np.array([])
        return self._series.get(key) or Series(empty, empty, empty, empty)

    def nonfinite_steps(self, key: str) -> list[float]:  # NaN/Inf: the watcher's alerts say so
        return []


class WatcherFeed:
    """The watcher's page, fed by the watcher itself: a listener (``watcher.listeners``) folds
    every judged batch's metric and train loss into :class:`Downsampled` series; the state is
    built from those, the watcher's alerts and its pre-registration."""

    def __init__(self, watcher):
        self.w = watcher
        self._lock = threading.Lock()
        self.metric = Downsampled()
        self.train = Downsampled()  # the run's train loss (figdata.TRAIN_KEY), drawn faint
        self.per_metric: dict[str, Downsampled] = {}  # a multi-metric watch: one per key
        self.batches = 0
        watcher.listeners.append(self.on_batch)

    def on_batch(self, view, batch) -> None:
        from ladder.predict.watch import row_fractions
        from ladder.reports.figdata import TRAIN_KEY

        if not len(batch):
            return
        g = row_fractions(view, batch)
        with self._lock:
            self.batches += 1
            for key in getattr(view, "metrics", ()):  # a multi-metric watch
                y = batch.cols.get(key)
                if y is not None:
                    self.per_metric.setdefault(key, Downsampled()).add(g, y)
            for key, ds in ((TRAIN_KEY, self.train), (view.metric, self.metric)):
                y = batch.cols.get(key)
                if y is not None:
                    ds.add(g, y)

    def backfill(self, source: str, keymap=None) -> None:
        """Read the run once from a fresh source (``open_source(source)``), in a daemon thread,
        into the same series (a bucket keeps its extremes, so rows the watcher also brings count
        once in effect)."""
        def run():
            from ladder.predict.watch import Batch
            from ladder.sources import KeyMappedSource, open_source
            try:
                src = open_source(source)
                if keymap is not None:
                    src = KeyMappedSource(src, keymap)
                keys, keep = self.w.keys, self.w.keep
                while True:
                    p = src.poll_batch(keys, keep)
                    b = p.batch if p.batch is not None else \
                        Batch.from_rows(p.rows, keys=keys, keep=keep)
                    self.on_batch(self.w.view, b)
                    if not p.more:
                        break
            except Exception as e:  # noqa: BLE001 - the page lives on without its history
                self.history_error = f"{type(e).__name__}: {e}"
        self.history_error: str | None = None
        self.history_thread = threading.Thread(target=run, daemon=True,
                                               name="live-page-history")
        self.history_thread.start()

    def version(self) -> Hashable:
        st = self.w.state
        return (len(self.w.all_alerts), st.get("n_points"), st.get("last_step"),
                self.w.doc.get("sha256"), self.batches, st.get("worst"))

    def inputs(self, alerts: list[dict]):
        """The report's inputs of the watch: its pre-registration, ``alerts`` and the run as
        the page's downsampled series (``ReportInputs``, for the report's figures)."""
        from ladder.predict.prereg_view import target_of
        from ladder.reports.figdata import TRAIN_KEY
        from ladder.reports.inputs import ReportInputs
        doc = self.w.doc
        t = target_of(doc)
        with self._lock:
            run = _LiveRun(str(t.get("name") or "target"), t.get("steps"), t.get("tokens"),
                           self.per_metric if getattr(self.w, "multi", False)
                           else {TRAIN_KEY: self.train, self.w.view.metric: self.metric})
        return ReportInputs(rungs=[], target=run, law=None, prereg=doc, alerts=alerts,
                            notes=[])

    def state(self) -> dict:
        from ladder.predict.prereg_view import band_level
        from ladder.reports import updated
        from ladder.reports.metrics import plot_metrics
        from ladder.reports.plots import plot_watch
        w = self.w
        alerts = [to_jsonable(a.to_dict()) for a in w.all_alerts[-ALERTS_SHOWN:]]
        inp = self.inputs(alerts)
        if getattr(w, "multi", False):
            return self._multi_state(alerts, lambda: plot_metrics(inp))
        with self._lock:
            last = self.metric.last
        st = w.state
        lines, tone = verdict(
            str((w.doc.get("target") or {}).get("name") or "target"), w.view.metric,
            inp.forecast, band_level(w.doc), last, worst=st.get("worst"),
            not_applicable=st.get("not_applicable"),
            counts=Counter(a.severity for a in w.all_alerts),
            detail=f"{st.get('n_points', 0):,} points and {st.get('n_evals', 0):,} evals "
                   f"judged, last step {st.get('last_step')}.")
        up = updated.of_watcher(w)  # issue 40: labelled, beside the frozen band
        if updated.line(up, w.view.metric):
            lines.insert(1, updated.line(up, w.view.metric))
        return _answer(lines, tone, alerts, len(w.all_alerts),
                       lambda: plot_watch(inp, updated=updated.curve(up)))

    def _multi_state(self, alerts: list[dict], chart) -> dict:
        """A multi-metric watch: the verdict per metric, in the watcher's residual order (its
        smoothed residual relative to the forecast, largest first)."""
        from ladder.predict.watch.multi import metric_summary, residual_order
        w = self.w
        rows = {r["metric"]: r for r in metric_summary(w.view, w.state, w.all_alerts)}
        ps = [{"metric": k, "residual": _residual(rows[k]["residual_rel"]),
               "worst": rows[k]["worst"]} for k in residual_order(w.view, w.state)]
        st = w.state
        lines = _panel_lines(ps, [k for k, r in rows.items() if r["absent"]])
        lines.append(f"{st.get('n_points', 0):,} points and {st.get('n_evals', 0):,} evals "
                     f"judged, last step {st.get('last_step')}; worst: "
                     f"{st.get('worst') or 'none'}.")
        tone = {"critical": "bad", "warn": "warn"}.get(st.get("worst") or "", "")
        return _answer(lines, tone, alerts, len(w.all_alerts), chart)


def verdict(name: str, metric: str, band, level, last, *, worst: str | None,
            not_applicable: str | None, counts: dict[str, int], detail: str | None = None
            ) -> tuple[list[str], str]:
    """The verdict lines of the page and their tone (ok | warn | bad): the latest value of the
    metric against the registered band, what no longer applies, the alerts so far."""
    tone = {"critical": "bad", "warn": "warn"}.get(worst or "", "ok")
    lines = []
    if not_applicable:
        tone = "warn" if tone == "ok" else tone
        lines.append(f"{name}: the forecast no longer applies ({not_applicable}); nothing is "
                     f"compared from there on.")
    elif last is not None and band is not None:
        e, lo, hi = (float(v) for v in band.at(last[0]))
        if math.isfinite(lo) and math.isfinite(hi):
            # one eval outside the band is not an alert (the loss rule waits for evals in a
            # row outside a wider band): the words say so and the tone stays the alerts' own
            side = "inside" if lo <= last[1] <= hi else \
                f"{'above' if last[1] > hi else 'below'} the band at this eval" + \
                ("" if worst in ("warn", "critical") else
                 " (not an alert: the watcher warns when it stays out)")
        else:
            side = "band missing, not judged"
        lines.append(f"{name} latest {metric} (at {last[0]:.0%} of the run): {last[1]:.4f}; "
                     f"forecast {e:.4f} [{lo:.4f}, {hi:.4f}]"
                     + (f" ({level:.0%} band)" if level else "") + f": {side}.")
    else:
        lines.append(f"{name}: no {metric} to compare yet.")
    if detail:
        lines.append(detail)
    lines.append(f"Alerts: {counts.get('critical', 0)} critical, {counts.get('warn', 0)} "
                 f"warning, {counts.get('info', 0)} info; worst: {worst or 'none'}.")
    return lines, tone


def files_state(inp) -> dict:
    """The page's state from report inputs (``ladder.reports.inputs.ReportInputs``): the
    report's verdict words and its watch figure (a multi-metric pre-registration: its small
    multiples)."""
    from ladder.reports.metrics import plot_metrics
    from ladder.reports.plots import plot_watch
    metric = inp.metric
    t = inp.target
    last = None
    if t is not None:
        ds = Downsampled()
        ds.add(t.series(metric).fraction, t.series(metric).value)
        last = ds.last
    alerts = list(inp.alerts or [])
    counts = Counter(str(a.get("severity")) for a in alerts)
    worst = next((k for k in ("critical", "warn", "info") if counts.get(k)), None)
    na = next((str(a.get("message")) for a in alerts if a.get("kind") == "not_applicable"), None)
    level = inp.level if inp.prereg else None
    lines, tone = verdict(inp.target_name or "target", metric, inp.forecast, level, last,
                          worst=worst, not_applicable=na, counts=counts)
    if t is None:
        lines += list(inp.notes[:2])
    if inp.panels:  # multi-metric: no single metric; the panels carry the curves
        ps = [{"metric": p.metric, "residual": _residual(p.residual), "worst": p.worst}
              for p in inp.panels]
        return _answer(_panel_lines(ps) + lines[-1:], tone, alerts, len(alerts),
                       lambda: plot_metrics(inp))
    return _answer(lines, tone, alerts, len(alerts), lambda: plot_watch(inp))


# ------------------------------------------------------------------------ the server


class _PoolServer(HTTPServer):
    """An HTTP server answering from a pool of ``WORKERS`` threads, with a listen queue of
    ``QUEUE`` (the standard library's 5 left 52 of 200 simultaneous clients unanswered)."""

    request_queue_size = QUEUE
    daemon_threads = True

    def __init__(self, address, handler):
        # before binding: a failed bind calls server_close, which shuts the pool down
        self.pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="live-page")
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        try:
            self.pool.submit(self._answer, request, client_address)
        except RuntimeError:  # the pool is shut down: the server is closing
            self.shutdown_request(request)

    def _answer(self, request, client_address):
        try:
            self.finish_request(request, client_address)
        except OSError:  # the client went away or timed out: nothing to answer
            pass
        finally:
            self.shutdown_request(request)

    def server_close(self):
        super().server_close()
        self.pool.shutdown(wait=False, cancel_futures=True)


def _loopback(host) -> bool:
    """``host`` (a bind address) is this machine's loopback: localhost, 127/8 or ::1."""
    if not isinstance(host, str):
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _HeadReader(io.RawIOBase):
    """A connection's bytes, each read given what is left of one deadline (the socket's own
    timeout restarts at every byte that arrives)."""

    def __init__(self, sock, deadline: float):
        self.sock, self.deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"request head not complete within {HEAD_DEADLINE_S:g} s")
        self.sock.settimeout(min(left, TIMEOUT_S))
        return self.sock.recv_into(b)


def _handler(page: LivePage):
    class Handler(BaseHTTPRequestHandler):
        timeout = TIMEOUT_S  # socket timeout of the connection (StreamRequestHandler)

        def setup(self):
            super().setup()
            # HTTP/1.0: one request a connection, so this is the deadline of its head
            self.rfile = io.BufferedReader(_HeadReader(self.connection,
                                                       time.monotonic() + HEAD_DEADLINE_S))

        def log_message(self, fmt, *args):  # no access log on stderr
            return

        def _send(self, code: int, body: bytes, ctype: str):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802 - the http.server API
            self.connection.settimeout(TIMEOUT_S)  # the answer's writes: the connection's own
            hosts = self.headers.get_all("Host") or []
            if len(hosts) != 1 or not page.host_allowed(hosts[0]):
                # another name for this machine (DNS rebinding): not this page's audience
                return self._send(403, b"forbidden: unexpected Host header", "text/plain")
            path = self.path.split("?", 1)[0]
            try:
                if path in ("/", "/index.html"):
                    return self._send(200, page.page(), "text/html; charset=utf-8")
                if path == "/state.json":
                    return self._send(200, page.body(), "application/json")
                if path == "/chart.png" and page.chart() is not None:
                    return self._send(200, page.chart(), "image/png")
                return self._send(404, b"not found", "text/plain")
            except InputError as e:  # a bad input file: said on the page, the server lives on
                return self._send(500, f"{e}".encode(), "text/plain")
            except (BrokenPipeError, ConnectionResetError):
                return None
    return Handler


def serve_forever(page: LivePage, *, stop: threading.Event | None = None) -> None:
    """Block until Ctrl-C (or ``stop``), then close the server."""
    stop = stop or threading.Event()
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        page.close()


__all__ = ["LivePage", "WatcherFeed", "Downsampled", "serve_forever", "ALERTS_SHOWN"]
