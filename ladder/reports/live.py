"""The live page: the watch chart, the verdict and the alerts, served on 127.0.0.1 and refreshed in
the browser as points and alerts arrive (`ladder watch --serve`, `ladder report --serve`).

Standard library only (``http.server``) and no external assets: ``/`` is one HTML page with
inline CSS and a few lines of JavaScript that poll ``/state.json`` every ``poll_ms``; when its
``version`` changes the page redraws the chart (an inline SVG the script draws from the state's
``chart``: the registered band, the live metric, the train loss, alert marks), the verdict and
the alerts table. Nothing is drawn on the server: a refresh is the state object of the version.

Two feeds, one page:

- :meth:`LivePage.for_watcher` follows a running :class:`ladder.predict.live.Watcher`: it listens to
  the batches the watcher judges (its incremental read of the source; the metrics file is never
  read again for the page) and folds them into :class:`Downsampled` series, a fixed number of
  buckets along the run, so memory and the size of a refresh stay bounded however many lines the
  run logs (a 100-day hero logs every step).
- :meth:`LivePage.for_files` (`report --serve`) re-reads the report's input files when one of
  them changes and downsamples what it draws the same way.

The server binds a loopback address only and answers only requests whose one ``Host`` header
is a loopback name (127.0.0.1, localhost, [::1], with this page's port): a page elsewhere that
points a DNS name at 127.0.0.1 gets 403 (DNS rebinding). It serves from a bounded pool of threads
with a listen queue of 256, and a request head must arrive whole within ``HEAD_DEADLINE_S`` (a
deadline for the head, not a timeout per read: a client trickling a byte every 2 s held a worker
for ever, and two dozen of them every worker, issue 39), so 200 clients at once are all answered
and a slow one holds one worker for at most ``HEAD_DEADLINE_S``.
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
WORKERS = 16        # threads answering requests (each answer is a cached object: ~ms)
QUEUE = 256         # the listen backlog (http.server's default of 5 drops a crowd)
TIMEOUT_S = 5.0     # per connection: a client that sends nothing is dropped after this
# the whole request head (request line and headers): a browser on this machine sends it in one
# write, well under a millisecond; a client still sending after this is dropped
HEAD_DEADLINE_S = 2.0
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
SEVERITY_COLORS = {"info": "#868e96", "warn": "#f08c00", "critical": "#d62728"}

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>%(title)s</title>
<style>
body { font: 15px/1.45 -apple-system, "Segoe UI", Roboto, Arial, sans-serif; margin: 0;
       background: #fafafa; color: #1a1a1a; }
main { max-width: 1280px; margin: 0 auto; padding: 20px 32px 48px; }
#status { color: #666; font-size: 13px; }
#verdict { background: #fff; border-left: 5px solid #2b6cb0; padding: 8px 16px; }
#verdict.warn { border-left-color: #f08c00; } #verdict.bad { border-left-color: #d62728; }
figure { margin: 12px 0; background: #fff; padding: 8px; border: 1px solid #e4e4e4; }
svg { width: 100%%; height: auto; display: block; font-size: 12px; }
#panels { display: grid; grid-template-columns: repeat(auto-fill, minmax(300px, 1fr));
          gap: 8px; } #panels figure { margin: 0; } #panels svg { font-size: 28px; }
table { border-collapse: collapse; background: #fff; font-size: 13px; }
th, td { border: 1px solid #e0e0e0; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f1f3f5; }
.sev-critical { color: #d62728; font-weight: 600; } .sev-warn { color: #f08c00; font-weight: 600; }
.sev-info { color: #8a8a8a; }
</style></head><body><main>
<h1>%(title)s</h1>
<p id="status">connecting...</p>
<div id="verdict"><ul id="verdict-lines"></ul></div>
<figure id="fig"><svg id="chart" viewBox="0 0 1000 430" role="img"
 aria-label="the run against its forecast band"></svg><figcaption id="legend"></figcaption>
</figure>
<div id="panels"></div>
<h2>Alerts (<span id="n-alerts">0</span>)</h2>
<table><thead><tr><th>step</th><th>fraction</th><th>severity</th><th>kind</th><th>value</th>
<th>message</th></tr></thead><tbody id="alerts"></tbody></table>
<script>
(function () {
  var seen = null, POLL = %(poll_ms)d, NS = 'http://www.w3.org/2000/svg';
  var W = 1000, H = 430, L = 70, R = 20, T = 15, B = 45;
  function cell(tr, text, cls) {
    var td = document.createElement('td'); td.textContent = text;
    if (cls) { td.className = cls; } tr.appendChild(td);
  }
  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) { e.setAttribute(k, attrs[k]); }
    parent.appendChild(e); return e;
  }
  function chart(c, svg, legend, clipId) {  // x = fraction of the run, y = the metric
    svg = svg || document.getElementById('chart'); svg.textContent = '';
    legend = legend || document.getElementById('legend'); clipId = clipId || 'plot';
    if (!c) { return 0; }
    var x0 = c.xlim[0], x1 = c.xlim[1], y0 = c.ylim[0], y1 = c.ylim[1];
    function X(v) { return L + (v - x0) / (x1 - x0) * (W - L - R); }
    function Y(v) { return H - B - (v - y0) / (y1 - y0) * (H - T - B); }
    function pts(xs, ys) {
      var out = [];
      for (var i = 0; i < xs.length; i++) {
        if (ys[i] !== null) { out.push(X(xs[i]).toFixed(1) + ',' + Y(ys[i]).toFixed(1)); }
      }
      return out.join(' ');
    }
    el('rect', {x: L, y: T, width: W - L - R, height: H - T - B, fill: '#fff',
                stroke: '#ccc'}, svg);
    c.yticks.forEach(function (v) {
      el('line', {x1: L, x2: W - R, y1: Y(v), y2: Y(v), stroke: '#eee'}, svg);
      el('text', {x: L - 6, y: Y(v) + 4, 'text-anchor': 'end'}, svg).textContent = v;
    });
    [0, 0.25, 0.5, 0.75, 1].forEach(function (v) {
      el('text', {x: X(v), y: H - B + 16, 'text-anchor': 'middle'}, svg).textContent =
        Math.round(v * 100) + '%%';
    });
    el('text', {x: (L + W - R) / 2, y: H - 8, 'text-anchor': 'middle'}, svg).textContent =
      'fraction of the planned run';
    el('text', {x: 14, y: (T + H - B) / 2, 'text-anchor': 'middle',
                transform: 'rotate(-90 14 ' + (T + H - B) / 2 + ')'}, svg).textContent =
      c.metric;
    var clip = el('clipPath', {id: clipId}, el('defs', {}, svg));
    el('rect', {x: L, y: T, width: W - L - R, height: H - T - B}, clip);
    var g = el('g', {'clip-path': 'url(#' + clipId + ')'}, svg);
    var b = c.band;
    if (b && b.x.length) {
      var upper = pts(b.x, b.hi), lower = pts(b.x.slice().reverse(), b.lo.slice().reverse());
      if (upper && lower) {
        el('polygon', {points: upper + ' ' + lower, fill: '#4c6ef5', 'fill-opacity': 0.15},
           g);
      }
      el('polyline', {points: pts(b.x, b.mid), fill: 'none', stroke: '#3b5bdb',
                      'stroke-dasharray': '6 4', 'stroke-width': 1.4}, g);
    }
    c.alerts.forEach(function (a) {
      el('line', {x1: X(a.x), x2: X(a.x), y1: T, y2: a.loss ? H - B : T + 12,
                  stroke: a.color, 'stroke-width': a.loss ? 1.4 : 3, 'stroke-opacity': 0.85},
         g).setAttribute('data-kind', a.kind);
    });
    c.series.forEach(function (s) {
      el('polyline', {points: pts(s.x, s.y), fill: 'none', stroke: s.color,
                      'stroke-width': s.width, 'stroke-opacity': s.opacity}, g)
        .setAttribute('data-name', s.name);
    });
    legend.textContent = c.legend;
    return c.series.reduce(function (n, s) { return n + s.x.length; }, 0);
  }
  function panels(ps) {  // a multi-metric watch: one small chart per metric, worst first
    var box = document.getElementById('panels'); box.textContent = '';
    var n = 0;
    (ps || []).forEach(function (p, i) {
      var fig = document.createElement('figure'); fig.setAttribute('data-metric', p.metric);
      var svg = document.createElementNS(NS, 'svg');
      svg.setAttribute('viewBox', '0 0 1000 430'); fig.appendChild(svg);
      var cap = document.createElement('figcaption');
      cap.className = p.worst ? 'sev-' + p.worst : ''; fig.appendChild(cap);
      box.appendChild(fig);
      n += chart(p.chart, svg, cap, 'plot' + i);
      cap.textContent = p.metric + ': residual ' + p.residual + '; worst ' +
        (p.worst || 'none');
    });
    return n;
  }
  function draw(s) {
    var n = chart(s.chart) + panels(s.panels);
    document.getElementById('fig').style.display = s.chart ? '' : 'none';
    document.body.setAttribute('data-figure', n + ' points v' + s.version);
    var ul = document.getElementById('verdict-lines'); ul.textContent = '';
    s.verdict.forEach(function (x) {
      var li = document.createElement('li'); li.textContent = x; ul.appendChild(li); });
    document.getElementById('verdict').className = s.tone;
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
        if (s.version !== seen) { seen = s.version; draw(s); }
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
    """A series along the run (x = fraction of the planned run) kept in fixed buckets: for each
    bucket of width 1/BUCKETS its lowest and its highest point (a spike survives), so memory is
    O(BUCKETS) and what is drawn is at most 2 points per bucket, however many are added."""

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
            keep = np.ones(len(xs), bool)
            keep[1:] = (xs[1:] != xs[:-1]) | (ys[1:] != ys[:-1])
            xs, ys = xs[keep], ys[keep]
        return xs, ys


# ------------------------------------------------------------------------ the chart


def _round(v, digits: int = 5):
    return None if v is None or not math.isfinite(v) else round(float(v), digits)


def _list(values, digits: int = 5) -> list:
    """Numbers rounded for the page (5 decimals: a 1e-5 loss difference is below a pixel),
    NaN/inf as null; numpy does the rounding (a refresh rounds thousands)."""
    a = np.round(np.asarray(values, float), digits)
    out = a.tolist()
    bad = np.flatnonzero(~np.isfinite(a))
    for i in bad.tolist():
        out[i] = None
    return out


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    span = hi - lo
    if not span > 0:
        return [_round(lo)]
    step = 10 ** math.floor(math.log10(span / n))
    for m in (1, 2, 2.5, 5, 10):
        if span / (m * step) <= n:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [_round(first + k * step, 6) for k in range(int((hi - first) / step) + 1)]


def chart_state(band, series: list[dict], alerts: list[dict], *, metric: str,
                level: float | None) -> dict:
    """The ``chart`` object of the page: ``band`` (a ``ladder.predict.prereg_view.ForecastBand`` or
    None), ``series`` ({name, x, y, color, width, opacity}, already downsampled), ``alerts``
    (as written: drawn at their ``fraction``; lines for those about the metric, as on the
    report's watch figure, ticks for the rest); the y range from the band and the series after
    the first 5% of the run (the first evals sit far above), as the report's watch figure does."""
    # the report's watch figure's own rules
    from ladder.reports.figdata import is_loss_alert, watch_ylim, y_limits
    out_band = None
    if band is not None:
        ok = band.fraction > 0
        out_band = {"x": _list(band.fraction[ok]), "mid": _list(band.loss[ok]),
                    "lo": _list(band.lo[ok]), "hi": _list(band.hi[ok])}

    def cat(ss, k):
        return np.concatenate([np.asarray(s[k], float) for s in ss]) if ss else np.array([])
    scaled = [s for s in series if s.get("scale")]
    ylim = watch_ylim(band, cat(scaled, "x"), cat(scaled, "y")) or \
        y_limits(cat(series, "y"), 0.08) or (0.0, 1.0)
    xmax = max([1.0] + [float(np.max(s["x"])) for s in series if len(s["x"])])
    marks = [{"x": _round(as_float(a.get("fraction"))), "kind": a.get("kind"),
              "loss": is_loss_alert(a),
              "color": SEVERITY_COLORS.get(a.get("severity"), SEVERITY_COLORS["info"])}
             for a in alerts
             if as_float(a.get("fraction")) is not None and a.get("severity") != "info"]
    names = [s["name"] for s in series]
    legend = (f"dashed: pre-registered forecast, shaded: its {level:.0%} band; "
              if band is not None and level else "") + "; ".join(
        f"{s['name']} ({s['n']:,} points, {len(s['x']):,} drawn)" for s in series) + \
        ("; lines: loss alerts, ticks on top: other alerts" if marks else "")
    return {"xlim": [0.0, _round(min(xmax, FRACTION_MAX))], "ylim": [_round(v, 6) for v in ylim],
            "yticks": _nice_ticks(*ylim), "band": out_band, "metric": metric, "names": names,
            "series": [{"name": s["name"], "x": _list(s["x"]),
                        "y": _list(s["y"]), "color": s["color"],
                        "width": s["width"], "opacity": s["opacity"]} for s in series],
            "alerts": marks, "legend": legend}


def _series(name: str, ds: Downsampled, color: str, width: float, opacity: float,
            scale: bool) -> dict:
    x, y = ds.points()
    return {"name": name, "x": x, "y": y, "n": ds.n, "color": color, "width": width,
            "opacity": opacity, "scale": scale}


def _curves(metric: str, ds: Downsampled, train: Downsampled) -> list[dict]:
    """The watched metric's series and, faint and not setting the y range, the train loss."""
    return ([_series("train/loss", train, "#adb5bd", 1.0, 0.8, False)] if train.n else []) + \
        [_series(metric, ds, "#e8590c", 2.0, 1.0, True)]


def _answer(lines: list[str], tone: str, alerts: list[dict], n_alerts: int, *,
            chart: dict | None = None, panels: list[dict] | None = None) -> dict:
    """The page's state: the chart (or a multi-metric watch's panels), the verdict lines and
    their tone, the newest alerts first."""
    return {"chart": chart, "panels": panels or [], "verdict": lines,
            "tone": {"ok": ""}.get(tone, tone),
            "alerts": [_alert_row(a) for a in alerts[-ALERTS_SHOWN:][::-1]],
            "n_alerts": n_alerts}


def _panel_lines(ps: list[dict], absent=()) -> list[str]:
    return [f"{p['metric']}: residual {p['residual']}, worst alert {p['worst'] or 'none'}"
            + (" (absent from the source)" if p["metric"] in absent else "") for p in ps]


def _alert_row(a: dict) -> dict:
    g = as_float(a.get("fraction"))
    v = as_float(a.get("value"))
    return {"severity": str(a.get("severity", "")), "kind": str(a.get("kind", "")),
            "step": "" if a.get("step") is None else str(a.get("step")),
            "fraction": "" if g is None else f"{g:.1%}",
            "value": "" if v is None else f"{v:.4g}", "message": str(a.get("message", ""))}


# ------------------------------------------------------------------------ the page


class LivePage:
    """Serve the live page of ``state()`` (a JSON-ready dict with the page's ``chart``,
    ``verdict``, ``tone``, ``alerts``, ``n_alerts``) on ``host:port`` (port 0: a free one).
    ``version()`` is a cheap fingerprint of what the state shows; the state is rebuilt (and its
    JSON encoded) only when it changes. ``before_state`` (tests) runs before each
    ``/state.json`` is answered."""

    def __init__(self, state: Callable[[], dict], version: Callable[[], Hashable], *,
                 port: int = 0, host: str = "127.0.0.1", poll_ms: int = 2000,
                 title: str = "ladder: live watch",
                 before_state: Callable[[], None] | None = None):
        if not (isinstance(port, int) and 0 <= port <= 65535):
            raise InputError(f"must be in 0..65535, got {port!r}", field="--port",
                             exit_code=EX_USAGE)
        if not _loopback(host):
            raise InputError(f"the live page serves this machine only: expected a loopback "
                             f"address (127.0.0.1, localhost, ::1), got {str(host)[:60]!r}",
                             field="--host", exit_code=EX_USAGE)
        self.state_of, self.version, self.poll_ms = state, version, int(poll_ms)
        self.title = title
        self.before_state = before_state
        self._lock = threading.Lock()
        self._key: Hashable = object()
        self._n = 0
        self._state: dict = {}
        self._body = b"{}"
        try:
            self.httpd = _PoolServer((host, port), _handler(self))
        except OSError as e:
            raise InputError(f"cannot serve on {host}:{port} ({e.strerror or e})",
                             field="--port", exit_code=EX_USAGE) from None
        bound = self.httpd.server_address[1]
        self.allowed_hosts = set(LOOPBACK_NAMES)
        self.port = bound
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def page(self) -> bytes:
        return (PAGE % {"title": html.escape(self.title), "poll_ms": self.poll_ms}).encode()

    def snapshot(self) -> dict:
        """The state object for the current version (rebuilt when the version changed)."""
        self._refresh()
        return self._state

    def body(self) -> bytes:
        """``/state.json``'s bytes for the current version."""
        self._refresh()
        return self._body

    def _refresh(self) -> None:
        with self._lock:
            key = self.version()
            if key != self._key:
                self._key = key
                self._n += 1
                st = dict(self.state_of())
                st["version"] = self._n
                st["updated"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
                # the chart is built JSON-ready (numbers rounded, NaN as null); the rest,
                # alerts and words, goes through to_jsonable
                rest = to_jsonable({k: v for k, v in st.items() if k != "chart"})
                st = {**rest, "chart": st.get("chart")}
                self._state = st
                self._body = json.dumps(st, allow_nan=False, separators=(",", ":")).encode()

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
        if port and port != str(self.port):
            return False
        return name in self.allowed_hosts or (name[:1].isdigit() or name[:1] == "[") and \
            _loopback(name)

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


class WatcherFeed:
    """What the watcher's page shows, kept up to date by the watcher itself: it registers a
    listener (``watcher.listeners``) that folds every judged batch's metric and train loss into
    :class:`Downsampled` series; the page's state is built from those, the watcher's alerts and
    its pre-registration, never from the metrics file."""

    def __init__(self, watcher):
        from ladder.predict.prereg_view import band_level, forecast_band

        self.w = watcher
        self._lock = threading.Lock()
        self.metric = Downsampled()
        self.train = Downsampled()
        self.per_metric: dict[str, Downsampled] = {}  # a multi-metric watch: one per key
        self.batches = 0
        self._band_of = forecast_band
        self._level_of = band_level
        watcher.listeners.append(self.on_batch)

    def on_batch(self, view, batch) -> None:
        from ladder.predict.watch import row_fractions

        if not len(batch):
            return
        g = row_fractions(view, batch)
        with self._lock:
            self.batches += 1
            for key in getattr(view, "metrics", ()):  # a multi-metric watch
                y = batch.cols.get(key)
                if y is not None:
                    self.per_metric.setdefault(key, Downsampled()).add(g, y)
            y = batch.cols.get(view.metric)
            if y is not None:
                self.metric.add(g, y)
            t = batch.cols.get("train/loss")
            if t is not None:
                self.train.add(g, t)

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

    def state(self) -> dict:
        if getattr(self.w, "multi", False):
            return self._multi_state()
        w = self.w
        doc = w.doc
        band = self._band_of(doc)
        level = self._level_of(doc)
        metric = w.view.metric
        with self._lock:
            series = _curves(metric, self.metric, self.train)
            last = self.metric.last
        alerts = [to_jsonable(a.to_dict()) for a in w.all_alerts[-ALERTS_SHOWN:]]
        lines, tone = watcher_verdict(w, band, level, last)
        from ladder.reports import updated
        up = updated.of_watcher(w)  # issue 40: labelled, beside the frozen band
        series += updated.series(up)
        if updated.line(up, metric):
            lines.insert(1, updated.line(up, metric))
        return _answer(lines, tone, alerts, len(w.all_alerts),
                       chart=chart_state(band, series, alerts, metric=metric, level=level))

    def _multi_state(self) -> dict:
        """A multi-metric watch: the panels, in the watcher's residual order (its smoothed
        residual relative to the forecast, largest first)."""
        from ladder.predict.watch.multi import metric_doc, metric_summary, residual_order
        w = self.w
        level = self._level_of(w.doc)
        alerts = [to_jsonable(a.to_dict()) for a in w.all_alerts[-ALERTS_SHOWN:]]
        rows = {r["metric"]: r for r in metric_summary(w.view, w.state, w.all_alerts)}
        ps = []
        with self._lock:
            for key in residual_order(w.view, w.state):
                band = self._band_of(metric_doc(w.doc, key))
                r = rows[key]
                ps.append(_panel(key, band, self.per_metric.get(key, Downsampled()),
                                 [a for a in alerts if a.get("metric") == key], level,
                                 r["residual_rel"], r["worst"]))
        st = w.state
        lines = _panel_lines(ps, [k for k, r in rows.items() if r["absent"]])
        lines.append(f"{st.get('n_points', 0):,} points and {st.get('n_evals', 0):,} evals "
                     f"judged, last step {st.get('last_step')}; worst: "
                     f"{st.get('worst') or 'none'}.")
        tone = {"critical": "bad", "warn": "warn"}.get(st.get("worst") or "", "")
        return _answer(lines, tone, alerts, len(w.all_alerts), panels=ps)


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


def watcher_verdict(w, band, level, last) -> tuple[list[str], str]:
    """The verdict of a watcher's page, from its state and alerts."""
    st = w.state
    counts = Counter(a.severity for a in w.all_alerts)
    return verdict(str((w.doc.get("target") or {}).get("name") or "target"), w.view.metric,
                   band, level, last, worst=st.get("worst"),
                   not_applicable=st.get("not_applicable"), counts=counts,
                   detail=f"{st.get('n_points', 0):,} points and {st.get('n_evals', 0):,} evals "
                          f"judged, last step {st.get('last_step')}.")


def _panel(metric: str, band, ds: Downsampled, alerts: list[dict], level, residual,
           worst) -> dict:
    series = [_series(metric, ds, "#e8590c", 2.0, 1.0, True)] if ds.n else []
    res = "-" if residual is None or not math.isfinite(residual) else f"{residual:+.2%}"
    return {"metric": metric, "residual": res, "worst": worst,
            "chart": chart_state(band, series, alerts, metric=metric, level=level)}


def files_panels(inp) -> list[dict]:
    """The small multiples of a multi-metric pre-registration (``reports.metrics``): one chart
    per metric, largest residual first ([] for a single-metric one)."""
    out = []
    level = inp.level if inp.prereg else None
    for p in inp.panels:
        ds = Downsampled()
        if p.series is not None:
            ds.add(p.series.fraction, p.series.value)
        out.append(_panel(p.metric, p.band, ds, p.alerts, level, p.residual, p.worst))
    return out


def files_state(inp) -> dict:
    """The page's state from report inputs (``ladder.reports.inputs.ReportInputs``): the target's
    metric and train loss downsampled as a watcher's page draws them."""
    metric = inp.metric
    t = inp.target
    ds = {key: Downsampled() for key in (metric, "train/loss")}
    for key in ds if t is not None else ():
        s = t.series(key)
        if s is not None and len(s):
            ds[key].add(s.fraction, s.value)
    series = _curves(metric, ds[metric], ds["train/loss"]) if t is not None else []
    last = ds[metric].last
    alerts = list(inp.alerts or [])
    counts = Counter(str(a.get("severity")) for a in alerts)
    worst = next((k for k in ("critical", "warn", "info") if counts.get(k)), None)
    na = next((str(a.get("message")) for a in alerts if a.get("kind") == "not_applicable"), None)
    level = inp.level if inp.prereg else None
    lines, tone = verdict(inp.target_name or "target", metric, inp.forecast, level, last,
                          worst=worst, not_applicable=na, counts=counts)
    if t is None:
        lines += list(inp.notes[:2])
    ps = files_panels(inp)
    if ps:  # multi-metric: no single metric; the panels carry the curves
        return _answer(_panel_lines(ps) + lines[-1:], tone, alerts, len(alerts), panels=ps)
    return _answer(lines, tone, alerts, len(alerts),
                   chart=chart_state(inp.forecast, series, alerts, metric=metric, level=level))


# ------------------------------------------------------------------------ the server


class _PoolServer(HTTPServer):
    """An HTTP server answering from a bounded pool of threads (``WORKERS``), with a listen
    queue of ``QUEUE`` (the standard library's 5 left 52 of 200 simultaneous clients without an
    answer in 20 s)."""

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
                    if page.before_state is not None:
                        page.before_state()
                    return self._send(200, page.body(), "application/json")
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
