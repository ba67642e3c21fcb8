"""The health rules, vectorised over a batch: non-finite values (rule 3a), train-loss spikes,
grad norm, token-drop fraction, router entropy and expert load against the ladder's envelope,
the router-bias norm and per-group parameter norms.
"""

from __future__ import annotations

import math

import numpy as np

from predict.watch.alerts import Alert, _level_signal, _opt
from predict.watch.batch import Batch
from predict.watch.config import WatchConfig
from predict.watch.view import PreregView


def _nan_rule(view, b: Batch, frac, tokens, st, emit, stamp):
    keys = list(dict.fromkeys((view.metric,) + tuple(view.config.nan_keys)))
    for k in keys:
        nf = b.nonfinite.get(k)
        if nf is None or not nf.any() or k in st["nan_reported"]:
            continue
        i = int(np.flatnonzero(nf)[0])
        st["nan_reported"].append(k)
        emit(Alert(stamp, int(b.step[i]), _opt(tokens[i]), _opt(frac[i]), "nan", "critical",
                   value=None, message=f"{k} is not finite at step {int(b.step[i])}",
                   extra={"key": k}))


def _trailing(st, key: str, x: np.ndarray, window: int) -> np.ndarray:
    """x with the previous batch's last ``window`` finite values prepended (state carries them)."""
    tail = np.array(st["tails"].get(key, []), dtype=float)
    both = np.concatenate([tail, x])
    fin = both[np.isfinite(both)]
    st["tails"][key] = fin[-window:].tolist()
    return both, tail.size


def _trailing_median(st, key: str, x: np.ndarray, window: int) -> np.ndarray:
    """The trailing median of ``window`` finite values of ``key`` at each row of ``x``, the
    previous batches' last values (kept in the state) included."""
    both, off = _trailing(st, key, x, window)
    return _rolling_median(both, window, shift=False)[off:]


