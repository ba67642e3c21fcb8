"""The watcher: a pure function ``check(prereg, points, state) -> CheckResult(alerts, state)``.

Everything here is a function of its arguments: no file, clock or network access (the caller
passes ``now``). I/O lives around it (``predict.sources`` reads points, ``predict.sinks`` sends
alerts, ``ladder.predict.live.Watcher`` glues them with a persisted state).

Where things live (each module a concern):

- ``judge``: the loop, :func:`check` (and :func:`stalled_check`, :func:`row_fractions`);
- ``rules``: the registry ``RULES``, each rule one class of the :class:`Rule` protocol
  (``rules.base``) that owns its thresholds (a frozen ``Config``), its typed ``State``, its words,
  the keys it reads, its alert kinds and its judge; the steps to add one are in the docstring of
  ``rules/__init__.py``. One module per rule family: ``rules.loss`` (band, trend, rising,
  contingency), ``rules.heading`` (the updated forecast's early warning), ``rules.health``
  (non-finite, spikes, grad norm, drops, router, parameter norms), ``rules.run`` (applicability,
  the input's remarks, stalled); ``rules.hysteresis`` the raise-and-clear every rule with a
  level shares (:class:`Hysteresis`);
- ``config``: the thresholds, :class:`WatchConfig`, derived from the rules' ``Config`` classes;
- ``state``: the watcher state, derived from the rules' ``State`` classes (:class:`WatchState`;
  ``watch-state/2``);
- ``alerts``: :class:`Alert`, severities and exit statuses;
- ``batch``: rows as columns, :class:`Batch`; ``view``: the pre-registration as arrays,
  :class:`PreregView`; ``multi``: several metrics watched together.

Points arrive as a :class:`Batch`: columns of one logged row each (``step`` plus float columns,
NaN where a key is missing, and a mask of values that were *written* non-finite). Train-level rules
are vectorised over the batch so that a 1M-row file is judged in well under a second; the
loss-vs-forecast rule loops over eval rows only (a few hundred per run).

Rules (thresholds in :class:`WatchConfig`, stored in the pre-registration's ``decision_rule``):

1. **loss vs forecast**: the residual of the metric against the forecast, smoothed over evals
   (exponential moving average), outside the band for ``k_consecutive`` evals -> warn, named
   ``above_band`` (worse than forecast) or ``below_band`` (better); outside for ``k_critical``
   evals, or far outside (beyond the band by ``far_factor`` of its half-width) for ``k_far`` evals
   -> critical; back inside for ``k_clear`` evals -> ``cleared`` (info). Hysteresis: no new alert
   while the state does not change.
1b. **trend**: the smoothed residual (relative to the forecast) moving more than ``trend_rel`` from
   its own median over an earlier window of the run -> warn: a step or drift that stays inside the
   band (a healthy run keeps its offset to the forecast; a fault moves it).
1c. **rising**: the metric above its own running minimum by more than ``rise_rel`` (and
   ``rise_noise_k`` x the ladder's eval noise) for ``rise_k`` consecutive evals -> warn.
1d. **heading**: the updated final-loss forecast (ladder.predict.updated: the frozen curve moved by
   the run's own evals) and its band apart from the frozen final band widened to the alert level
   for ``heading_k`` evals -> warn (info when better): the run is heading outside its contract.
2. **token-drop fraction** (``moe/drop_frac``) against the ladder's value at the same fraction of
   the schedule (reference curves stored in the pre-registration), else absolute thresholds.
3. **numerical stability**: non-finite loss/grad-norm -> critical at once; grad-norm level against
   the ladder and its growth since warmup (the real team added logit z-loss when grad norm grew
   past 4: Marin hero-run tracking issue, see shared/DESIGN.md section 1); train-loss spikes
   against a trailing median; parameter-norm growth per group against the ladder's, with
   ``router_bias`` judged on its own (set by a balancing rule, not by gradients; spikes early).
4. **contingency**: a confirmed ``above_band`` deviation inside the first ``contingency_fraction``
   of the token budget -> an advisory with the projected final value if the run continues and the
   token budget at which the registered final value would still be reached.

Also ``stalled`` (no new point for ``stalled_seconds``) and ``not_applicable`` (an applicability
condition of the pre-registration is broken: from here on nothing is compared, exit status 3).

Each rule is a :class:`Rule` in ``RULES`` (``predict.watch.rules``): the metric keys it reads, its
alert kinds, its thresholds, the state it keeps, its slice of the decision rule in words and its
judge. ``check`` runs the registry in order; :class:`WatchConfig`, the state file, the watcher's key
filter (:func:`watched_keys`), the pre-registration's ``decision_rule.words`` and the report's
alert kinds (:func:`alert_kinds`) are derived from it.
"""

from ladder.predict.watch.alerts import SEVERITIES, Alert, CheckResult, exit_code_for
from ladder.sources.batch import Batch, KeyFilter, concat_batches
from ladder.predict.watch.config import RETIRED_PARAMETERS, WatchConfig
from ladder.predict.watch.judge import check, row_fractions, stalled_check
from ladder.predict.watch.rules import (
                                 ALIGN_KEYS,
                                 RULES,
                                 Rule,
                                 alert_kinds,
                                 decision_rule_words,
                                 health_alert_kinds,
                                 rule,
                                 watched_keys,
)
from ladder.predict.watch.rules.loss import EvalPoint
from ladder.predict.watch.rules.run import (
                                 applicability_breaks,
                                 config_difference,
                                 config_facts,
                                 lookup,
)
from ladder.predict.watch.state import SCHEMA as STATE_SCHEMA
from ladder.predict.watch.state import WatchState, check_state, new_state
from ladder.predict.watch.view import Envelope, PreregView

__all__ = ["ALIGN_KEYS", "RETIRED_PARAMETERS", "RULES", "SEVERITIES", "STATE_SCHEMA", "Alert",
           "Batch", "CheckResult", "Envelope", "EvalPoint", "KeyFilter", "PreregView", "Rule",
           "WatchConfig", "WatchState", "alert_kinds", "applicability_breaks", "check",
           "check_state", "concat_batches", "config_difference", "config_facts",
           "decision_rule_words", "exit_code_for", "health_alert_kinds", "lookup", "new_state",
           "row_fractions", "rule", "stalled_check", "watched_keys"]
