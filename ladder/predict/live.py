"""The watcher's I/O shell: a source, the pure :func:`predict.watch.check`, sinks, a saved state.

``Watcher(prereg_path, source, sinks, state_path).poll()`` judges what arrived since the last
call and returns the new alerts; ``run(follow=...)`` loops (``start_thread``: in a background
thread, for the demo). The state file holds the rule state, the source's read position (with its
identity: a moved or renamed file is not judged again) and the pre-registration followed, so a
restarted watcher neither repeats an alert nor skips a row.

Exactly-once alerts: an alert's ``id`` digests the pre-registration, its sequence number and its
content (judging the same rows again makes the same ids). The state, new alerts in its outbox,
is saved BEFORE any sink sees them; an alert leaves the outbox once every sink took it; a
restarted watcher sends what is left, and the sinks skip ids they already have.

Following: a source error (a vanished file, the W&B API down) is retried with exponential
backoff, said as ``info`` first and ``warn`` once it persists; the loop ends when the source says
the run finished, after reading what it wrote last; the exit status is then the verdict.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ladder.io import (EX_USAGE, InputError, atomic_write_json, canonical_json, known_schema,
                       number, read_json)
from ladder.predict import prereg as _prereg
from ladder.predict.watch import (STATE_SCHEMA, Alert, Batch, CheckResult, PreregView, check,
                                  check_state, exit_code_for, new_state, watched_keys)
from ladder.predict.watch.alerts import FIELDS, SEVERITY_RANK

# what a user does about a damaged state file (said with every field error); the sinks skip the
# alerts (by id) they already have, so judging from the start again sends nothing twice
RECOVER = ("move the state file aside (or give a new --state) to judge the run from its start; "
           "--alerts skips the alerts it already holds")


@dataclass(frozen=True)
class FollowConfig:
    """How a follow polls and retries (``--poll``, ``--max-seconds``; the decision rule's
    thresholds are registered, ``ladder.predict.watch.WatchConfig``)."""

    poll_seconds: float | None = None  # None: the source's own (a file ~1 s, the W&B API ~60 s)
    max_seconds: float | None = None   # None: until the source says the run finished
    persistent_after: int = 3          # source errors in a row before a warning, not an info
    max_backoff: float = 600.0         # s; 10 min between tries at most (a follow lasts ~100 days)

    def __post_init__(self):
        # 1 h: a poll slower than that is no longer watching (the W&B API default is 60 s)
        number(self.poll_seconds, field="--poll", lo=0, hi=3600, lo_open=True, allow_none=True,
               exit_code=EX_USAGE)
        number(self.max_seconds, field="--max-seconds", lo=0, allow_none=True,
               exit_code=EX_USAGE)
        number(self.persistent_after, field="persistent_after", lo=1, integral=True,
               exit_code=EX_USAGE)
        number(self.max_backoff, field="max_backoff", lo=0, lo_open=True, exit_code=EX_USAGE)


class SourceError(InputError):
    """The source could not be read this time: the command's error, or retried when following."""


def alert_id(prereg_sha: str | None, seq: int, alert: Alert) -> str:
    """Deterministic id of the ``seq``-th alert of a watch (the time stamp left out)."""
    d = {k: v for k, v in alert.to_dict().items() if k != "time"}
    h = hashlib.sha256(f"{prereg_sha}:{seq}:".encode() + canonical_json(d))
    return h.hexdigest()[:24]


def judged_through(state) -> int | None:
    """The last step a (multi-metric: any metric's) watch state judged, None before any."""
    if not isinstance(state, dict):
        return None
    inner = state.get("metrics")
    states = list(inner.values()) if isinstance(inner, dict) else [state]
    steps = [s.get("last_step") for s in states if isinstance(s, dict)]
    steps = [s for s in steps if isinstance(s, int) and not isinstance(s, bool)]
    return max(steps) if steps else None


def _check_outbox_entry(e) -> None:
    """An outbox entry as :meth:`Watcher._queue` writes it, or KeyError/TypeError/ValueError
    naming the first bad part."""
    if not isinstance(e, dict):
        raise TypeError(f"expected an object, got {type(e).__name__}")
    if not isinstance(e["id"], str) or len(e["id"]) > 64:
        raise ValueError("'id' must be a string of at most 64 characters")
    if not isinstance(e["pending"], list) or not all(isinstance(x, str) for x in e["pending"]):
        raise ValueError("'pending' must be a list of sink names")
    a = e["alert"]
    if not isinstance(a, dict):
        raise TypeError("'alert' must be an object")
    for k in ("kind", "message"):
        if not isinstance(a.get(k, ""), str):
            raise ValueError(f"alert '{k}' must be a string")
    step = a.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise ValueError("alert 'step' must be an integer or null")
    for k in ("tokens", "fraction", "value", "expected", "lo", "hi"):
        v = a.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float, str))):
            raise ValueError(f"alert '{k}' must be a number or null")
    alert_from_dict(a)  # the severity


