"""The decision rule's thresholds, stored in the pre-registration's ``decision_rule.parameters``
(one flat dict) and validated here, split by concern: :class:`LossRules` (the loss rules,
``rules.loss``), :class:`HealthRules` (``rules.health``) and :class:`RunRules` (alignment,
stalled, applicability: ``rules.run``). :class:`WatchConfig` is all three in one frozen object
with flat fields, which is what a pre-registration stores and the rules read
(``view.config.k_consecutive``); ``.loss``, ``.health`` and ``.run`` give one concern alone.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

# decision-rule parameters of earlier versions, ignored when reading an older pre-registration
# (entropy_drop: router entropy below (1 - x) of the ladder's median; replaced by the envelope;
# drop_warn_ratio / drop_crit_ratio: x the ladder's median; replaced by the envelope and
# drop_crit_factor)
RETIRED_PARAMETERS = frozenset({"entropy_drop", "drop_warn_ratio", "drop_crit_ratio"})




def _positive_int(v) -> str | None:
    return None if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else \
        "a positive integer"


def _positive(v) -> str | None:
    return None if isinstance(v, (int, float)) and v > 0 and math.isfinite(v) else \
        "a positive number"


def _unit(v) -> str | None:
    return None if isinstance(v, (int, float)) and 0.0 <= v <= 1.0 else "in [0, 1]"


def _check(test, obj, names: tuple) -> None:
    """ValueError naming the first of ``names`` whose value fails ``test``."""
    for name in names:
        v = getattr(obj, name)
        want = test(v)
        if want:
            raise ValueError(f"{name}: must be {want}, got {v!r}")


@dataclass(frozen=True)
class LossRules:
    """The loss rules' thresholds (rules 1, 1b, 1c and 4: ``predict.watch.rules.loss``)."""

    # rule 1: loss vs forecast
    alert_level: float = 0.99      # band level the alerts use: the registered band (say 90%)
    #                                widened by z(alert_level)/z(band_level) (Gaussian). A healthy
    #                                run sits outside a calibrated 90% band 10% of the time, and its
    #                                offset persists over the run, so alerting at 90% would flag
    #                                ~1 healthy run in 10; bench/watch_quality.py measures both.
    ema_alpha: float = 0.5         # smoothing of the residual over evals (1.0 = none)
    k_consecutive: int = 3         # evals outside the band before a warning
    k_critical: int = 6            # evals outside before a warning becomes critical ("persisting")
    far_factor: float = 1.0        # "far outside": beyond the band by this x its half-width ...
    k_far: int = 2                 # ... for this many evals -> critical
    k_clear: int = 2               # evals back inside before "cleared"
    min_fraction: float = 0.01     # no comparison before 1% of the run (warmup, steep start)
    # rule 1b: a change against the run's own earlier level (catches a step or a drift inside the
    # band: a healthy run keeps its offset to the forecast, a fault moves it)
    trend_rel: float = 0.01        # smoothed residual moved by 1% of the forecast ...
    trend_window: float = 0.5      # ... from its median over the preceding 50% of the run ...
    #                                (0.3 misses slow drifts: docs/LOG.md, 2026-12-01, "the
    #                                trend window"; bench/watch_quality.py)
    trend_gap: float = 0.03        # ... ending 3% of the run before the eval judged
    trend_after: float = 0.25      # not before 25% of the run: the early curve is least certain
    #                                (the cpu demo's healthy hero drifted 2.2% of the forecast
    #                                toward "better" between 10% and 30%)
    trend_band: float = 0.25       # the threshold is at least this x the registered band's
    #                                relative half-width at that fraction (a wide band = a curve
    #                                shape the law knows less well) ...
    trend_noise_k: float = 4.0     # ... and at least this x the sd of the smoothed residual's own
    #                                eval-to-eval noise (robust, from the run's history).
    #                                A move toward "better" than forecast is recorded as info.
    # rule 1c: the metric rising above its own running minimum. A healthy run's held-out loss does
    # not go up while it trains; a data or optimizer fault makes it, well before the offset to a
    # wide forecast band shows (cpu demo, loss-drift from 40%: +4.9% one eval after onset, +11.5%
    # two evals after; the band and trend rules needed 5 evals)
    rise_rel: float = 0.01         # above the running minimum by 1% of it ...
    rise_noise_k: float = 4.0      # ... and by at least this x the ladder's eval noise ...
    rise_k: int = 2                # ... for this many consecutive evals -> warn "rising"
    rise_after: float = 0.1        # judged from 10% of the run on
    # rule 4: contingency
    contingency_fraction: float = 0.25   # real plan: trouble in the first 25% of tokens

    def __post_init__(self):
        if not 0.0 < self.alert_level < 1.0:
            raise ValueError(f"alert_level: must be in (0, 1), got {self.alert_level!r}")
        if not 0.0 < self.ema_alpha <= 1.0:
            raise ValueError(f"ema_alpha: must be in (0, 1], got {self.ema_alpha!r}")
        _check(_positive_int, self, ("k_consecutive", "k_critical", "k_far", "k_clear", "rise_k"))
        _check(_positive, self, ("trend_rel", "far_factor", "trend_noise_k", "rise_rel",
                                 "rise_noise_k"))
        _check(_unit, self, ("trend_window", "trend_gap", "trend_after", "min_fraction",
                             "contingency_fraction", "trend_band", "rise_after"))
        if self.k_critical < self.k_consecutive:
            raise ValueError("k_critical: must be >= k_consecutive")


