"""The health rules, vectorised over a batch: non-finite values, train-loss spikes, grad norm,
token-drop fraction, router entropy and expert load against the ladder's envelope, the
router-bias norm and per-group parameter norms.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ladder.predict.watch.alerts import SEVERITIES, Alert, finite_or_none
from ladder.predict.watch.rules.base import (Context, Rule, RuleState, Thresholds, kept, positive,
                                             positive_int, threshold, unit)
from ladder.predict.watch.rules.hysteresis import Hysteresis, level_changes


class HealthRule(Rule):
    """A health rule: judged on the whole batch, drawn on the health panels of its keys."""

    scope = "batch"
    family = "health"
    panel = "health"


@dataclass(frozen=True)
class HealthPersistence(Thresholds):
    """How many rows a health condition must hold before it is raised and be gone to clear."""

    k_health: int = threshold(5, positive_int)
    k_health_clear: int = threshold(20, positive_int)


@dataclass(frozen=True)
class EnvelopeWidth(Thresholds):
    """How far a signal may stray outside the ladder's envelope (min..max of its rungs at the
    same fraction), in log units: the ladder's own leave-one-rung-out tolerance
    (forecast.envelope_tolerance) plus a margin. Router entropy, expert load and the token-drop
    fraction differ with size and depth (cpu ladder: entropy 0.6 to 1.5 across rungs at 30%,
    drops 1.5% to 9% at the end), so a fixed fraction of the ladder's mean is not a rule; a
    collapse (entropy -> 0, load -> n_experts/top_k) leaves the widened envelope."""

    envelope_margin: float = threshold(0.25, positive)  # exp(0.25) = 1.28x beyond the tolerance
    envelope_tol: float = threshold(0.5, positive)  # the tolerance's floor (and value with < 3
    #   rungs): a max over 3-4 rungs underestimates the next size (cpu ladder: 0.27 over 3
    #   rungs, the 4th strays 0.7)
    envelope_tol_max: float = threshold(1.1, positive)  # ... and cap: small rungs that scatter
    #   wildly (cpu ladder drops: 1.8) must not blind the rule to 7% -> 40% (65k context)


@dataclass(frozen=True)
class DropWindow(Thresholds):
    drop_window: int = threshold(20, positive_int)  # rows in the trailing median


@dataclass(frozen=True)
class SpikeWindow(Thresholds):
    spike_window: int = threshold(50, positive_int)  # rows in the trailing median and MAD


@dataclass(frozen=True)
class GradWindow(Thresholds):
    grad_window: int = threshold(20, positive_int)  # rows in the trailing median of a norm


@dataclass(frozen=True)
class GradAfter(Thresholds):
    grad_after: float = threshold(0.02, unit)  # norms before this fraction: warmup transients


@dataclass
class SignalState(RuleState):
    """One health signal: its hysteresis and its key's last finite values (the next batch's
    trailing window)."""

    signal: Hysteresis = kept(Hysteresis, factory=Hysteresis)
    tail: list = kept("nums", factory=list)


def trailing(tail: list, x: np.ndarray, window: int) -> tuple[np.ndarray, int, list]:
    """``x`` with the previous batch's last finite values (``tail``) prepended, where ``x``
    starts in it, and the new tail (its last ``window`` finite values)."""
    t = np.array(tail, dtype=float)
    both = np.concatenate([t, x])
    fin = both[np.isfinite(both)]
    return both, t.size, fin[-window:].tolist()


def rolling_median(x: np.ndarray, window: int, *, shift: bool) -> np.ndarray:
    """Trailing median over the finite values (NaN rows skipped); ``shift`` excludes the row."""
    from ladder.predict.rolling import rolling_median as fast
    x = np.asarray(x, dtype=float)
    ok = ~np.isnan(x)
    med = fast(x[ok], window, max(1, window // 4))
    if shift:
        med = np.concatenate([[np.nan], med[:-1]])
    out = np.full(x.size, np.nan)
    out[ok] = med
    return out


def trailing_median(st: SignalState, x: np.ndarray, window: int) -> np.ndarray:
    """The trailing median of ``window`` finite values at each row of ``x``, the previous
    batches' last values (kept in ``st.tail``) included."""
    both, off, st.tail = trailing(st.tail, x, window)
    return rolling_median(both, window, shift=False)[off:]


