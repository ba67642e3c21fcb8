"""``--form auto``: fit every candidate form the table's columns allow, choose by rollout.

Candidates: ``compute`` (needs compute), ``chinchilla`` and ``chinchilla`` with tied exponents
alpha = beta (the form Gadre et al. 2024 fit: with alpha = beta, E + A/N^a + B/D^a is their
E + (a M^eta + b M^-eta) C^-eta) (need params and tokens), ``moe`` (needs active params that
differ from total params), and ``trajectory`` (needs runs with several progress fractions).
The winner has the lowest rollout error at the held-out runs' final points (fit on the smaller
runs, predict the larger); candidates that cannot be backtested (too few runs) are listed but not
chosen unless nothing could be backtested, in which case the simplest fitting form wins.
"""

from __future__ import annotations

import warnings

import numpy as np

from fit.backtest import fit_one, scale_levels
from fit.curves import curve_data_from_table, fit_curve_law
from fit.forms import CURVES_FORMS, Spec, get_form
from ladder.io import InputError


# The compute form says the loss is a function of compute alone, which holds along a ladder at a
# fixed tokens-per-parameter ratio (the real ladder: 791 x active params) but not across runs
# over-trained by different multiples (Gadre et al.'s M = 20..640): there the compute form was
# +6.6% off at the 6.9B run and still won the rollout by noise (2.38% against 2.44%). With
# params and tokens given, runs whose tokens/params spread more than this factor exclude it.
MAX_TOKENS_PER_PARAM_SPREAD = 2.0


def candidates(df, fix: dict, tie: dict, params_column: str,
               excluded: dict | None = None) -> list[tuple[str, Spec]]:
    have = {c for c in df.columns if df[c].notna().all()}
    out = []
    excluded = {} if excluded is None else excluded

    def add(label, form, tie_extra=None):
        t = dict(tie)
        t.update(tie_extra or {})
        f = get_form(form)
        fx = {k: v for k, v in fix.items() if k in f.names}
        tt = {k: v for k, v in t.items() if k in f.names and v in f.names}
        try:
            out.append((label, Spec(f, fix=fx, tie=tt)))
        except ValueError:
            pass

    if "compute" in have:
        spread = None
        if {params_column, "tokens"} <= have:
            last = df.loc[df.groupby("run")["fraction"].idxmax()] if "fraction" in have else df
            m = (last["tokens"] / last[params_column]).to_numpy(dtype=float)
            spread = float(m.max() / m.min()) if m.size else None
        if spread is not None and spread > MAX_TOKENS_PER_PARAM_SPREAD:
            excluded["compute"] = (f"runs differ {spread:.0f}x in tokens per parameter: the loss "
                                   "is not a function of compute alone")
        else:
            add("compute", "compute")
    if {params_column, "tokens"} <= have:
        add("chinchilla", "chinchilla")
        add("chinchilla (alpha=beta)", "chinchilla", {"alpha": "beta"})
    if {"params", "active_params", "tokens"} <= have and \
            not np.allclose(df["params"], df["active_params"]):
        add("moe", "moe")
    if {"compute", "fraction"} <= have and df.groupby("run")["fraction"].nunique().max() > 2:
        add("trajectory", "trajectory")
    return out


def _curve_table(df) -> bool:
    """Whole curves with their LR schedule (step, lr) and several runs: the schedule-aware
    curve laws apply."""
    if not {"step", "lr", "loss"} <= set(df.columns):
        return False
    return bool(df["step"].notna().all() and df["lr"].notna().any()
                and df["run"].nunique() >= 2)


