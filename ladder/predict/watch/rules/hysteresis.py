"""The hysteresis every rule that raises and clears shares: a condition must hold for a number of
observations in a row to be raised, and be gone for a number in a row to clear; no alert while
the level does not change. Observations come in runs of one label (what is wrong: a band's
direction, a signal's severity; None: fine).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ladder.predict.watch.rules.base import RuleState, kept


@dataclass(frozen=True)
class Change:
    """A change of the raised level: ``kind`` "raised", "lowered" or "cleared"; ``need`` the
    run length that made it (the observation it happened at is the run's ``need``-th); the
    level and what it was about before the change."""

    kind: str
    need: int
    level_before: int
    about_before: str | None


@dataclass
class Hysteresis(RuleState):
    """The state of one signal with hysteresis: the raised ``level`` (0 none, 1 warn,
    2 critical) and what it is ``about`` (the band's direction; None for the others), the label
    of the current ``run`` of observations (None: fine) and its length ``run_len``."""

    level: int = kept(("int", 0, 2), 0)
    about: str | None = kept("str?")
    run: str | int | None = kept("label?")
    run_len: int = kept("count", 0)

    def extend(self, label: str | int | None, n: int = 1) -> int:
        """Add ``n`` observations of ``label`` (None: fine) to the run; its length before them."""
        prior = self.run_len if self.run == label else 0
        self.run, self.run_len = label, prior + n
        return prior

    def settle(self, want: int, *, about: str | None = None, k_raise: int = 1,
               k_lower: int | None = None, k_clear: int) -> Change | None:
        """After :meth:`extend`: raise to ``want`` (about ``about``) when the current run asks
        for more than is raised about it and has held ``k_raise``; lower to a ``want`` below the
        raised level (never to 0: that is clearing) after ``k_lower`` (None: never lowered);
        clear after ``k_clear`` fine ones. The change, or None."""
        if self.run is None:
            if self.level and self.run_len >= k_clear:
                ch = Change("cleared", k_clear, self.level, self.about)
                self.level, self.about = 0, None
                return ch
            return None
        cur = self.level if self.about == about else 0
        if want > cur and self.run_len >= k_raise:
            ch = Change("raised", k_raise, self.level, self.about)
            self.level, self.about = want, about
            return ch
        if k_lower is not None and 0 < want < self.level and self.run_len >= k_lower:
            ch = Change("lowered", k_lower, self.level, self.about)
            self.level = want
            return ch
        return None


def level_changes(h: Hysteresis, sev: np.ndarray, *, k_raise: int,
                  k_clear: int) -> Iterator[tuple[int, Change]]:
    """A health signal over a batch, run by run (a million rows in one call): ``sev`` per row -1
    unknown (skipped), 0 fine, 1 warn, 2 critical; a level must hold for ``k_raise`` judged rows
    to be raised (escalations too) or lowered, and be gone for ``k_clear`` to clear. Yields
    (row index, change)."""
    judged = np.flatnonzero(sev >= 0)
    if not judged.size:
        return
    sv = sev[judged]
    starts = np.flatnonzero(np.concatenate([[True], sv[1:] != sv[:-1]]))
    ends = np.concatenate([starts[1:], [sv.size]])
    for a, e in zip(starts, ends, strict=True):
        level = int(sv[a])
        prior = h.extend(level or None, int(e - a))
        ch = h.settle(level, k_raise=k_raise, k_lower=k_raise, k_clear=k_clear)
        if ch is not None:
            yield int(judged[a + max(0, ch.need - prior - 1)]), ch
