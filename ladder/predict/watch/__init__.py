"""The watcher: a pure function ``check(prereg, points, state) -> CheckResult(alerts, state)``.

No file, clock or network access here (the caller passes ``now``): ``ladder.sources`` reads the
points, ``predict.sinks`` sends the alerts, ``ladder.predict.live.Watcher`` glues them with a
persisted state. Points arrive as a :class:`Batch` (columns of logged rows, NaN where a key is
missing, with a mask of values *written* non-finite); the train-level rules are vectorised over
it (a 1M-row file is judged in well under a second), the loss rules loop over eval rows only.

Modules: ``judge`` the loop (:func:`check`); ``rules`` the registry ``RULES``, one class per
rule owning its thresholds, typed state, words, keys and alert kinds (families ``rules.loss``,
``rules.heading``, ``rules.health``, ``rules.run``; ``rules.hysteresis`` the raise-and-clear they
share); ``config`` (:class:`WatchConfig`) and ``state`` (:class:`WatchState`), derived from the
rules; ``alerts`` (:class:`Alert`, severities and exit statuses, DESIGN.md section 4); ``view``
the pre-registration as arrays (:class:`PreregView`); ``multi`` several metrics.
"""

from ladder.predict.watch.alerts import SEVERITIES, Alert, CheckResult, exit_code_for
from ladder.sources.batch import Batch, concat_batches
from ladder.predict.watch.config import WatchConfig
from ladder.predict.watch.judge import check, row_fractions
from ladder.predict.watch.rules import RULES, alert_kinds, decision_rule_words, rule, watched_keys
from ladder.predict.watch.rules.run import config_difference
from ladder.predict.watch.state import SCHEMA as STATE_SCHEMA
from ladder.predict.watch.state import WatchState, check_state, new_state
from ladder.predict.watch.view import PreregView

__all__ = ["RULES", "SEVERITIES", "STATE_SCHEMA", "Alert", "Batch", "CheckResult", "PreregView",
           "WatchConfig", "WatchState", "alert_kinds", "check", "check_state", "concat_batches",
           "config_difference", "decision_rule_words", "exit_code_for", "new_state",
           "row_fractions", "rule", "watched_keys"]
