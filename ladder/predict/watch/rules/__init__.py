"""The registry: the rules in the order they judge (and list their alerts). ``WatchConfig``, the
state file, the watcher's key filter (:func:`watched_keys`), ``decision_rule.words``
(:func:`decision_rule_words`) and the report's alert kinds (:func:`alert_kinds`) derive from it.

A new rule: (1) its class (the :class:`Rule` protocol, ``rules.base``) in its family's module or
its own: ``name``, ``scope``, ``family``, ``kinds``, ``description``, ``panel``, ``template``
(its words; or a ``text`` method); nested in it, ``Config`` a frozen ``Thresholds`` dataclass of
``threshold(default, check)`` fields (a group shared with other rules by inheriting its
dataclass, e.g. ``HealthPersistence``) and ``State`` a ``RuleState`` dataclass of
``kept(kind, default)`` fields (raise and clear with a ``Hysteresis``); ``keys`` and ``judge``;
(2) an instance in ``RULES`` below, where it should judge; (3) tests: its judge against
``check()`` and a case in tests/test_watch_rules_e2e.py (whose registry test fails until it has
one). A state or pre-registration written before it existed still reads (its section and
thresholds take their defaults).
"""

from __future__ import annotations

from collections.abc import Sequence

from ladder.sources.batch import KeyFilter
from ladder.predict.watch.rules.base import Rule
from ladder.predict.watch.rules.health import (DropFracRule, ExpertLoadRule, GradNormRule, NanRule,
                                               ParamNormRule, RouterBiasRule, RouterEntropyRule,
                                               RouterLogitRule, SpikeRule)
from ladder.predict.watch.rules.heading import HeadingRule
from ladder.predict.watch.rules.loss import BandRule, ContingencyRule, RiseRule, TrendRule
from ladder.predict.watch.rules.run import ApplicabilityRule, InputRule, StalledRule

# Registry order is the order the rules judge a batch (and list their alerts).
RULES: tuple[Rule, ...] = (
    ApplicabilityRule(), InputRule(), NanRule(),
    RiseRule(), TrendRule(), BandRule(), ContingencyRule(), HeadingRule(),  # eval by eval
    SpikeRule(), GradNormRule(), DropFracRule(), RouterEntropyRule(), ExpertLoadRule(),
    RouterLogitRule(), RouterBiasRule(), ParamNormRule(),
    StalledRule(),
)

_keys = [r.key for r in RULES if r.State is not None]
if len(set(_keys)) != len(_keys):  # two rules in one section would overwrite each other
    raise AssertionError(f"rules share a state section: {sorted(_keys)}")

# keys every rule needs to place a row on the forecast (DESIGN.md section 3: metrics.jsonl)
ALIGN_KEYS = ("tokens", "progress")


def rule(name: str) -> Rule:
    return {r.name: r for r in RULES}[name]  # KeyError(name) for another


def watched_keys(metric: str | Sequence[str], config=None) -> tuple[KeyFilter, list[str]]:
    """The key filter of a source (which keys the rules read) and its fixed keys, sorted;
    ``metric`` one key, or the keys of a multi-metric watch (the union of what each reads);
    ``config`` a ``WatchConfig`` (None: the defaults)."""
    fixed = set(ALIGN_KEYS)
    prefixes: list[str] = []
    for r in RULES:
        for m in ([metric] if isinstance(metric, str) else metric):
            fixed.update(r.reads(m, config))
        prefixes += [p for p in r.prefixes if p not in prefixes]
    return KeyFilter(frozenset(fixed), tuple(prefixes)), sorted(fixed)


def alert_kinds(panel: str | None = None) -> frozenset[str]:
    """Alert kinds the rules raise (of rules drawn on ``panel``, when given); "cleared" is shared
    by several rules and left out of a panel's set (its message says what cleared)."""
    out = {k for r in RULES if panel is None or r.panel == panel for k in r.kinds}
    return frozenset(out if panel is None else out - {"cleared"})


def decision_rule_words(cfg, level: float) -> str:
    """The decision rule in words (stored beside the parameters in the pre-registration): each
    rule's own slice, in registry order (``RULES``); ``cfg`` a ``WatchConfig``."""
    return " ".join(r.words(cfg, level) for r in RULES)
