"""Where alerts go: human-readable lines, an alerts JSONL, a webhook (JSON POST), ``wandb.alert``.

Exactly once (ladder.predict.live): every alert carries an ``id`` (``context["id"]``) and the
watcher sends its outbox again after a restart; the JSONL sink skips ids already in its file,
the webhook sends the id (``Idempotency-Key`` header and ``id`` field) and skips ids it has
delivered. A sink that fails reports it on stderr and keeps the watcher running: the alert is
still in the JSONL and on stdout.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from ladder.io import EX_USAGE, InputError, append_text, open_input, to_jsonable
from ladder.predict.watch import Alert
from ladder.predict.watch.alerts import SEVERITY_RANK


class Sink:
    """The shape of a place alerts go (all ``ladder.predict.live.Watcher`` asks for).

    ``send(alert, context)`` hands over one alert: a synchronous sink has taken it on return, an
    ``asynchronous`` one reports each delivery through ``on_delivered(alert_id)`` (which the
    watcher sets when None). An ``idempotent`` sink skips ids it has, so the watcher need not
    save its state after each alert it takes. ``flush()`` comes after every poll's alerts,
    ``close()`` at the end of a watch."""

    idempotent = False
    asynchronous = False
    on_delivered: Callable[[str], None] | None = None

    @property
    def name(self) -> str:
        """The sink's name in the watcher's outbox (a subclass names itself)."""
        return type(self).__name__

    def send(self, alert: Alert, context: dict) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class StdoutSink(Sink):
    name = "stdout"
    # a restarted watcher prints a pending alert's line again in its own (new) output: not a
    # second delivery to any receiver, so no state write per line
    idempotent = True

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream

    def send(self, alert: Alert, context: dict) -> None:
        print(alert.line(), file=self.stream or sys.stdout, flush=True)


class JsonlSink(Sink):
    """One JSON object per alert (its fields + the context: the pre-registration's sha256, the
    target, the ``id``), appended durably; an id already in the file is not written again."""

    name = "jsonl"
    idempotent = True  # skips ids already in its file

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._ids: set[str] | None = None

    def _seen(self) -> set[str]:
        if self._ids is None:
            self._ids = set()
            if self.path.exists():
                with open_input(self.path, field="--alerts") as f:
                    for raw in f:
                        if b'"id"' not in raw:
                            continue
                        try:
                            rid = json.loads(raw).get("id")
                        except (ValueError, AttributeError, RecursionError):
                            continue
                        if isinstance(rid, str):
                            self._ids.add(rid)
        return self._ids

    def send(self, alert: Alert, context: dict) -> None:
        aid = context.get("id")
        if aid is not None and aid in self._seen():
            return
        rec = alert.to_dict()
        rec.update({k: v for k, v in context.items() if k not in rec})
        append_text(self.path, json.dumps(to_jsonable(rec), allow_nan=False) + "\n")
        if aid is not None:
            self._seen().add(aid)


WEBHOOK_ENV = "LADDER_WEBHOOK_URL"
# What of a receiver's answer is read: its status decides, the body is not used; an endless or
# trickling body must not take the watcher's memory or time (issue 26: 2.2 GB read whole).
MAX_ANSWER_BYTES = 64 << 10


def webhook_url(url: str | None, file: str | None, *, environ=None, warn=None) -> str | None:
    """The webhook's URL from ``--webhook-file FILE`` (its one line), ``--webhook URL`` (which
    every user sees in ``ps``: ``warn`` is told so) or ``$LADDER_WEBHOOK_URL``; None: no
    webhook. The URL is never repeated in an error (it often carries a token)."""
    from ladder.io import read_bytes
    environ = os.environ if environ is None else environ
    if url is not None and file is not None:
        raise InputError("give --webhook or --webhook-file, not both", field="--webhook-file",
                         exit_code=EX_USAGE)
    if file is not None:
        text = read_bytes(file, field="--webhook-file", limit=1 << 16)
        lines = [ln.strip() for ln in text.decode("utf-8", "replace").splitlines() if ln.strip()]
        if len(lines) != 1:
            raise InputError(f"expected one line, the URL (got {len(lines)} non-empty lines)",
                             path=file, field="--webhook-file", exit_code=EX_USAGE)
        try:
            mode = os.stat(file).st_mode
        except OSError:
            mode = 0
        if mode & 0o077 and warn is not None:
            warn(f"ladder watch: {file} is readable by other users (mode {mode & 0o777:o}); "
                 f"`chmod 600` it if the URL holds a token")
        return lines[0]
    if url is not None:
        if warn is not None:
            warn("ladder watch: --webhook puts the URL on the command line, where every user "
                 "of this machine sees it (`ps`) for the whole follow; use --webhook-file FILE "
                 f"or ${WEBHOOK_ENV}")
        return url
    return environ.get(WEBHOOK_ENV) or None


def redact_argv(argv: list[str], secret: str | None) -> list[str]:
    """``argv`` with the webhook's URL redacted (W&B records the command line)."""
    if not secret:
        return list(argv)
    hidden = {secret: "<redacted>", f"--webhook={secret}": "--webhook=<redacted>"}
    return [hidden.get(a, a) for a in argv]