def _rolling_median(x: np.ndarray, window: int, *, shift: bool) -> np.ndarray:
    """Trailing median over the finite values (NaN rows skipped); ``shift`` excludes the row."""
    from predict.watch.rolling import rolling_median  # pandas' rolling median, faster
    x = np.asarray(x, dtype=float)
    ok = ~np.isnan(x)
    med = rolling_median(x[ok], window, max(1, window // 4))
    if shift:
        med = np.concatenate([[np.nan], med[:-1]])
    out = np.full(x.size, np.nan)
    out[ok] = med
    return out


def _spike_rule(view: PreregView, b: Batch, frac, tokens, st, emit, stamp):
    """Train-loss spikes: train loss vs trailing median + k x robust sd of the rows before it."""
    cfg = view.config
    if "train/loss" not in b.cols:
        return
    from predict.forecast import spike_scores
    x = b.cols["train/loss"]
    both, off = _trailing(st, "train/loss", x, 2 * cfg.spike_window)
    with np.errstate(all="ignore"):
        sc = spike_scores(both, cfg.spike_window)
    z, med = sc.z[off:], sc.median[off:]
    spike = (np.isfinite(x) & np.isfinite(med) & (x > med * (1 + cfg.spike_rel))
             & ((z > cfg.spike_k) | (np.isinf(z) & (z > 0))))
    _spikes(spike, x, med, z, b, frac, tokens, st, emit, stamp, cfg)


def _grad_rule(view: PreregView, b: Batch, frac, tokens, st, emit, stamp):
    """Grad norm: level vs the ladder's, growth since its post-warmup minimum."""
    cfg = view.config
    if "grad/norm" not in b.cols:
        return
    n = len(b)
    x = b.cols["grad/norm"]
    med = _trailing_median(st, "grad/norm", x, cfg.grad_window)
    after = np.isfinite(med) & (frac >= cfg.grad_after)
    gmin = st.get("grad_min")
    run_min = np.fmin.accumulate(np.where(after, med, np.inf)) if n else np.zeros(0)
    if gmin is not None:
        run_min = np.minimum(run_min, gmin)
    if n and np.isfinite(run_min[-1]):
        st["grad_min"] = float(run_min[-1])
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
    _level_signal("grad_norm", "grad/norm", sev, med, ref, b, frac, tokens, st, emit, stamp, cfg,
                  describe)


def _drop_rule(view: PreregView, b: Batch, frac, tokens, st, emit, stamp):
    """Token-drop fraction vs the ladder's widened envelope at the same fraction."""
    cfg = view.config
    if "moe/drop_frac" not in b.cols:
        return
    n = len(b)
    x = b.cols["moe/drop_frac"]
    med = _trailing_median(st, "moe/drop_frac", x, cfg.drop_window)
    env = view.envelope("moe/drop_frac", frac)
    ref = None
    if env is not None:
        ref = env.hi
        warn_t = np.fmax(env.hi * math.exp(env.tol_above + cfg.envelope_margin), cfg.drop_floor)
        crit_t = cfg.drop_crit_factor * warn_t
        warn_t = np.where(np.isfinite(ref), warn_t, cfg.drop_warn_abs)
        crit_t = np.where(np.isfinite(ref), crit_t, cfg.drop_crit_abs)
    else:
        warn_t = np.full(n, cfg.drop_warn_abs)
        crit_t = np.full(n, cfg.drop_crit_abs)
    sev = np.where(med > crit_t, 2, np.where(med > warn_t, 1, 0))
    sev = np.where(np.isfinite(med), sev, -1)

    def describe(i, level):
        against = (f"the ladder's max {ref[i]:.2%} at this fraction, widened" if ref is
                   not None and math.isfinite(ref[i])
                   else "the absolute limits (no ladder reference)")
        return (f"token-drop fraction (median of {cfg.drop_window}) {med[i]:.2%}: above "
                f"{(crit_t if level == 2 else warn_t)[i]:.2%}, against {against}")
    _level_signal("drop_frac", "moe/drop_frac", sev, med, ref, b, frac, tokens, st, emit, stamp,
                  cfg, describe)


def _envelope_signal(view: PreregView, b: Batch, frac, tokens, st, emit, stamp, key: str,
                     side: str, name: str):
    """A router signal below (``side`` "below") or above its envelope: the ladder's range at the
    same fraction widened by the ladder's own tolerance plus ``envelope_margin``."""
    cfg = view.config
    if key not in b.cols:
        return
    env = view.envelope(key, frac)
    if env is None:
        return
    x = b.cols[key]
    med = _trailing_median(st, key, x, cfg.drop_window)
    if side == "below":
        tol = env.tol_below + cfg.envelope_margin
        limit = env.lo * math.exp(-tol)
        bad = med < limit
    else:
        tol = env.tol_above + cfg.envelope_margin
        limit = env.hi * math.exp(tol)
        bad = med > limit
    sev = np.where(np.isfinite(med) & np.isfinite(limit), np.where(bad, 1, 0), -1)
    edge = env.lo if side == "below" else env.hi

    def describe(i, lv):
        return (f"{name} {med[i]:.3g} (median of {cfg.drop_window}) {side} {limit[i]:.3g}: the "
                f"ladder's range {env.lo[i]:.3g}..{env.hi[i]:.3g} at this fraction widened by "
                f"x{math.exp(tol):.2f} (tolerance "
                f"{'measured leave-one-rung-out' if env.calibrated else 'by default'} + margin)")
    _level_signal("router", key, sev, med, edge, b, frac, tokens, st, emit, stamp, cfg, describe)


def _entropy_rule(view: PreregView, b: Batch, frac, tokens, st, emit, stamp):
    """Router entropy below the ladder's widened envelope (a collapse: entropy -> 0)."""
    _envelope_signal(view, b, frac, tokens, st, emit, stamp, "moe/router_entropy", "below",
                     "router entropy")


def _load_rule(view: PreregView, b: Batch, frac, tokens, st, emit, stamp):
    """Expert load max/mean above the ladder's widened envelope (a collapse: -> n_experts/top_k)."""
    _envelope_signal(view, b, frac, tokens, st, emit, stamp, "moe/load_max_over_mean", "above",
                     "expert load max/mean")


def _router_bias_rule(view: PreregView, b: Batch, frac, tokens, st, emit, stamp):
    """``router_bias`` judged on its own: set by a balancing rule, not by gradients, it spikes
    early by design; after ``router_bias_after`` a jump over its trailing median warns."""
    cfg = view.config
    key = "params/norm/router_bias"
    if key not in b.cols:
        return
    both, off = _trailing(st, key, b.cols[key], cfg.grad_window)
    med = _rolling_median(both, cfg.grad_window, shift=False)[off:]
    prev = _rolling_median(both, cfg.spike_window, shift=True)[off:]
    jump = np.abs(med) / np.abs(prev)
    sev = np.where(np.isfinite(jump) & (frac >= cfg.router_bias_after),
                   np.where(jump > cfg.router_bias_jump, 1, 0), -1)
    _level_signal("router", key, sev, med, None, b, frac, tokens, st, emit, stamp, cfg,
                  lambda i, lv: f"router_bias norm {med[i]:.3g} is {jump[i]:.1f}x its trailing "
                                f"median (judged on its own: not gradient-trained)")


def _param_norm_rule(view: PreregView, b: Batch, frac, tokens, st, emit, stamp):
    """Parameter norms per group (``router_bias`` aside) against the ladder's growth."""
    cfg = view.config
    for key in sorted(k for k in b.cols if k.startswith("params/norm/")):
        if key == "params/norm/router_bias":
            continue
        x = b.cols[key]
        med = _trailing_median(st, key, x, cfg.grad_window)
        ref = view.reference(key, frac)  # the ladder's norm relative to its value at grad_after
        base_key = f"param_base/{key}"
        base = st.get(base_key)
        if base is None:
            ok = np.flatnonzero(np.isfinite(med) & (frac >= cfg.grad_after))
            if ok.size:
                base = float(med[ok[0]])
                st[base_key] = base
        if ref is None or base is None or not base:
            continue
        growth = med / base
        rel = growth / ref
        bad = (rel > cfg.param_growth_ratio) | (rel < 1 / cfg.param_growth_ratio)
        sev = np.where(np.isfinite(rel) & (frac >= cfg.grad_after), np.where(bad, 1, 0), -1)
        _level_signal("param_norm", key, sev, med, None, b, frac, tokens, st, emit, stamp, cfg,
                      lambda i, lv, key=key, growth=growth, ref=ref:
                      f"{key} grew {growth[i]:.2f}x since {cfg.grad_after:.0%} of the run; "
                      f"the ladder's grew {ref[i]:.2f}x by this fraction")


def _spikes(spike, x, med, z, b, frac, tokens, st, emit, stamp, cfg):
    idx = np.flatnonzero(spike)
    if not idx.size:
        return
    last = st.get("last_spike_step")
    for i in idx:
        s = int(b.step[i])
        if last is not None and 0 <= s - last <= cfg.spike_window:
            continue  # one alert per burst of spikes
        last = s
        emit(Alert(stamp, s, _opt(tokens[i]), _opt(frac[i]), "spike", "warn", value=float(x[i]),
                   expected=float(med[i]), direction="worse",
                   message=f"train/loss {x[i]:.4f} is {x[i] / med[i] - 1:.1%} above its trailing "
                           f"median {med[i]:.4f} ({z[i]:.1f} robust sd; limit {cfg.spike_k:g})",
                   extra={"z": _opt(z[i])}))
    st["last_spike_step"] = last


def _words_drop(c: WatchConfig, level: float) -> str:
    return (f"Token-drop fraction (trailing median of {c.drop_window} rows) above the ladder's "
            f"max at the same fraction widened as below for the router warns, above "
            f"{c.drop_crit_factor}x that is critical (without a ladder reference: "
            f"{c.drop_warn_abs} / {c.drop_crit_abs}); never below {c.drop_floor}.")


def _words_nan(c: WatchConfig, level: float) -> str:
    return f"A non-finite {', '.join(c.nan_keys)} or metric is critical at once."


def _words_grad(c: WatchConfig, level: float) -> str:
    return (f"Grad norm (median of {c.grad_window} rows, after {c.grad_after:.0%} of the run) "
            f"grown {c.grad_growth_warn}x since its post-warmup minimum, or {c.grad_ref_warn}x "
            f"the ladder's, warns; {c.grad_ref_crit}x the ladder's is critical.")


def _words_spike(c: WatchConfig, level: float) -> str:
    return (f"Train loss above its trailing median of {c.spike_window} rows by more than "
            f"{c.spike_k:g}x the robust sd (1.4826 x MAD; k = {c.spike_k_margin}x the largest "
            f"such z-score of the ladder's healthy runs, at least the default) and more than "
            f"{c.spike_rel:.0%} is a spike.")


def _words_envelope(what: str):
    def words(c: WatchConfig, level: float) -> str:
        return (f"{what} the range of the ladder's rungs at the same fraction widened by the "
                f"ladder's own leave-one-rung-out tolerance (within "
                f"{c.envelope_tol}..{c.envelope_tol_max}; {c.envelope_tol} without one) plus "
                f"{c.envelope_margin} (log units) warns.")
    return words


def _words_router_bias(c: WatchConfig, level: float) -> str:
    return (f"router_bias is judged on its own after {c.router_bias_after:.0%} of the run "
            f"(> {c.router_bias_jump}x its trailing median).")


def _words_param_norm(c: WatchConfig, level: float) -> str:
    return (f"A parameter-norm group whose growth differs from the ladder's by more than "
            f"{c.param_growth_ratio}x warns. Health conditions must hold for {c.k_health} rows "
            f"and be gone for {c.k_health_clear} rows to clear.")