def fit_auto_curves(df, opts, fix):
    """``--form auto`` on a table of curves without scale columns: the multi-power law (Luo et
    al. 2025) and the momentum law (Tissue et al. 2024), chosen by leave-one-run-out (fit on
    the other schedules, predict the held-out run's whole curve; mean relative error)."""
    data = curve_data_from_table(df, size_column="active_params")
    rows, best = [], None
    for form in ("mpl", "momentum"):
        errs = []
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for i, name in enumerate(data.names):
                    train = df[df["run"].astype(str) != name]
                    law = fit_curve_law(train, form, bootstrap=0, fix=fix or None)
                    pred = law.predict(lr=data.lr[i], at_steps=data.steps[i])
                    errs.append(float(np.mean(np.abs(pred.loss / data.loss[i] - 1.0))))
        except InputError as e:
            rows.append({"form": form, "error": str(e)})
            continue
        err = float(np.mean(errs))
        rows.append({"form": form, "leave_one_run_out_mean_abs_curve": err,
                     "per_run": dict(zip(data.names, errs, strict=True))})
        if best is None or err < best[1]:
            best = (form, err)
    if best is None:
        raise InputError("no curve law could be fitted: " + "; ".join(r["error"] for r in rows),
                         field="form")
    law = fit_curve_law(df, best[0], bootstrap=opts["bootstrap"], level=opts["level"],
                        seed=opts["seed"], metric=opts["metric"], fix=fix or None)
    law.diagnostics["auto"] = {
        "chosen": best[0], "candidates": rows,
        "why": f"lowest leave-one-run-out error over held-out curves ({100 * best[1]:.3f}%; "
               + ", ".join(f"{r['form']} {100 * r['leave_one_run_out_mean_abs_curve']:.3f}%"
                           for r in rows if "error" not in r)
               + "); curve laws are the candidates because the table has step and lr but no "
                 "compute, nor params and tokens"}
    return law


def fit_auto(df, fix, tie, opts):
    excluded: dict = {}
    cands = candidates(df, fix, tie, opts["params_column"], excluded)
    if not cands and _curve_table(df):
        return fit_auto_curves(df, opts, fix)
    if not cands:
        raise InputError("no law form fits these columns (need compute, or params and tokens, "
                         "or curves with step and lr)", field="form")
    rows = [{"form": k, "error": f"not considered: {v}"} for k, v in excluded.items()]
    fitted = {}
    for label, spec in cands:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r = fit_one(df, spec, **dict(opts, bootstrap=0, prior={
                    k: v for k, v in (opts.get("prior") or {}).items() if k in spec.form.names}))
        except InputError as e:
            rows.append({"form": label, "error": str(e)})
            continue
        bt = r.diagnostics.get("backtest", {})
        rows.append({"form": label, "objective": r.diagnostics["objective"],
                     "n_free": spec.n_free,
                     "rollout_mean_abs_final": bt.get("rollout_mean_abs_final"),
                     "leave_largest_out_abs_final": (bt.get("leave_largest_out") or {})
                     .get("mean_abs_final")})
        fitted[label] = (spec, r)
    if not fitted:
        raise InputError("no candidate form could be fitted: "
                         + "; ".join(r["error"] for r in rows), field="form")
    scored = [r for r in rows if r.get("rollout_mean_abs_final") is not None]
    if scored:
        win = min(scored, key=lambda r: r["rollout_mean_abs_final"])["form"]
        why = ("lowest rollout error at held-out final points: "
               + ", ".join(f"{r['form']} {100 * r['rollout_mean_abs_final']:.2f}%"
                           for r in sorted(scored, key=lambda r: r["rollout_mean_abs_final"])))
        unscored = [r["form"] for r in rows if r not in scored and "error" not in r]
        if unscored:
            why += f"; not backtestable (too few smaller runs): {', '.join(unscored)}"
    else:
        win = min((r for r in rows if "error" not in r), key=lambda r: r["n_free"])["form"]
        why = "no candidate could be backtested (too few runs); simplest form chosen"
    spec, r = fitted[win]
    if opts["bootstrap"] > 0:  # refit the winner with its bootstrap; its backtest is reused
        bt = r.diagnostics.get("backtest")
        r = fit_one(df, spec, **dict(opts, backtest=False, prior={
            k: v for k, v in (opts.get("prior") or {}).items() if k in spec.form.names}))
        if bt is not None:
            r.diagnostics["backtest"] = bt
    r.diagnostics["auto"] = {"chosen": win, "why": why, "candidates": rows}
    return r


# ----------------------------------------------------------------------------- asymptote rule
# A short ladder (<= 5 scale levels: the real ladder has 4 rungs) often cannot tell the
# asymptote E from the slope; a free fit then puts E wherever the noise says (0.87 on the real
# 4-rung MoE ladder, the lower bound on the cpu ladder), and extrapolating it is the forecast's
# largest error. When the fit flags E as not identified (fit.law._identifiability), the default
# fits two more variants, E with a weakly informative prior and E fixed at that prior's mean,
# chooses the one with the lowest rollout backtest error, and widens the band to the spread of
# every defensible variant (rollout error within DEFENSIBLE_RATIO x the best, or DEFENSIBLE_ABS
# of it): their bootstrap draws are pooled, so the band covers the choice between them.
# The prior: E ~ N(0.7, 0.1) x the smallest loss of the ladder: published LM ladders put E at
# 55-90% of the losses they fit (see fit.law: Hoffmann et al. 2022, Besiroglu et al. 2024,
# Marin's fixed 1.5 against 2.4-3.0), so +-2 sd covers 0.5-0.9 of the smallest loss.
SHORT_LADDER_LEVELS = 5
E_PRIOR_FRACTION = (0.7, 0.1)
DEFENSIBLE_RATIO = 3.0
DEFENSIBLE_ABS = 0.002