def check_webhook_url(url: str) -> urllib.parse.SplitResult:
    """An http(s) URL with a host; InputError (64) otherwise, naming the scheme at most."""
    try:
        u = urllib.parse.urlsplit(url)
        port = u.port  # ValueError for a bad port
    except ValueError:
        raise InputError("not a valid URL", field="--webhook", exit_code=EX_USAGE) from None
    if u.scheme not in ("http", "https"):
        raise InputError(f"expected an http:// or https:// URL, got scheme {u.scheme!r}",
                         field="--webhook", exit_code=EX_USAGE)
    if not u.hostname:
        raise InputError("the URL has no host", field="--webhook", exit_code=EX_USAGE)
    del port  # read for its check only
    return u


class WebhookSink(Sink):
    """POST each alert as JSON to ``url`` (Slack-style receivers read ``text``) from a background
    thread, so a slow or dead receiver never blocks the watcher. Only a 2xx answer counts;
    redirects are not followed (one turns the POST into a body-less GET, or leads off
    http(s)); a failure is retried with backoff up to ``max_tries`` times, then given up with a
    line on stderr naming the host only."""

    name = "webhook"
    asynchronous = True

    def __init__(self, url: str, *, timeout: float = 5.0, max_tries: int = 6,
                 backoff: float = 1.0, max_backoff: float = 60.0,
                 on_delivered: Callable[[str], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        self._u = check_webhook_url(url)
        self.host = self._u.hostname
        self.timeout = timeout
        self.max_tries = max_tries
        self.backoff, self.max_backoff = backoff, max_backoff
        self.on_delivered = on_delivered
        self.sleep = sleep
        self.failures = 0
        self.delivered: set[str] = set()
        self._q: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- the caller's side
    def send(self, alert: Alert, context: dict) -> None:
        aid = context.get("id")
        if aid is not None and aid in self.delivered:
            return
        body = alert.to_dict()
        body.update({k: v for k, v in context.items() if k not in body})
        body["text"] = f"ladder watch {context.get('target', '')}: {alert.line()}"
        data = json.dumps(to_jsonable(body), allow_nan=False).encode("utf-8")
        self._q.put((aid, data))
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="webhook", daemon=True)
                self._thread.start()

    def close(self, timeout: float = 30.0) -> bool:
        """Wait up to ``timeout`` s for the queue to drain; False (and a line) if it did not."""
        t_end = time.monotonic() + timeout
        while self._q.unfinished_tasks and time.monotonic() < t_end:
            time.sleep(0.02)
        left = self._q.unfinished_tasks
        if left:
            print(f"ladder watch: {left} alert(s) not yet delivered to the webhook at "
                  f"{self.host}; they stay in the watch state and are sent on the next start",
                  file=sys.stderr)
        return not left

    # ---------------------------------------------------------------- the worker
    def _work(self) -> None:
        while True:
            try:
                aid, data = self._q.get(timeout=1.0)
            except queue.Empty:
                return
            try:
                self._deliver(aid, data)
            finally:
                self._q.task_done()

    def _deliver(self, aid: str | None, data: bytes) -> None:
        wait = self.backoff
        for attempt in range(1, self.max_tries + 1):
            err = self._post(data, aid)
            if err is None:
                if aid is not None:
                    self.delivered.add(aid)
                    if self.on_delivered is not None:
                        self.on_delivered(aid)
                return
            self.failures += 1
            if attempt == self.max_tries:
                print(f"ladder watch: webhook at {self.host} failed {attempt} times ({err}); "
                      f"giving up on this alert (it is on stdout and in --alerts)",
                      file=sys.stderr)
                return
            if self.failures == 1:
                print(f"ladder watch: webhook at {self.host} failed ({err}); retrying with "
                      f"backoff", file=sys.stderr)
            self.sleep(wait)
            wait = min(wait * 2, self.max_backoff)

    def _post(self, data: bytes, aid: str | None) -> str | None:
        """One POST; None when the receiver answered 2xx, else a short reason (no URL)."""
        u = self._u
        conn_cls = http.client.HTTPSConnection if u.scheme == "https" else \
            http.client.HTTPConnection
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        headers = {"Content-Type": "application/json", "User-Agent": "ladder-watch"}
        if aid is not None:
            headers["Idempotency-Key"] = aid
        if u.username or u.password:
            import base64
            cred = f"{urllib.parse.unquote(u.username or '')}:" \
                   f"{urllib.parse.unquote(u.password or '')}"
            headers["Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()
        try:
            conn = conn_cls(u.hostname, u.port, timeout=self.timeout)
            try:
                conn.request("POST", path, body=data, headers=headers)
                resp = conn.getresponse()
                status = resp.status
                _drain(resp, MAX_ANSWER_BYTES, time.monotonic() + 2 * self.timeout)
            finally:
                conn.close()
        except (OSError, http.client.HTTPException, ValueError) as e:
            return type(e).__name__
        if 200 <= status < 300:
            return None
        if 300 <= status < 400:
            return f"HTTP {status} redirect, not followed"
        return f"HTTP {status}"


def _drain(resp, limit: int, deadline: float) -> None:
    """Read at most ``limit`` bytes of an answer's body, until ``deadline`` at the latest."""
    got, read = 0, getattr(resp, "read1", resp.read)
    while got < limit and time.monotonic() < deadline:
        chunk = read(min(16384, limit - got))
        if not chunk:
            return
        got += len(chunk)


def wandb_alert(connect: Callable[[], tuple[Any, Any]], title: str, alert: Alert) -> bool:
    """``run.alert`` of ``alert`` at its severity's W&B level, ``connect()`` giving (the wandb
    module, the run); False, and a line on stderr, when W&B failed."""
    try:
        wandb, run = connect()
        levels = getattr(wandb, "AlertLevel", None)
        level = None if levels is None else {"info": levels.INFO, "warn": levels.WARN,
                                             "critical": levels.ERROR}[alert.severity]
        run.alert(title=title, text=alert.message, level=level)
        return True
    except Exception as e:  # noqa: BLE001 - never let a sink stop the watcher
        print(f"ladder watch: wandb.alert failed ({type(e).__name__}: {e}); further W&B "
              f"alerts are skipped", file=sys.stderr)
        return False


class WandbAlertSink(Sink):
    """``wandb.alert`` for alerts about a W&B run, from a small run of its own in the watched
    run's project (job_type "watch"): the watched run is never touched."""

    name = "wandb"

    def __init__(self, entity: str, project: str, watched: str, *, wandb_module: Any = None,
                 min_severity: str = "warn"):
        self.entity, self.project, self.watched = entity, project, watched
        self._wandb = wandb_module
        self._run = None
        self.min_rank = SEVERITY_RANK[min_severity]
        self.failed = False

    def _connect(self):
        """(the wandb module, the small run of the alerts), started at the first alert."""
        if self._run is None:
            wandb = self._wandb
            if wandb is None:
                import wandb as _w
                wandb = self._wandb = _w
            self._run = wandb.init(entity=self.entity, project=self.project, job_type="watch",
                                   name=f"watch-{self.watched}", reinit=True)
        return self._wandb, self._run

    def send(self, alert: Alert, context: dict) -> None:
        if self.failed or SEVERITY_RANK[alert.severity] < self.min_rank and \
                alert.kind != "contingency":
            return
        self.failed = not wandb_alert(self._connect,
                                      f"{self.watched}: {alert.kind} ({alert.severity})", alert)

    def close(self) -> None:
        if self._run is not None:
            try:
                self._run.finish()
            except Exception:  # noqa: BLE001
                pass
