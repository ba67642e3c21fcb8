"""The watcher's I/O shell: a source, the pure :func:`predict.watch.check`, sinks, a saved state.

``Watcher(prereg_path, source, sinks, state_path).poll()`` judges whatever arrived since the last
call and returns the new alerts; ``run(follow=...)`` loops. The demo can call ``poll()`` in-process
or run ``run()`` in a background thread (``start_thread``). The state file (JSON) holds the rule
state, the source's read position and the pre-registration followed, so a restarted watcher
neither repeats an alert nor skips a row.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ladder.io import InputError, atomic_write_json, read_json
from predict import prereg as _prereg
from predict.watch import (Alert, Batch, CheckResult, PreregView, check, exit_code_for, new_state,
                           watched_keys)

STATE_SCHEMA = "watch-state/1"


class Watcher:
    """Watch one source against the newest valid pre-registration of a chain."""

    def __init__(self, prereg: str | os.PathLike | dict, source, sinks: Sequence = (),
                 state_path: str | os.PathLike | None = None, *, metric: str | None = None,
                 clock: Callable[[], float] = time.time, chain_every: float = 10.0):
        self.prereg_path = None if isinstance(prereg, dict) else Path(prereg)
        self.source = source
        self.sinks = list(sinks)
        self.state_path = None if state_path is None else Path(state_path)
        self.metric_override = metric
        self.clock = clock
        self.chain_every = chain_every
        self._last_chain_check = 0.0
        self.chain = None
        if isinstance(prereg, dict):
            self._use(prereg, description="in-memory pre-registration")
        else:
            self.chain = _prereg.resolve_chain(self.prereg_path)
            self._use(_prereg.load(self.chain.newest.path), description=self.chain.describe())
        self.state = self._load_state()
        self._notes_seen: set[str] = set()
        self.all_alerts: list[Alert] = []

    # ------------------------------------------------------------------ setup
    def _use(self, doc: dict, *, description: str) -> None:
        if self.metric_override:
            doc = dict(doc)
            doc["metric"] = self.metric_override
        self.doc = doc
        try:
            self.view = PreregView.of(doc)
        except (KeyError, ValueError, TypeError, IndexError) as e:
            raise InputError(f"not a usable pre-registration ({type(e).__name__}: {e})",
                             path=self.prereg_path, field="decision_rule") from None
        self.description = description
        self.keep, self.keys = watched_keys(self.view.metric, self.view.config)  # from RULES
        self.context = {"prereg_sha256": doc.get("sha256"),
                        "target": (doc.get("target") or {}).get("name"),
                        "metric": self.view.metric}

    def _load_state(self) -> dict:
        if self.state_path is None or not self.state_path.exists():
            return new_state()
        saved = read_json(self.state_path, schema="watch-state")
        chain_shas = [lk.sha256 for lk in self.chain.links] if self.chain else []
        if saved.get("prereg_sha256") != self.doc.get("sha256") and \
                saved.get("prereg_sha256") in chain_shas:
            # amended while the watcher was down: keep reading where it stopped, judge anew
            if "source" in saved:
                self.source.restore(saved["source"])
            return new_state()
        if saved.get("prereg_sha256") != self.doc.get("sha256"):
            raise InputError("the state file belongs to another pre-registration "
                             f"({saved.get('prereg_sha256')}); use a new --state file",
                             path=self.state_path, field="prereg_sha256")
        if "source" in saved:
            self.source.restore(saved["source"])
        return saved.get("state") or new_state()

    def _save_state(self) -> None:
        if self.state_path is None:
            return
        atomic_write_json(self.state_path, {"schema": STATE_SCHEMA,
                                            "prereg_sha256": self.doc.get("sha256"),
                                            "prereg": self.description,
                                            "source": self.source.position(),
                                            "state": self.state})

    # ------------------------------------------------------------------ one poll
    def _emit(self, alerts: list[Alert]) -> None:
        for a in alerts:
            for s in self.sinks:
                s.send(a, self.context)
        self.all_alerts.extend(alerts)

    def _maybe_follow_chain(self, now: float) -> list[Alert]:
        if self.prereg_path is None or now - self._last_chain_check < self.chain_every:
            return []
        self._last_chain_check = now
        chain = _prereg.resolve_chain(self.prereg_path)
        if chain.newest.sha256 == self.doc.get("sha256"):
            return []
        self.chain = chain
        self._use(_prereg.load(chain.newest.path), description=chain.describe())
        pos = self.source.position()
        self.state = new_state()
        self.source.restore(pos)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        return [Alert(stamp, None, None, None, "prereg", "info",
                      message=f"amended pre-registration found: {chain.describe()}; compared "
                              f"against it from here on")]

    def poll(self) -> list[Alert]:
        """Read what arrived, judge it, send and return the new alerts, save the state."""
        new: list[Alert] = []
        now = self.clock()
        new += self._maybe_follow_chain(now)
        got_rows = False
        while True:
            if hasattr(self.source, "poll_batch"):
                p = self.source.poll_batch(self.keys, self.keep,
                                           parallel=threading.current_thread()
                                           is threading.main_thread())
            else:
                p = self.source.poll()
            now = self.clock()
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
            notes = list(p.notes)
            batch = p.batch if p.batch is not None else \
                Batch.from_rows(p.rows, keys=self.keys, keep=self.keep)
            batch.configs = list(p.configs) + batch.configs
            notes += batch.notes
            for n in notes:
                if n in self._notes_seen:
                    continue
                self._notes_seen.add(n)
                new.append(Alert(stamp, None, None, None, "input", "info", message=n))
            if len(batch) or batch.configs:
                got_rows = got_rows or bool(len(batch))
                res: CheckResult = check(self.view, batch, self.state, now=now)
                self.state = res.state
                new += res.alerts
            if not p.more:
                break
        if not got_rows:
            res = check(self.view, Batch.empty(), self.state, now=now)
            self.state = res.state
            new += res.alerts
        self._emit(new)
        self._save_state()
        return new

    @property
    def exit_code(self) -> int:
        return exit_code_for(self.state.get("worst"), bool(self.state.get("not_applicable")))

    def run(self, *, follow: bool = False, poll_seconds: float = 0.2,
            max_seconds: float | None = None, stop: threading.Event | None = None) -> int:
        """Poll once (or, with ``follow``, until ``max_seconds`` or ``stop``); the exit status."""
        t0 = time.monotonic()
        self.poll()
        while follow:
            if stop is not None and stop.is_set():
                break
            if max_seconds is not None and time.monotonic() - t0 >= max_seconds:
                break
            if self.state.get("not_applicable") and self.prereg_path is None:
                break
            time.sleep(poll_seconds)
            self.poll()
        for s in self.sinks:
            if hasattr(s, "close"):
                s.close()
        return self.exit_code

    def start_thread(self, *, poll_seconds: float = 0.5
                     ) -> tuple[threading.Thread, threading.Event]:
        """Follow in a daemon thread (for the demo); set the returned event to stop it."""
        stop = threading.Event()
        t = threading.Thread(target=self.run, kwargs={"follow": True, "poll_seconds": poll_seconds,
                                                      "stop": stop}, daemon=True)
        t.start()
        return t, stop
