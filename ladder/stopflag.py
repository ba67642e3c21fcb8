"""A stop asked for by a signal and honoured where stopping is safe: the trainer checks it after
each step (checkpoint, then exit) instead of raising inside a step, whose donated input state
would then be lost; the watcher after each poll (state saved, every sink closed)."""

from __future__ import annotations

import signal
import threading


class StopFlag:
    """While entered, the first of ``signals`` sets :attr:`set` (and :attr:`event`, which wakes a
    loop waiting on it); a second signal gives up at once (KeyboardInterrupt). Outside the main
    thread the signals are left alone (Python lets only the main thread set handlers)."""

    def __init__(self, signals: tuple = (signal.SIGINT, signal.SIGTERM)):
        self.signals = signals
        self.set = False
        self.signal_name: str | None = None
        self.event = threading.Event()
        self._old: dict = {}

    def _handler(self, signum, frame):
        if self.set:
            raise KeyboardInterrupt
        self.set = True
        self.signal_name = signal.Signals(signum).name
        # set from another thread: the handler may have interrupted the main thread inside the
        # event's own lock, which set() takes
        threading.Thread(target=self.event.set, daemon=True).start()

    def __enter__(self):
        for sig in self.signals:
            try:
                self._old[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread: leave the signals alone
                break
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}
        return False
