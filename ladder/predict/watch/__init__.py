"""The watcher: a pure function ``check(prereg, points, state) -> CheckResult(alerts, state)``.

No file, clock or network access here (the caller passes ``now``): ``ladder.sources`` reads the
points, ``predict.sinks`` sends the alerts, ``ladder.predict.live.Watcher`` glues them with a
persisted state. Points arrive as a :class:`Batch` (columns of logged rows, NaN where a key is
missing, with a mask of values *written* non-finite); the train-level rules are vectorised over
it (a 1M-row file is judged in well under a second), the loss rules loop over eval rows only.

Modules, one concern each:

- ``judge``: the loop, :func:`check`;
- ``rules``: the registry ``RULES``, one class per rule (the :class:`Rule` protocol,
  ``rules.base``) owning its thresholds, typed state, words, keys, alert kinds and judge; a new
  rule's steps are in ``rules/__init__.py``. Families: ``rules.loss`` (band, trend, rising,
  contingency), ``rules.heading`` (the updated forecast's early warning), ``rules.health``
  (non-finite, spikes, grad norm, drops, router, parameter norms), ``rules.run``
  (applicability, the input's remarks, stalled); ``rules.hysteresis`` the raise-and-clear they
  share;
- ``config`` (:class:`WatchConfig`) and ``state`` (:class:`WatchState`, ``watch-state/2``):
  derived from the rules, as are the watcher's key filter (:func:`watched_keys`), the
  pre-registration's ``decision_rule.words`` and the report's alert kinds (:func:`alert_kinds`);
- ``alerts``: :class:`Alert`, severities and exit statuses (DESIGN.md section 4);
- ``view``: the pre-registration as arrays (:class:`PreregView`); ``multi``: several metrics.
"""

from ladder.predict.watch.alerts import SEVERITIES, Alert, CheckResult, exit_code_for
from ladder.sources.batch import Batch, concat_batches
from ladder.predict.watch.config import WatchConfig
from ladder.predict.watch.judge import check, row_fractions
from ladder.predict.watch.rules import (
                                 RULES,
                                 alert_kinds,
                                 decision_rule_words,
                                 health_alert_kinds,
                                 rule,
                                 watched_keys,
)
from ladder.predict.watch.rules.run import config_difference
from ladder.predict.watch.state import SCHEMA as STATE_SCHEMA
from ladder.predict.watch.state import WatchState, check_state, new_state
from ladder.predict.watch.view import PreregView

__all__ = ["RULES", "SEVERITIES", "STATE_SCHEMA", "Alert", "Batch", "CheckResult", "PreregView",
           "WatchConfig", "WatchState", "alert_kinds", "check", "check_state", "concat_batches",
           "config_difference", "decision_rule_words", "exit_code_for", "health_alert_kinds",
           "new_state", "row_fractions", "rule", "watched_keys"]