def _score(r) -> float | None:
    bt = r.diagnostics.get("backtest") or {}
    if r.form in CURVES_FORMS and bt.get("rollout_mean_abs_curve") is not None:
        return float(bt["rollout_mean_abs_curve"])
    v = bt.get("rollout_mean_abs_final")
    return None if v is None else float(v)


def asymptote_rule(df, result, opts: dict, fix: dict, tie: dict, prior: dict):
    """``result`` or, when a short ladder leaves E unidentified, the best of its free, prior and
    fixed-E variants by rollout backtest, with the pooled draws of the defensible ones; the
    decision is recorded in ``diagnostics["asymptote_rule"]``."""
    import numpy as np

    form = result.spec.form
    if "E" not in form.names or "E" in fix or "E" in (prior or {}) or result.by:
        return result
    # a ladder's length is its number of model sizes (runs within 0.05 decades are one size);
    # without a size column, its scale levels (planned compute)
    if "params" in df.columns and df["params"].notna().all():
        size = df.groupby("run")["params"].max().astype(float)
        n_levels = int(np.unique(np.round(np.log10(size) * 20)).size)
    else:
        n_levels = int(scale_levels(df).nunique())
    unident = (result.diagnostics.get("identifiability") or {}).get("unidentified") or []
    record = {"short_ladder": n_levels <= SHORT_LADDER_LEVELS, "sizes": n_levels,
              "E_unidentified": "E" in unident}
    if n_levels > SHORT_LADDER_LEVELS or "E" not in unident:
        record["applied"] = False
        result.diagnostics["asymptote_rule"] = record
        return result
    lmin = float(df["loss"].min())
    mean, sd = E_PRIOR_FRACTION[0] * lmin, E_PRIOR_FRACTION[1] * lmin
    o = dict(opts, prior=None)
    variants = {"free": result}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for label, kw in ((f"prior E~N({mean:.3g}, {sd:.3g})",
                           {"spec": result.spec, "prior": dict(prior or {}, E=(mean, sd))}),
                          (f"fixed E={mean:.3g}",
                           {"spec": Spec(form, fix=dict(result.spec.fix, E=mean),
                                         tie=dict(result.spec.tie)), "prior": prior})):
            try:
                variants[label] = fit_one(df, kw["spec"], **dict(o, prior=kw["prior"]))
            except InputError as e:
                record.setdefault("not_fitted", {})[label] = str(e)
    scores = {k: _score(v) for k, v in variants.items()}
    scored = {k: v for k, v in scores.items() if v is not None}
    record.update(applied=True, prior={"mean": mean, "sd": sd}, rollout_error=scores)
    if not scored:
        record["chosen"] = "free"
        record["why"] = "no variant could be backtested; E stays free (and flagged)"
        result.diagnostics["asymptote_rule"] = record
        return result
    best = min(scored, key=scored.get)
    limit = max(DEFENSIBLE_RATIO * scored[best], scored[best] + DEFENSIBLE_ABS)
    defensible = [k for k, v in scored.items() if v <= limit]
    # the centre is the variant with the lowest rollout error, not the prior variant whenever
    # it is defensible (docs/LOG.md, 2026-12-01: "the asymptote variants' centre").
    chosen = variants[best]
    draws = [variants[k].boot_u for k in defensible if variants[k].boot_u is not None]
    if len(draws) > 1:
        chosen.boot_u = np.vstack(draws)
    record.update(chosen=best, defensible=defensible,
                  why="rollout errors " + ", ".join(f"{k} {100 * v:.2f}%" for k, v in
                                                     scored.items())
                      + f"; defensible (within {DEFENSIBLE_RATIO:g}x of the best): "
                      + ", ".join(defensible) + f"; centre: {best} (lowest); the band pools "
                      "the draws of the defensible variants")
    chosen.diagnostics["asymptote_rule"] = record
    if "auto" in result.diagnostics:
        chosen.diagnostics.setdefault("auto", result.diagnostics["auto"])
    return chosen