def signal(ctx: Context, cfg: HealthPersistence, h: Hysteresis, kind: str, key: str,
           sev: np.ndarray, value: np.ndarray, ref: np.ndarray | None,
           describe: Callable[[int, int], str]) -> None:
    """Alerts of a health signal with hysteresis (:func:`level_changes`), ``sev`` per row."""
    b, frac, tokens = ctx.batch, ctx.frac, ctx.tokens
    for at, ch in level_changes(h, sev, k_raise=cfg.k_health, k_clear=cfg.k_health_clear):
        where = (ctx.stamp, int(b.step[at]), finite_or_none(tokens[at]),
                 finite_or_none(frac[at]))
        if ch.kind == "raised":
            ctx.emit(Alert(*where, kind, SEVERITIES[h.level], value=finite_or_none(value[at]),
                           expected=None if ref is None else finite_or_none(ref[at]),
                           direction="above" if kind != "router" else None,
                           message=describe(at, h.level) + f" ({key})", extra={"key": key}))
        elif ch.kind == "cleared":
            ctx.emit(Alert(*where, "cleared", "info", value=finite_or_none(value[at]),
                           message=f"{key} back to normal for {ch.need} rows (was {kind}, "
                                   f"{SEVERITIES[ch.level_before]})",
                           extra={"key": key, "clears": kind}))


class NanRule(HealthRule):
    name = "nan"
    kinds = ("nan",)
    description = "a non-finite metric, train loss, grad norm or eval loss (critical at once)"
    panel = "watch"

    @dataclass(frozen=True)
    class Config(Thresholds):
        nan_keys: tuple = threshold(("train/loss", "grad/norm", "eval/loss"), convert=tuple)

    @dataclass
    class State(RuleState):
        reported: list = kept("strs", factory=list)  # keys already reported (once each)

    def keys(self, metric, cfg):
        return (metric, *cfg.nan_keys)

    def judge(self, ctx: Context, cfg: Config, st: State) -> None:
        b = ctx.batch
        for k in dict.fromkeys((ctx.view.metric,) + tuple(cfg.nan_keys)):
            nf = b.nonfinite.get(k)
            if nf is None or not nf.any() or k in st.reported:
                continue
            i = int(np.flatnonzero(nf)[0])
            st.reported.append(k)
            ctx.emit(Alert(ctx.stamp, int(b.step[i]), finite_or_none(ctx.tokens[i]),
                           finite_or_none(ctx.frac[i]), "nan", "critical", value=None,
                           message=f"{k} is not finite at step {int(b.step[i])}",
                           extra={"key": k}))

    def text(self, c: Config, level: float) -> str:
        return f"A non-finite {', '.join(c.nan_keys)} or metric is critical at once."


class SpikeRule(HealthRule):
    name = "spike"
    kinds = ("spike",)
    description = "train-loss spikes against a robust trailing median"
    panel = None  # listed only (a tick on the loss plot's edge)
    fixed_keys = ("train/loss",)
    template = ("Train loss above its trailing median of {c.spike_window} rows by more than "
                "{c.spike_k:g}x the robust sd (1.4826 x MAD; k = {c.spike_k_margin}x the "
                "largest such z-score of the ladder's healthy runs, at least the default) and "
                "more than {c.spike_rel:.0%} is a spike.")

    @dataclass(frozen=True)
    class Config(SpikeWindow):
        # a spike: a robust z-score above k; preregister raises k to spike_k_margin x the largest z
        # of the ladder's healthy runs. This floor: 1M rows of Gaussian noise reach z 6.8.
        spike_k: float = threshold(7.0, positive)
        spike_k_margin: float = threshold(1.5, positive)
        spike_rel: float = threshold(0.02, positive)  # ... and this much above the median (a flat
        #                                               series has MAD 0)

    @dataclass
    class State(RuleState):
        tail: list = kept("nums", factory=list)  # the last 2 x spike_window finite train losses
        last_step: int | None = kept("step?")     # the step of the last spike alerted

    def judge(self, ctx: Context, cfg: Config, st: State) -> None:
        b = ctx.batch
        if "train/loss" not in b.cols:
            return
        from ladder.predict.forecast import spike_scores
        x = b.cols["train/loss"]
        both, off, st.tail = trailing(st.tail, x, 2 * cfg.spike_window)
        with np.errstate(all="ignore"):
            sc = spike_scores(both, cfg.spike_window)
        z, med = sc.z[off:], sc.median[off:]
        spike = (np.isfinite(x) & np.isfinite(med) & (x > med * (1 + cfg.spike_rel))
                 & ((z > cfg.spike_k) | (np.isinf(z) & (z > 0))))
        idx = np.flatnonzero(spike)
        if not idx.size:
            return
        last = st.last_step
        for i in idx:
            s = int(b.step[i])
            if last is not None and 0 <= s - last <= cfg.spike_window:
                continue  # one alert per burst of spikes
            last = s
            ctx.emit(Alert(ctx.stamp, s, finite_or_none(ctx.tokens[i]),
                           finite_or_none(ctx.frac[i]), "spike", "warn", value=float(x[i]),
                           expected=float(med[i]), direction="worse",
                           message=f"train/loss {x[i]:.4f} is {x[i] / med[i] - 1:.1%} above its "
                                   f"trailing median {med[i]:.4f} ({z[i]:.1f} robust sd; limit "
                                   f"{cfg.spike_k:g})", extra={"z": finite_or_none(z[i])}))
        st.last_step = last