@dataclass(frozen=True)
class HealthRules:
    """The health rules' thresholds (rules 2 and 3: ``predict.watch.rules.health``)."""

    # rule 2: token-drop fraction
    drop_window: int = 20          # rows in the trailing median
    drop_crit_factor: float = 2.5  # critical: this x the warning limit (the ladder's max at the
    #                                same fraction x exp(tolerance + margin), see envelope_*)
    drop_warn_abs: float = 0.08    # without a ladder reference (issue: hero ~2%, 8% plausible)
    drop_crit_abs: float = 0.40    # (at 65k context the real drops went 7% -> 40%)
    drop_floor: float = 0.01       # below this drop fraction never alert
    # rule 3: stability
    spike_window: int = 50         # rows in the trailing median (and MAD) of train loss
    spike_k: float = 7.0           # a spike: train loss > trailing median + k x 1.4826 x MAD
    #                                (a robust z-score above k). With ladder runs, preregister
    #                                raises k to spike_k_margin x the largest z of the ladder's
    #                                healthy runs (the cpu ladder: 1.5; its proxy hero: 2.7,
    #                                with 4k tokens a step); this value is the floor: 1M rows of
    #                                Gaussian noise on a loss curve reach z 6.8 (3 rows above 6),
    #                                and heavier tails show on the ladder and raise k.
    spike_k_margin: float = 1.5
    spike_rel: float = 0.02        # ... and at least this much above the median (a flat series
    #                                has MAD 0)
    grad_window: int = 20
    grad_after: float = 0.02       # ignore grad norm before this fraction (warmup transients)
    grad_growth_warn: float = 4.0  # growth of grad norm since its post-warmup minimum (real: 4)
    grad_ref_warn: float = 4.0     # x the ladder's grad norm at the same fraction
    grad_ref_crit: float = 16.0
    # router: entropy below / load max-over-mean above the envelope (min..max) of the ladder's
    # rungs at the same fraction, widened by the ladder's own leave-one-rung-out tolerance (how
    # far one rung strays outside the others' envelope; stored in health_reference) plus this
    # margin, in log units. Entropy and load differ with size and depth (cpu ladder, 30% of the
    # run: entropy 0.6 to 1.5 across rungs), so a fixed fraction of the ladder's mean is not a
    # rule. A collapse (entropy -> 0, load -> n_experts/top_k) leaves the widened envelope.
    # The same envelope rule judges the token-drop fraction (rule 2): it too differs between
    # rungs (cpu ladder at the end of the run: 1.5% to 9%).
    envelope_margin: float = 0.25  # exp(0.25) = 1.28x beyond the calibrated tolerance
    envelope_tol: float = 0.5      # floor of the tolerance (and its value when the ladder has
    #                                fewer than 3 rungs to measure it): a leave-one-rung-out max
    #                                over 3-4 rungs underestimates the spread of the next size
    #                                (cpu ladder: 0.27 over 3 rungs, while the 4th strays 0.7)
    envelope_tol_max: float = 1.1  # ... and its cap (x3): a ladder whose small rungs scatter
    #                                wildly (cpu ladder drop fraction: 1.8, x6) must not blind
    #                                the rule to a jump like 7% -> 40% (issue: 65k context)
    param_growth_ratio: float = 2.0  # per-group norm growth vs the ladder's, either way
    router_bias_after: float = 0.1   # router_bias spikes early by design: judge it after this
    router_bias_jump: float = 3.0    # |router_bias| norm > this x its trailing median
    k_health: int = 5              # rows a health condition must hold before an alert
    k_health_clear: int = 20       # rows it must be gone before "cleared"
    nan_keys: tuple = ("train/loss", "grad/norm", "eval/loss")

    def __post_init__(self):
        _check(_positive_int, self, ("drop_window", "spike_window", "grad_window", "k_health",
                                     "k_health_clear"))
        _check(_positive, self, ("drop_crit_factor", "drop_warn_abs", "drop_crit_abs",
                                 "spike_rel", "spike_k", "spike_k_margin", "envelope_tol",
                                 "envelope_tol_max", "grad_growth_warn", "grad_ref_warn",
                                 "grad_ref_crit", "param_growth_ratio", "router_bias_jump",
                                 "envelope_margin"))
        _check(_unit, self, ("drop_floor", "grad_after", "router_bias_after"))
        object.__setattr__(self, "nan_keys", tuple(self.nan_keys))


@dataclass(frozen=True)
class RunRules:
    """How rows are placed on the forecast; the run-level rules (``predict.watch.rules.run``)."""

    align: str = "auto"            # how a row maps to the forecast: auto | tokens | step | fraction
    # stalled and applicability
    stalled_seconds: float = 1800.0
    steps_tolerance: float = 0.005  # planned steps implied by step/progress may differ this much

    def __post_init__(self):
        if self.align not in ("auto", "tokens", "step", "fraction"):
            raise ValueError(f"align: must be auto, tokens, step or fraction, got {self.align!r}")
        _check(_positive, self, ("stalled_seconds", "steps_tolerance"))


_PARTS = (("loss", LossRules), ("health", HealthRules), ("run", RunRules))


@dataclass(frozen=True)
class WatchConfig(RunRules, HealthRules, LossRules):
    """Thresholds of the decision rule: every concern's fields, flat (as stored in the
    pre-registration and read by the rules); each part validates its own."""

    def __post_init__(self):
        for _, part in _PARTS:
            part.__post_init__(self)

    def _part(self, cls):
        return cls(**{f.name: getattr(self, f.name) for f in dataclasses.fields(cls)})

    @property
    def loss(self) -> LossRules:
        return self._part(LossRules)

    @property
    def health(self) -> HealthRules:
        return self._part(HealthRules)

    @property
    def run(self) -> RunRules:
        return self._part(RunRules)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["nan_keys"] = list(self.nan_keys)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> WatchConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k not in RETIRED_PARAMETERS}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown decision-rule parameter")
        return cls(**dict(d))

