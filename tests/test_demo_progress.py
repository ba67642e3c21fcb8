"""`ladder demo` draws tqdm bars only on a terminal, as the rest of the CLI (issue 14 item 5)."""

from __future__ import annotations

import io
import sys

from ladder.cli import demo


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_bars_only_on_a_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert demo.train_config().run.progress is False
    cfg = demo.train_config("loss-drift", 0.4)
    assert cfg.run.progress is False and cfg.fault.kind == "loss-drift" and cfg.fault.at == 0.4
    monkeypatch.setattr(sys, "stderr", _Tty())
    assert demo.train_config().run.progress is True