class GradNormRule(HealthRule):
    name = "grad_norm"
    kinds = ("grad_norm", "cleared")
    description = "grad norm against the ladder's and its growth since warmup"
    fixed_keys = ("grad/norm",)
    template = ("Grad norm (median of {c.grad_window} rows, after {c.grad_after:.0%} of the run) "
                "grown {c.grad_growth_warn}x since its post-warmup minimum, or {c.grad_ref_warn}x "
                "the ladder's, warns; {c.grad_ref_crit}x the ladder's is critical.")

    @dataclass(frozen=True)
    class Config(GradWindow, GradAfter, HealthPersistence):
        # growth since its post-warmup minimum: the real team added the logit z-loss when grad norm
        # grew past 4 (Marin hero-run tracking issue, shared/DESIGN.md section 1)
        grad_growth_warn: float = threshold(4.0, positive)
        grad_ref_warn: float = threshold(4.0, positive)     # x the ladder's at the same fraction
        grad_ref_crit: float = threshold(16.0, positive)

    @dataclass
    class State(SignalState):
        min: float | None = kept("num?")  # the trailing median's minimum since grad_after

    def judge(self, ctx: Context, cfg: Config, st: State) -> None:
        b, frac, view = ctx.batch, ctx.frac, ctx.view
        if "grad/norm" not in b.cols:
            return
        n = len(b)
        med = trailing_median(st, b.cols["grad/norm"], cfg.grad_window)
        after = np.isfinite(med) & (frac >= cfg.grad_after)
        run_min = np.fmin.accumulate(np.where(after, med, np.inf)) if n else np.zeros(0)
        if st.min is not None:
            run_min = np.minimum(run_min, st.min)
        if n and np.isfinite(run_min[-1]):
            st.min = float(run_min[-1])
        growth = np.where(after & np.isfinite(run_min), med / run_min, np.nan)
        sev = np.where(growth > cfg.grad_growth_warn, 1, 0)
        ref = view.reference("grad/norm", frac)
        ratio = None
        if ref is not None:
            ratio = med / ref
            sev = np.maximum(sev, np.where(after & (ratio > cfg.grad_ref_warn), 1, 0))
            sev = np.maximum(sev, np.where(after & (ratio > cfg.grad_ref_crit), 2, 0))
        sev = np.where(np.isfinite(med) & after, sev, -1)

        def describe(i, level):
            parts = [f"grad norm (median of {cfg.grad_window}) {med[i]:.3g}"]
            if math.isfinite(growth[i]):
                parts.append(f"{growth[i]:.1f}x its post-warmup minimum")
            if ratio is not None and math.isfinite(ratio[i]):
                parts.append(f"{ratio[i]:.1f}x the ladder's {ref[i]:.3g} at this fraction")
            return ", ".join(parts)
        signal(ctx, cfg, st.signal, "grad_norm", "grad/norm", sev, med, ref, describe)


