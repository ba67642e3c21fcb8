"""The live page: the watch figure, the verdict and the alerts, served on 127.0.0.1 and refreshed in
the browser as points and alerts arrive (`ladder report --serve`, `ladder watch --serve`).

Standard library only (``http.server``) and no external assets: ``/`` is one HTML page with
inline CSS and a few lines of JavaScript that poll ``/state.json`` every ``poll_ms``; when its
``version`` changes (an input file grew, the watcher judged new rows or raised an alert) the page
reloads ``/watch.png`` and redraws the verdict and the alerts table. Figures are drawn by the
report's own :func:`reports.plots.plot_watch` from the same inputs, once per version.
"""

from __future__ import annotations

import html
import json
import threading
import time
from collections.abc import Callable, Hashable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ladder.io import EX_USAGE, InputError, to_jsonable

ALERTS_SHOWN = 200  # the newest alerts in the table (the page stays light over 100 days)

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
figure img { max-width: 100%%; height: auto; display: block; margin: 0 auto; }
table { border-collapse: collapse; background: #fff; font-size: 13px; }
th, td { border: 1px solid #e0e0e0; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f1f3f5; }
.sev-critical { color: #d62728; font-weight: 600; } .sev-warn { color: #f08c00; font-weight: 600; }
.sev-info { color: #8a8a8a; }
</style></head><body><main>
<h1>%(title)s</h1>
<p id="status">connecting...</p>
<div id="verdict"><ul id="verdict-lines"></ul></div>
<figure id="fig"><img id="watch" alt="watch figure: the run against its forecast band"></figure>
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
  var img = document.getElementById('watch');
  img.onload = function () {  // which figure the page shows (status for a reader, and tests)
    document.body.setAttribute('data-figure', img.naturalWidth + 'x' + img.naturalHeight
      + ' v' + img.getAttribute('data-v'));
  };
  function draw(s) {
    img.setAttribute('data-v', s.version);
    img.src = s.figure ? 'watch.png?v=' + s.version : '';
    document.getElementById('fig').style.display = s.figure ? '' : 'none';
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


class LivePage:
    """Serve the live page of ``inputs()`` (a :class:`reports.inputs.ReportInputs` factory) on
    ``host:port`` (port 0: a free one) in a daemon thread. ``version()`` is a cheap fingerprint of
    the inputs; they are re-read and the figure redrawn only when it changes. ``before_state``
    (tests) runs before each ``/state.json`` is answered."""

    def __init__(self, inputs: Callable, version: Callable[[], Hashable], *, port: int = 0,
                 host: str = "127.0.0.1", poll_ms: int = 2000, title: str = "ladder: live watch",
                 before_state: Callable[[], None] | None = None):
        if not (isinstance(port, int) and 0 <= port <= 65535):
            raise InputError(f"must be in 0..65535, got {port!r}", field="--port",
                             exit_code=EX_USAGE)
        self.inputs, self.version, self.poll_ms = inputs, version, int(poll_ms)
        self.title = title
        self.before_state = before_state
        self._lock = threading.Lock()
        self._key: Hashable = object()
        self._n = 0
        self._png: bytes | None = None
        self._state: dict = {}
        self.requests = 0
        page = self
        try:
            self.httpd = ThreadingHTTPServer((host, port), _handler(page))
        except OSError as e:
            raise InputError(f"cannot serve on {host}:{port} ({e.strerror or e})",
                             field="--port", exit_code=EX_USAGE) from None
        self.httpd.daemon_threads = True
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

    def snapshot(self) -> tuple[dict, bytes | None]:
        """The state object and the figure for the current inputs (recomputed on a new version)."""
        with self._lock:
            key = self.version()
            if key != self._key:
                self._key = key
                self._n += 1
                self._render()
            return self._state, self._png

    def _render(self) -> None:
        from reports import plots
        from reports.page import verdict_lines
        from reports.tables import alert_rows

        inp = self.inputs()
        fig = plots.plot_watch(inp)
        self._png = plots.png_bytes(fig) if fig is not None else None
        lines, tone = verdict_lines(inp)
        rows = alert_rows(inp, limit=len(inp.alerts or []))
        self._state = {"version": self._n, "figure": self._png is not None,
                       "verdict": lines or list(inp.notes[:3]),
                       "tone": {"ok": "", "warn": "warn", "bad": "bad"}.get(tone, ""),
                       "alerts": rows[-ALERTS_SHOWN:][::-1],  # newest first
                       "n_alerts": len(inp.alerts or []),
                       "updated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}

    # ---------------------------------------------------------------- the two ways to feed it
    @classmethod
    def for_files(cls, *, runs=None, law=None, prereg=None, alerts=None, target_run=None,
                  **kw) -> LivePage:
        """The report's inputs from files, re-read when one of them changes (size or mtime)."""
        from reports.inputs import load_inputs

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

        return cls(lambda: load_inputs(runs=runs, law=law, prereg=prereg, alerts=alerts,
                                       target_run=target_run), version, **kw)

    @classmethod
    def for_watcher(cls, watcher, **kw) -> LivePage:
        """The inputs of a running :class:`predict.live.Watcher`: its pre-registration and alerts
        in memory, the target's points from the run directory of a metrics.jsonl source (other
        sources: the forecast band and the alerts only)."""
        from reports.inputs import load_inputs

        src_path = getattr(getattr(watcher, "source", None), "path", None)
        run_dir = None
        if src_path is not None and Path(src_path).name == "metrics.jsonl":
            run_dir = Path(src_path).parent

        def version():
            st = watcher.state
            return (len(watcher.all_alerts), st.get("n_points"), st.get("last_step"),
                    watcher.doc.get("sha256"))

        def inputs():
            return load_inputs(prereg=watcher.doc, target_run=run_dir,
                               alerts=[to_jsonable(a.to_dict()) for a in watcher.all_alerts])
        kw.setdefault("title", f"ladder watch: {watcher.doc.get('target', {}).get('name')}")
        return cls(inputs, version, **kw)


def _handler(page: LivePage):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *args):  # no access log on stderr
            return

        def _send(self, code: int, body: bytes, ctype: str):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802 - the http.server API
            page.requests += 1
            path = self.path.split("?", 1)[0]
            try:
                if path in ("/", "/index.html"):
                    return self._send(200, page.page(), "text/html; charset=utf-8")
                if path == "/state.json":
                    if page.before_state is not None:
                        page.before_state()
                    state, _ = page.snapshot()
                    body = json.dumps(to_jsonable(state), allow_nan=False).encode()
                    return self._send(200, body, "application/json")
                if path == "/watch.png":
                    _, png = page.snapshot()
                    if png is None:
                        return self._send(404, b"no watch figure yet", "text/plain")
                    return self._send(200, png, "image/png")
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


__all__ = ["LivePage", "serve_forever", "ALERTS_SHOWN"]
