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

from fit.forms import Spec, get_form
from ladder.io import InputError


def candidates(df, fix: dict, tie: dict, params_column: str) -> list[tuple[str, Spec]]:
    have = {c for c in df.columns if df[c].notna().all()}
    out = []

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


def fit_auto(df, fix, tie, opts):
    from fit.law import fit_one
    cands = candidates(df, fix, tie, opts["params_column"])
    if not cands:
        raise InputError("no law form fits these columns (need compute, or params and tokens)",
                         field="form")
    rows, fitted = [], {}
    for label, spec in cands:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r = fit_one(df, spec, **dict(opts, bootstrap=0))
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
        why = "lowest rollout error at held-out final points"
    else:
        win = min((r for r in rows if "error" not in r), key=lambda r: r["n_free"])["form"]
        why = "no candidate could be backtested (too few runs); simplest form chosen"
    spec, r = fitted[win]
    if opts["bootstrap"] > 0:  # refit the winner with its bootstrap; its backtest is reused
        bt = r.diagnostics.get("backtest")
        r = fit_one(df, spec, **dict(opts, backtest=False))
        if bt is not None:
            r.diagnostics["backtest"] = bt
    r.diagnostics["auto"] = {"chosen": win, "why": why, "candidates": rows}
    return r