class DropFracRule(HealthRule):
    name = "drop_frac"
    kinds = ("drop_frac", "cleared")
    description = "the token-drop fraction against the ladder's envelope at the same fraction"
    fixed_keys = ("moe/drop_frac",)
    State = SignalState
    template = ("Token-drop fraction (trailing median of {c.drop_window} rows) above the "
                "ladder's max at the same fraction widened as below for the router warns, "
                "above {c.drop_crit_factor}x that is critical (without a ladder reference: "
                "{c.drop_warn_abs} / {c.drop_crit_abs}); never below {c.drop_floor}.")

    @dataclass(frozen=True)
    class Config(DropWindow, EnvelopeWidth, HealthPersistence):
        drop_crit_factor: float = threshold(2.5, positive)  # x the warning limit
        # without a ladder reference: the real hero ~2% (8% plausible); at 65k context 7% -> 40%
        drop_warn_abs: float = threshold(0.08, positive)
        drop_crit_abs: float = threshold(0.40, positive)
        drop_floor: float = threshold(0.01, unit)         # never alert below it

    def judge(self, ctx: Context, cfg: Config, st: SignalState) -> None:
        b, frac = ctx.batch, ctx.frac
        if "moe/drop_frac" not in b.cols:
            return
        med = trailing_median(st, b.cols["moe/drop_frac"], cfg.drop_window)
        env = ctx.view.envelope("moe/drop_frac", frac)
        # no envelope (or none at this fraction): the absolute limits
        ref = env.hi if env is not None else np.full(len(b), np.nan)
        tol = env.tol_above if env is not None else 0.0
        warn_t = np.fmax(ref * math.exp(tol + cfg.envelope_margin), cfg.drop_floor)
        crit_t = np.where(np.isfinite(ref), cfg.drop_crit_factor * warn_t, cfg.drop_crit_abs)
        warn_t = np.where(np.isfinite(ref), warn_t, cfg.drop_warn_abs)
        sev = np.where(med > crit_t, 2, np.where(med > warn_t, 1, 0))
        sev = np.where(np.isfinite(med), sev, -1)

        def describe(i, level):
            against = (f"the ladder's max {ref[i]:.2%} at this fraction, widened"
                       if math.isfinite(ref[i]) else "the absolute limits (no ladder reference)")
            return (f"token-drop fraction (median of {cfg.drop_window}) {med[i]:.2%}: above "
                    f"{(crit_t if level == 2 else warn_t)[i]:.2%}, against {against}")
        signal(ctx, cfg, st.signal, "drop_frac", "moe/drop_frac", sev, med, ref, describe)


class _EnvelopeRule(HealthRule):
    """A router signal below (``side`` "below") or above its envelope: the ladder's range at the
    same fraction widened by the ladder's own tolerance plus ``envelope_margin``."""

    kinds = ("router", "cleared")
    State = SignalState
    signal_key: str
    side: str
    what: str      # the signal, in messages
    phrase: str    # how the words start
    template = ("{rule.phrase} the range of the ladder's rungs at the same fraction widened by "
                "the ladder's own leave-one-rung-out tolerance (within "
                "{c.envelope_tol}..{c.envelope_tol_max}; {c.envelope_tol} without one) plus "
                "{c.envelope_margin} (log units) warns.")

    @dataclass(frozen=True)
    class Config(DropWindow, EnvelopeWidth, HealthPersistence):
        pass

    def judge(self, ctx: Context, cfg: Config, st: SignalState) -> None:
        b, frac, key = ctx.batch, ctx.frac, self.signal_key
        if key not in b.cols:
            return
        env = ctx.view.envelope(key, frac)
        if env is None:
            return
        med = trailing_median(st, b.cols[key], cfg.drop_window)
        below = self.side == "below"
        tol = (env.tol_below if below else env.tol_above) + cfg.envelope_margin
        edge = env.lo if below else env.hi
        limit = edge * math.exp(-tol if below else tol)
        bad = med < limit if below else med > limit
        sev = np.where(np.isfinite(med) & np.isfinite(limit), np.where(bad, 1, 0), -1)

        def describe(i, lv):
            return (f"{self.what} {med[i]:.3g} (median of {cfg.drop_window}) {self.side} "
                    f"{limit[i]:.3g}: the ladder's range {env.lo[i]:.3g}..{env.hi[i]:.3g} at "
                    f"this fraction widened by x{math.exp(tol):.2f} (tolerance "
                    f"{'measured leave-one-rung-out' if env.calibrated else 'by default'} + "
                    f"margin)")
        signal(ctx, cfg, st.signal, "router", key, sev, med, edge, describe)


class RouterEntropyRule(_EnvelopeRule):
    name = "router_entropy"
    description = "router entropy below the ladder's envelope (a collapse)"
    signal_key = "moe/router_entropy"
    fixed_keys = (signal_key,)
    side = "below"
    what = "router entropy"
    phrase = "Router entropy below"


class ExpertLoadRule(_EnvelopeRule):
    name = "expert_load"
    description = "expert load max/mean above the ladder's envelope (a collapse onto few experts)"
    signal_key = "moe/load_max_over_mean"
    fixed_keys = (signal_key,)
    side = "above"
    what = "expert load max/mean"
    phrase = "Expert load max/mean above"


