"""Where alerts go: human-readable lines, an alerts JSONL, a webhook (JSON POST), ``wandb.alert``.

A sink that fails (webhook down, W&B unreachable) reports the failure once per kind on stderr and
keeps the watcher running: an alert that could not be sent is still in the JSONL and on stdout.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, TextIO

from ladder.io import to_jsonable
from predict.watch import Alert


class StdoutSink:
    def __init__(self, stream: TextIO | None = None):
        self.stream = stream

    def send(self, alert: Alert, context: dict) -> None:
        stream = self.stream or sys.stdout
        print(alert.line(), file=stream, flush=True)


class JsonlSink:
    """Append one JSON object per alert (shared/DESIGN.md alert fields + the pre-registration's
    sha256 and target), flushed and fsynced so a crash loses nothing already raised."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def send(self, alert: Alert, context: dict) -> None:
        rec = alert.to_dict()
        rec.update({k: v for k, v in context.items() if k not in rec})
        line = json.dumps(to_jsonable(rec), allow_nan=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


class WebhookSink:
    """POST each alert as JSON to ``url`` (Slack-style receivers read ``text``)."""

    def __init__(self, url: str, *, timeout: float = 5.0):
        if not url.startswith(("http://", "https://")):
            from ladder.io import InputError
            raise InputError(f"expected an http(s) URL, got {url!r}", field="--webhook",
                             exit_code=64)
        self.url = url
        self.timeout = timeout
        self.failures = 0

    def send(self, alert: Alert, context: dict) -> None:
        body = alert.to_dict()
        body.update({k: v for k, v in context.items() if k not in body})
        body["text"] = f"ladder watch {context.get('target', '')}: {alert.line()}"
        data = json.dumps(to_jsonable(body), allow_nan=False).encode("utf-8")
        req = urllib.request.Request(self.url, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                resp.read()
        except (urllib.error.URLError, OSError, ValueError) as e:
            self.failures += 1
            if self.failures == 1 or self.failures % 100 == 0:
                print(f"ladder watch: webhook {self.url} failed ({e}); alerts are still written "
                      f"to stdout and --alerts", file=sys.stderr)


class WandbAlertSink:
    """``wandb.alert`` for alerts about a W&B run. It opens a separate small run in the watched
    run's project (job_type "watch"), so the watched run itself is never touched; ``wandb_module``
    is injectable for tests."""

    def __init__(self, entity: str, project: str, watched: str, *, wandb_module: Any = None,
                 min_severity: str = "warn"):
        self.entity, self.project, self.watched = entity, project, watched
        self._wandb = wandb_module
        self._run = None
        self.min_rank = {"info": 0, "warn": 1, "critical": 2}[min_severity]
        self.failed = False

    def _ensure(self):
        if self._run is None:
            wandb = self._wandb
            if wandb is None:
                import wandb as _w
                wandb = self._wandb = _w
            self._run = wandb.init(entity=self.entity, project=self.project, job_type="watch",
                                   name=f"watch-{self.watched}", reinit=True)
        return self._run

    def send(self, alert: Alert, context: dict) -> None:
        rank = {"info": 0, "warn": 1, "critical": 2}[alert.severity]
        if rank < self.min_rank and alert.kind != "contingency" or self.failed:
            return
        try:
            run = self._ensure()
            levels = getattr(self._wandb, "AlertLevel", None)
            level = None
            if levels is not None:
                level = {"info": levels.INFO, "warn": levels.WARN,
                         "critical": levels.ERROR}[alert.severity]
            run.alert(title=f"{self.watched}: {alert.kind} ({alert.severity})",
                      text=alert.message, level=level)
        except Exception as e:  # noqa: BLE001 - never let a sink stop the watcher
            self.failed = True
            print(f"ladder watch: wandb.alert failed ({type(e).__name__}: {e}); further W&B "
                  f"alerts are skipped", file=sys.stderr)

    def close(self):
        if self._run is not None:
            try:
                self._run.finish()
            except Exception:  # noqa: BLE001
                pass
