"""The registry: each rule a :class:`Rule` (the keys it reads, its alert kinds, the state it
keeps, its slice of the decision rule in words and its judge), in the order they judge.
The watcher's key filter (:func:`watched_keys`), the pre-registration's
``decision_rule.words`` and the report's alert kinds (:func:`alert_kinds`) come from it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from predict.watch.batch import KeyFilter
from predict.watch.config import WatchConfig
from predict.watch.rules.health import (
    _drop_rule,
    _entropy_rule,
    _grad_rule,
    _load_rule,
    _nan_rule,
    _param_norm_rule,
    _router_bias_rule,
    _spike_rule,
    _words_drop,
    _words_envelope,
    _words_grad,
    _words_nan,
    _words_param_norm,
    _words_router_bias,
    _words_spike,
)
from predict.watch.rules.loss import (
    _band_rule,
    _contingency_rule,
    _rise_rule,
    _trend_rule,
    _words_band,
    _words_contingency,
    _words_rise,
    _words_trend,
)
from predict.watch.rules.run import _words_applicability, _words_input, _words_stalled


@dataclass(frozen=True)
class Rule:
    """One rule of the decision rule.

    ``scope`` says how :func:`check` calls ``judge``: "batch" rules see the whole batch
    ``judge(view, batch, frac, tokens, st, emit, stamp)``; "eval" rules see one eval at a time
    ``judge(view, st, EvalPoint, emit, stamp)`` (the loss rules, which share the residual's EMA);
    "run" rules are judged by :func:`check` itself before anything else (applicability, stalled,
    the input's own remarks). ``keys(metric, config)`` names the metric keys it reads, plus every
    key starting with one of ``prefixes``; ``state`` the entries of the watcher state it owns;
    ``panel`` where the report draws its alerts ("watch": the loss plot, "health": the health
    panels of the keys it reads, None: listed only)."""

    name: str
    scope: str
    kinds: tuple[str, ...]
    state: tuple[str, ...]
    description: str
    words: Callable[[WatchConfig, float], str]                  # (config, band level) -> text
    keys: Callable[[str, WatchConfig], tuple] | None = None      # (metric, config) -> keys
    prefixes: tuple[str, ...] = ()
    judge: Callable[..., None] | None = None
    panel: str | None = None

    def __post_init__(self):
        if self.scope not in ("run", "batch", "eval"):
            raise ValueError(f"scope: must be run, batch or eval, got {self.scope!r}")
        if self.scope != "run" and self.judge is None:
            raise ValueError(f"judge: a {self.scope} rule needs a judge ({self.name})")
        if self.panel not in (None, "watch", "health"):
            raise ValueError(f"panel: must be watch, health or null, got {self.panel!r}")

    def reads(self, metric: str, config: WatchConfig) -> tuple[str, ...]:
        return tuple(self.keys(metric, config)) if self.keys else ()


def _metric_key(metric, cfg):
    return (metric,)


# Registry order is the order the rules judge a batch (and list their alerts).
RULES: tuple[Rule, ...] = (
    Rule("applicability", "run", ("not_applicable",), ("not_applicable",),
         "the run is still the one the forecast was made for (configuration, planned steps)",
         _words_applicability, keys=lambda m, c: ("progress",)),
    Rule("input", "run", ("rewind", "missing_metric"), ("last_step", "missing_metric"),
         "remarks on the rows themselves: steps logged again, the metric missing",
         _words_input),
    Rule("nan", "batch", ("nan",), ("nan_reported",),
         "a non-finite metric, train loss, grad norm or eval loss (critical at once)",
         _words_nan, keys=lambda m, c: (m, *c.nan_keys), judge=_nan_rule, panel="watch"),
    Rule("rising", "eval", ("rising", "cleared"), ("rise",),
         "the held-out metric rising above its own running minimum",
         _words_rise, keys=_metric_key, judge=_rise_rule, panel="watch"),
    Rule("trend", "eval", ("trend", "cleared"), ("trend",),
         "the residual to the forecast moving away from its own earlier level (inside the band)",
         _words_trend, keys=_metric_key, judge=_trend_rule, panel="watch"),
    Rule("band", "eval", ("above_band", "below_band", "cleared"), ("band", "n_evals"),
         "the smoothed metric outside the forecast band, with hysteresis",
         _words_band, keys=_metric_key, judge=_band_rule, panel="watch"),
    Rule("contingency", "eval", ("contingency",), ("band.contingency_sent",),
         "a confirmed deviation early in the run: projected final value and the budget to reach "
         "the registered one", _words_contingency, keys=_metric_key, judge=_contingency_rule,
         panel="watch"),
    Rule("spike", "batch", ("spike",), ("tails.train/loss", "last_spike_step"),
         "train-loss spikes against a robust trailing median",
         _words_spike, keys=lambda m, c: ("train/loss",), judge=_spike_rule),
    Rule("grad_norm", "batch", ("grad_norm", "cleared"), ("signals.grad/norm", "grad_min"),
         "grad norm against the ladder's and its growth since warmup",
         _words_grad, keys=lambda m, c: ("grad/norm",), judge=_grad_rule, panel="health"),
    Rule("drop_frac", "batch", ("drop_frac", "cleared"), ("signals.moe/drop_frac",),
         "the token-drop fraction against the ladder's envelope at the same fraction",
         _words_drop, keys=lambda m, c: ("moe/drop_frac",), judge=_drop_rule, panel="health"),
    Rule("router_entropy", "batch", ("router", "cleared"), ("signals.moe/router_entropy",),
         "router entropy below the ladder's envelope (a collapse)",
         _words_envelope("Router entropy below"), keys=lambda m, c: ("moe/router_entropy",),
         judge=_entropy_rule, panel="health"),
    Rule("expert_load", "batch", ("router", "cleared"), ("signals.moe/load_max_over_mean",),
         "expert load max/mean above the ladder's envelope (a collapse onto few experts)",
         _words_envelope("Expert load max/mean above"),
         keys=lambda m, c: ("moe/load_max_over_mean",), judge=_load_rule, panel="health"),
    Rule("router_bias", "batch", ("router", "cleared"), ("signals.params/norm/router_bias",),
         "the router-bias norm jumping over its trailing median (it is not gradient-trained)",
         _words_router_bias, keys=lambda m, c: ("params/norm/router_bias",),
         judge=_router_bias_rule, panel="health"),
    Rule("param_norm", "batch", ("param_norm", "cleared"), ("signals.params/norm/*",
                                                            "param_base/*"),
         "parameter-norm growth per group against the ladder's",
         _words_param_norm, prefixes=("params/norm/",), judge=_param_norm_rule, panel="health"),
    Rule("stalled", "run", ("stalled",), ("stalled", "last_point_time"),
         "no new point for a while", _words_stalled, panel="watch"),
)


# keys every rule needs to place a row on the forecast (DESIGN.md section 3: metrics.jsonl)
ALIGN_KEYS = ("tokens", "progress")


def rule(name: str) -> Rule:
    for r in RULES:
        if r.name == name:
            return r
    raise KeyError(name)


def watched_keys(metric: str | Sequence[str],
                 config: WatchConfig | None = None) -> tuple[KeyFilter, list[str]]:
    """The key filter of a source (which keys the rules read) and its fixed keys, sorted;
    ``metric`` one key, or the keys of a multi-metric watch (the union of what each reads)."""
    cfg = config or WatchConfig()
    fixed = set(ALIGN_KEYS)
    prefixes: list[str] = []
    for r in RULES:
        for m in ([metric] if isinstance(metric, str) else metric):
            fixed.update(r.reads(m, cfg))
        prefixes += [p for p in r.prefixes if p not in prefixes]
    return KeyFilter(frozenset(fixed), tuple(prefixes)), sorted(fixed)


def alert_kinds(panel: str | None = None) -> frozenset[str]:
    """Alert kinds the rules raise (of rules drawn on ``panel``, when given); "cleared" is shared
    by several rules and left out of a panel's set (its message says what cleared)."""
    out = {k for r in RULES if panel is None or r.panel == panel for k in r.kinds}
    return frozenset(out if panel is None else out - {"cleared"})


def health_alert_kinds(config: WatchConfig | None = None) -> dict[str, tuple]:
    """For each fixed key a health-panel rule reads (and the non-finite rule's keys, the
    registered metric aside), the alert kinds raised about it."""
    cfg = config or WatchConfig()
    out: dict[str, list] = {}
    for r in RULES:
        if r.panel != "health" and r.name != "nan":
            continue
        for k in r.reads("", cfg):
            if not k:  # the registered metric's place: not a health key
                continue
            out.setdefault(k, [])
            out[k] += [x for x in r.kinds if x != "cleared" and x not in out[k]]
    return {k: tuple(v) for k, v in out.items()}


def decision_rule_words(cfg: WatchConfig, level: float) -> str:
    """The decision rule in words (stored beside the parameters in the pre-registration): each
    rule's own slice, in registry order (``RULES``)."""
    return " ".join(r.words(cfg, level) for r in RULES)