class RouterLogitRule(_EnvelopeRule):
    """Router logits growing beyond the ladder's: the router z-loss (mean logsumexp(logits)^2)
    above the ladder's widened envelope. Growing logits saturate the combine weights; on the cpu
    ladder the z-loss grows 4.8 -> 113 over a healthy run (issue 37), so no fixed limit is a
    rule: the rungs' own curve is."""

    name = "router_logits"
    description = "router logit growth (z-loss) above the ladder's envelope"
    signal_key = "moe/router_z_loss"
    fixed_keys = (signal_key,)
    side = "above"
    what = "router z-loss"
    phrase = "Router z-loss (logit growth) above"


class RouterBiasRule(HealthRule):
    """``router_bias`` judged on its own: set by a balancing rule, not by gradients, it spikes
    early by design; after ``router_bias_after`` a jump over its trailing median warns."""

    name = "router_bias"
    kinds = ("router", "cleared")
    description = ("the router-bias norm jumping over its trailing median (it is not "
                   "gradient-trained)")
    State = SignalState
    signal_key = "params/norm/router_bias"
    fixed_keys = (signal_key,)
    template = ("router_bias is judged on its own after {c.router_bias_after:.0%} of the run "
                "(> {c.router_bias_jump}x its trailing median).")

    @dataclass(frozen=True)
    class Config(GradWindow, SpikeWindow, HealthPersistence):
        router_bias_after: float = threshold(0.1, unit)     # it spikes early by design
        router_bias_jump: float = threshold(3.0, positive)  # x its trailing median

    def judge(self, ctx: Context, cfg: Config, st: SignalState) -> None:
        b, key = ctx.batch, self.signal_key
        if key not in b.cols:
            return
        both, off, st.tail = trailing(st.tail, b.cols[key], cfg.grad_window)
        med = rolling_median(both, cfg.grad_window, shift=False)[off:]
        prev = rolling_median(both, cfg.spike_window, shift=True)[off:]
        jump = np.abs(med) / np.abs(prev)
        sev = np.where(np.isfinite(jump) & (ctx.frac >= cfg.router_bias_after),
                       np.where(jump > cfg.router_bias_jump, 1, 0), -1)
        signal(ctx, cfg, st.signal, "router", key, sev, med, None,
               lambda i, lv: f"router_bias norm {med[i]:.3g} is {jump[i]:.1f}x its trailing "
                             f"median (judged on its own: not gradient-trained)")


class ParamNormRule(HealthRule):
    name = "param_norm"
    kinds = ("param_norm", "cleared")
    description = "parameter-norm growth per group against the ladder's"
    prefixes = ("params/norm/",)
    template = ("A parameter-norm group whose growth differs from the ladder's by more than "
                "{c.param_growth_ratio}x warns. Health conditions must hold for {c.k_health} "
                "rows and be gone for {c.k_health_clear} rows to clear.")

    @dataclass(frozen=True)
    class Config(GradWindow, GradAfter, HealthPersistence):
        param_growth_ratio: float = threshold(2.0, positive)  # vs the ladder's, either way

    @dataclass
    class State(RuleState):
        """Per parameter group: the hysteresis, the trailing values and the norm at ``grad_after``
        its growth is measured from."""

        signals: dict = kept(("map", Hysteresis), factory=dict)
        tails: dict = kept(("map", "nums"), factory=dict)
        base: dict = kept(("map", "num?"), factory=dict)

    def judge(self, ctx: Context, cfg: Config, st: State) -> None:
        b, frac = ctx.batch, ctx.frac
        for key in sorted(k for k in b.cols if k.startswith("params/norm/")):
            if key == RouterBiasRule.signal_key:
                continue
            both, off, st.tails[key] = trailing(st.tails.get(key, []), b.cols[key],
                                                cfg.grad_window)
            med = rolling_median(both, cfg.grad_window, shift=False)[off:]
            # the ladder's norm relative to its value at grad_after
            ref = ctx.view.reference(key, frac)
            base = st.base.get(key)
            if base is None:
                ok = np.flatnonzero(np.isfinite(med) & (frac >= cfg.grad_after))
                if ok.size:
                    base = st.base[key] = float(med[ok[0]])
            if ref is None or base is None or not base:
                continue
            h = st.signals.setdefault(key, Hysteresis())
            growth = med / base
            rel = growth / ref
            bad = (rel > cfg.param_growth_ratio) | (rel < 1 / cfg.param_growth_ratio)
            sev = np.where(np.isfinite(rel) & (frac >= cfg.grad_after), np.where(bad, 1, 0), -1)
            signal(ctx, cfg, h, "param_norm", key, sev, med, None,
                   lambda i, lv, key=key, growth=growth, ref=ref:
                   f"{key} grew {growth[i]:.2f}x since {cfg.grad_after:.0%} of the run; "
                   f"the ladder's grew {ref[i]:.2f}x by this fraction")