def alert_from_dict(d: dict) -> Alert:
    kw = {k: d.get(k) for k in FIELDS}
    kw["message"] = kw["message"] or ""
    return Alert(**kw, extra={k: v for k, v in d.items() if k not in FIELDS})


def _note(t: float, kind: str, severity: str, message: str) -> Alert:
    """An alert about the watch itself (no step), stamped at epoch seconds ``t``."""
    return Alert(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)), None, None, None, kind,
                 severity, message=message)


def newest_of(chain) -> tuple[dict, str]:
    """The newest pre-registration of ``chain`` and the words for it; an amendment at a step S
    checked to carry the forecast it amends unchanged before S."""
    doc = _prereg.load(chain.newest.path)
    words = chain.describe()
    ch = doc.get("change")
    if isinstance(ch, dict) and len(chain.links) > 1:
        from ladder.predict.amend import check_carried
        prev = chain.links[-2]
        try:
            check_carried(_prereg.load(prev.path), doc)
        except InputError as e:
            raise InputError(str(e).partition(": ")[2] or str(e), path=chain.newest.path,
                             field="forecast") from None
        words += (f"; it follows the amendment from step {ch.get('at_step')} on (the forecast "
                  f"of {prev.path} before it, carried unchanged)")
    return doc, words


class Watcher:
    """Watch one source (the shape of :class:`ladder.sources.base.Source`) against the newest
    valid pre-registration of a chain, with sinks of the shape of :class:`predict.sinks.Sink`."""

    def __init__(self, prereg: str | os.PathLike | dict, source, sinks: Sequence = (),
                 state_path: str | os.PathLike | None = None, *, metric: str | None = None,
                 clock: Callable[[], float] = time.time, chain_every: float = 10.0,
                 sleep: Callable[[float], None] = time.sleep,
                 follow: FollowConfig | None = None, amend_chain: Sequence | None = None):
        self.follow = follow or FollowConfig()
        self.amend_chain = list(amend_chain or ())
        self.prereg_path = None if isinstance(prereg, dict) else Path(prereg)
        self.source = source
        self.sinks = list(sinks)
        self.state_path = None if state_path is None else Path(state_path)
        self.metric_override = metric
        self.clock = clock
        self.sleep = sleep
        self.chain_every = chain_every
        self._last_chain_check = 0.0
        self.chain = None
        self._lock = threading.RLock()
        if isinstance(prereg, dict):
            self._use(prereg, description="in-memory pre-registration")
        else:
            self.chain = _prereg.resolve_chain(self.prereg_path, self.amend_chain)
            doc, words = newest_of(self.chain)
            self._use(doc, description=words)
        self.outbox: list[dict] = []  # alerts some sink has not taken yet (saved with the state)
        self.seq = 0                  # alerts raised so far in this watch (for their ids)
        self._saved: bytes | None = None
        # rows of steps up to this one, judged already, come again (the source could not continue
        # at its saved position): skipped until a later step arrives
        self._skip_through: int | None = None
        self.state = self._load_state()
        self._notes_seen: set[str] = set()
        self.all_alerts: list[Alert] = []
        # called with (view, batch) for every batch judged (ladder.reports.live.WatcherFeed)
        self.listeners: list[Callable] = []
        self._sent: set[tuple[str, str]] = set()  # (id, sink) handed to a sink by this process
        for s in self.sinks:  # the async webhook reports each delivery back
            if s.asynchronous and s.on_delivered is None:
                s.on_delivered = functools.partial(self._delivered, name=s.name)

    # ------------------------------------------------------------------ setup
    @property
    def from_step(self) -> int | None:
        """The step from which the pre-registration followed holds (an amendment at a step);
        None when it holds for the whole run."""
        ch = self.doc.get("change")
        return ch.get("at_step") if isinstance(ch, dict) else None

    def _use(self, doc: dict, *, description: str) -> None:
        from ladder.predict.watch.multi import MultiView, is_multi
        self.multi = is_multi(doc)
        if self.multi and self.metric_override:
            raise InputError("--metric renames the source key of a single-metric "
                             "pre-registration; this one registers "
                             f"{len(doc.get('metrics') or [])} metrics, judged by their "
                             "own keys", field="--metric", exit_code=64)
        if self.metric_override:
            doc = dict(doc)
            doc["metric"] = self.metric_override
        self.doc = doc
        view_of, field = ((MultiView.of, "forecasts") if self.multi else
                          (PreregView.of, "decision_rule"))
        try:
            self.view = view_of(doc)
        except (KeyError, ValueError, TypeError, IndexError) as e:
            raise InputError(f"not a usable pre-registration ({type(e).__name__}: {e})",
                             path=self.prereg_path, field=field) from None
        self.description = description
        self.keep, self.keys = watched_keys(self.view.metrics if self.multi else
                                            self.view.metric, self.view.config)
        self.context = {"prereg_sha256": doc.get("sha256"),
                        "target": (doc.get("target") or {}).get("name"),
                        "metric": self.view.metric}

    def _load_state(self) -> dict:
        if self.state_path is None or not self.state_path.exists():
            return new_state()
        saved = read_json(self.state_path, schema="watch-state", field="--state")
        known_schema(saved, (STATE_SCHEMA,), path=self.state_path)  # another one: refused
        for key, typ in (("state", dict), ("source", dict), ("outbox", list), ("seq", int)):
            if key in saved and (not isinstance(saved[key], typ) or isinstance(saved[key], bool)):
                raise InputError(f"expected {'an integer' if typ is int else typ.__name__}; "
                                 f"{RECOVER}", path=self.state_path, field=key)
        seq = saved.get("seq") or 0
        if not 0 <= seq <= 2 ** 53:
            raise InputError(f"must be in [0, 2**53], got {seq}; {RECOVER}",
                             path=self.state_path, field="seq")
        self.outbox = []
        for i, e in enumerate(saved.get("outbox") or []):
            try:
                _check_outbox_entry(e)
            except (KeyError, TypeError, ValueError) as err:
                raise InputError(f"not an outbox entry ({err}); {RECOVER}",
                                 path=self.state_path, field=f"outbox[{i}]") from None
            self.outbox.append(e)
        self.seq = int(seq)
        if "state" in saved:
            try:
                if self.multi:
                    from ladder.predict.watch.multi import check_multi_state
                    saved["state"] = check_multi_state(saved["state"], self.view.metrics)
                else:
                    saved["state"] = check_state(saved["state"])
            except ValueError as err:
                field, _, why = str(err).partition(": ")
                raise InputError(f"{why}; {RECOVER}", path=self.state_path,
                                 field=field) from None
        sha = saved.get("prereg_sha256")
        amended = sha != self.doc.get("sha256")
        if amended and sha not in ([lk.sha256 for lk in self.chain.links] if self.chain else []):
            raise InputError(f"the state file belongs to another pre-registration ({sha}); use "
                             "a new --state file", path=self.state_path, field="prereg_sha256")
        self._restore_source(saved)
        if amended:  # while the watcher was down: keep reading where it stopped, judge anew
            return new_state()
        return saved.get("state") or new_state()

    def _restore_source(self, saved: dict) -> None:
        judged = judged_through(saved.get("state"))
        try:
            if "source" not in saved or not self.source.restore(saved["source"]):
                self._skip(judged)
        except (TypeError, ValueError, KeyError, OverflowError, AttributeError) as e:
            msg = str(e)
            field, sep, rest = msg.partition(": ")
            if not (sep and field.startswith("source.")):
                field, rest = "source", f"not a read position ({type(e).__name__}: {msg})"
            raise InputError(f"{rest}; {RECOVER}", path=self.state_path,
                             field=field) from None

    def _skip(self, through: int | None) -> None:
        """From now on skip rows of steps up to ``through`` (judged already) until a later one."""
        if through is not None:
            self._skip_through = through if self._skip_through is None else \
                max(self._skip_through, through)

    def _unjudged(self, batch: Batch) -> tuple[Batch, str | None]:
        """``batch`` without the rows of steps already judged (:meth:`_skip`), and a note when
        some were dropped."""
        if self._skip_through is None or not len(batch):
            return batch, None
        import numpy as np
        kept = np.flatnonzero(batch.step > self._skip_through)
        note = None
        if kept.size < len(batch):
            note = (f"{len(batch) - kept.size} row(s) of steps up to {self._skip_through}, "
                    "judged already, read again and skipped")
            taken = batch.take(kept)
            taken.configs, taken.notes = batch.configs, batch.notes
            batch = taken
        if kept.size:
            self._skip_through = None
        return batch, note

    def _save_state(self) -> None:
        """Write the state (atomically) when it changed since the last write."""
        if self.state_path is None:
            return
        with self._lock:
            doc = {"schema": STATE_SCHEMA, "prereg_sha256": self.doc.get("sha256"),
                   "prereg": self.description, "source": self.source.position(),
                   "state": self.state, "seq": self.seq, "outbox": self.outbox}
            blob = canonical_json(doc)
            if blob == self._saved:
                return  # an idle poll rewrites nothing
            atomic_write_json(self.state_path, doc)
            self._saved = blob

    # ------------------------------------------------------------------ delivery
    def _queue(self, alerts: list[Alert]) -> None:
        names = [s.name for s in self.sinks]
        for a in alerts:
            aid = alert_id(self.doc.get("sha256"), self.seq, a)
            self.seq += 1
            self.outbox.append({"id": aid, "alert": a.to_dict(), "pending": list(names)})

    def _send_outbox(self) -> None:
        by_name = {s.name: s for s in self.sinks}
        for entry in list(self.outbox):
            alert = alert_from_dict(entry["alert"])
            ctx = {**self.context, "id": entry["id"]}
            for name in list(entry.get("pending") or []):
                sink = by_name.get(name)
                if sink is None:  # a sink of an earlier run that this one does not have
                    self._delivered(entry["id"], name, save=False)
                    continue
                if (entry["id"], name) in self._sent:
                    continue  # in an async sink's queue already
                self._sent.add((entry["id"], name))
                sink.send(alert, ctx)
                if not sink.asynchronous:  # taken on return
                    # a sink that skips ids it has (``idempotent``) may be sent an alert again
                    # after a kill; any other gets its delivery recorded at once
                    self._delivered(entry["id"], name, save=not sink.idempotent)

    def _delivered(self, aid: str, name: str, *, save: bool = True) -> None:
        with self._lock:
            for entry in self.outbox:
                if entry["id"] == aid and name in entry.get("pending", []):
                    entry["pending"].remove(name)
            self.outbox = [e for e in self.outbox if e.get("pending")]
            if save:
                self._save_state()

    def _emit(self, alerts: list[Alert]) -> None:
        """Outbox, save, send, save: a kill at any point repeats no alert to an id-aware sink."""
        with self._lock:
            if alerts:
                self._queue(alerts)
            if self.outbox:
                self._save_state()
                self._send_outbox()
            self._save_state()
            self.all_alerts.extend(alerts)
            for s in self.sinks:  # a sink that batches (the W&B watch run) writes this poll's
                s.flush()

    def _maybe_follow_chain(self, now: float) -> list[Alert]:
        if self.prereg_path is None or now - self._last_chain_check < self.chain_every:
            return []
        self._last_chain_check = now
        chain = _prereg.resolve_chain(self.prereg_path, self.amend_chain)
        found = []
        for u in chain.unrecorded:  # said once each, never followed
            if u not in self._notes_seen:
                self._notes_seen.add(u)
                found.append(_note(now, "prereg", "info", f"not followed: {u}"))
        if chain.newest.sha256 == self.doc.get("sha256"):
            return found
        self.chain = chain
        doc, words = newest_of(chain)
        self._use(doc, description=words)
        pos = self.source.position()
        self.state = new_state()
        self.source.restore(pos)
        return [_note(now, "prereg", "info", f"amended pre-registration recorded: "
                      f"{chain.describe()}; compared against it from here on")] + found

    def _read(self):
        try:
            return self.source.poll_batch(self.keys, self.keep)
        except SourceError:
            raise
        except InputError as e:
            if e.exit_code in (66, 69, 74):  # missing, unreachable, I/O: may pass
                raise SourceError(str(e), exit_code=e.exit_code) from None
            raise
        except OSError as e:
            raise SourceError(f"source not readable ({e.strerror or type(e).__name__})",
                              path=getattr(e, "filename", None), field="--source",
                              exit_code=74) from None

    def poll(self) -> list[Alert]:
        """Read what arrived, judge it, save the state, send and return the new alerts."""
        with self._lock:  # the webhook's worker records deliveries (and saves) between polls
            return self._poll()

    def _poll(self) -> list[Alert]:
        now = self.clock()
        new = self._maybe_follow_chain(now)
        if self.state.get("not_applicable"):
            # the forecast no longer applies: nothing more to judge until an amendment
            self._emit(new)
            return new
        got_rows = False
        while True:
            p = self._read()
            now = self.clock()
            notes = list(p.notes)
            if p.restarted:  # the source reads its rows again from the start
                self._skip(judged_through(self.state))
            batch = p.batch if p.batch is not None else \
                Batch.from_rows(p.rows, keys=self.keys, keep=self.keep)
            batch.configs = list(p.configs) + batch.configs
            notes += batch.notes
            batch, skipped = self._unjudged(batch)
            if skipped:
                notes.append(skipped)
            for n in notes:
                if n in self._notes_seen:
                    continue
                self._notes_seen.add(n)
                new.append(_note(now, "input", "info", n))
            if len(batch) or batch.configs:
                got_rows = got_rows or bool(len(batch))
                res: CheckResult = check(self.view, batch, self.state, now=now)
                self.state = res.state
                new += res.alerts
                for listen in self.listeners:
                    listen(self.view, batch)
            if not p.more:
                break
        if not got_rows and not self.state.get("not_applicable"):
            res = check(self.view, Batch.empty(), self.state, now=now)
            self.state = res.state
            new += res.alerts
        self._emit(new)
        return new

    @property
    def persistent_after(self) -> int:
        return self.follow.persistent_after

    @property
    def exit_code(self) -> int:
        return exit_code_for(self.state.get("worst"), bool(self.state.get("not_applicable")))

    def _source_alert(self, e: Exception, tries: int, wait: float) -> Alert | None:
        """info on the first error, warn once when it persists, then quiet."""
        sev = "info" if tries == 1 else "warn" if tries == self.persistent_after else None
        if sev is None:
            return None
        return _note(self.clock(), "source", sev, f"source error ({e}); try {tries}, retrying "
                     f"in {wait:.0f} s" + (" (persistent)" if sev == "warn" else " (transient?)"))

    def run(self, *, follow: bool = False, poll_seconds: float | None = None,
            max_seconds: float | None = None, stop: threading.Event | None = None) -> int:
        """Poll once (or, with ``follow``, until the run finished, ``max_seconds`` or ``stop``);
        the exit status. ``poll_seconds`` and ``max_seconds`` default to the watcher's
        :class:`FollowConfig`, whose poll defaults to the source's own interval."""
        if poll_seconds is None:
            poll_seconds = self.follow.poll_seconds or float(self.source.poll_seconds)
        if max_seconds is None:
            max_seconds = self.follow.max_seconds
        t0 = time.monotonic()
        try:
            if self.outbox:  # left over from a watcher that was stopped while sending
                self._emit([])
            if not follow:
                self.poll()
                return self.exit_code
            tries = 0
            while True:
                finished = _finished(self.source)
                try:
                    self.poll()
                except SourceError as e:
                    tries += 1
                    wait = min(poll_seconds * 2 ** tries, self.follow.max_backoff)
                    a = self._source_alert(e, tries, wait)
                    if a is not None:
                        self._emit([a])
                        self._fold_worst(a)
                else:
                    if tries >= self.persistent_after:
                        self._emit([_note(self.clock(), "source", "info", f"source readable "
                                          f"again after {tries} failed tries")])
                    tries, wait = 0, poll_seconds
                    if finished:
                        self._emit([_note(self.clock(), "finished", "info", f"the source says "
                                          f"the run finished ({finished}); stopping")])
                        break
                if self.state.get("not_applicable") and self.prereg_path is None:
                    break
                if max_seconds is not None and time.monotonic() - t0 + wait > max_seconds:
                    break
                if stop is not None:
                    if stop.wait(wait):
                        break
                else:
                    self.sleep(wait)
            return self.exit_code
        finally:
            for s in self.sinks:
                s.close()
            self._save_state()

    def _fold_worst(self, a: Alert) -> None:
        with self._lock:
            if SEVERITY_RANK[a.severity] > SEVERITY_RANK.get(self.state.get("worst"), -1):
                self.state["worst"] = a.severity
                self._save_state()

    def start_thread(self, *, poll_seconds: float = 0.5
                     ) -> tuple[threading.Thread, threading.Event]:
        """Follow in a daemon thread (for the demo); set the returned event to stop it."""
        stop = threading.Event()
        t = threading.Thread(target=self.run, kwargs={"follow": True, "poll_seconds": poll_seconds,
                                                      "stop": stop}, daemon=True)
        t.start()
        return t, stop


def _finished(source) -> str | None:
    """What the source says about the run's end ("complete", "finished", ...), None if running
    or unknown; never raises (it is asked before every poll)."""
    try:
        return source.finished()
    except Exception as e:  # noqa: BLE001 - unknown is not finished; the poll reports errors
        print(f"ladder watch: cannot tell whether the run finished ({type(e).__name__})",
              file=sys.stderr)
        return None

