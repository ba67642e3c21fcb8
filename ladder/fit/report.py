"""``report()`` of every fitted law as text, one layout for every kind (lmfit's ``fit_report``:
the model and its data, the parameters, what the fit did); a kind's own lines:
``r._report_lines()`` (``fit_lines``: the Chinchilla family's).
"""

from __future__ import annotations

import math

from ladder.io import InputError, as_float


def _g(x, fmt="{:.4g}"):
    x = as_float(x)  # law.json writes non-finite numbers as "NaN" strings
    if x is None or not math.isfinite(x):
        return "n/a"
    return fmt.format(x)


def _pct(x, sign: str = "+"):
    return _g(x, f"{{:{sign}.2%}}")


def report(r) -> str:
    return "\n".join(head_lines(r) + r._report_lines())


def head_lines(r) -> list[str]:
    """The law, its data, and the target rung the fit left out."""
    return [f"law: {r.form}   {r.expression}" + (f"   (one fit per {r.by})" if r.by else ""),
            (f"metric: {r.metric or '-'}   points: {r.inputs.get('n_points')}   runs: "
             f"{r.inputs.get('n_runs')}")] + [
        f"left out: {x} (the ladder's target; --include-target to fit it)"
        for x in r.inputs.get("left_out") or []]


def parameter_lines(r, warnings: dict[str, str], hint: str) -> list[str]:
    """The parameters at their intervals, tagged with what the fit imposed (:func:`_imposed`),
    with ``warnings``, the identifiability flags, and ``hint`` (how to pin one down) when one is
    unidentified."""
    width = max([6] + [len(n) for n in r.params])
    lines = [f"parameters ({r.level:.0%} intervals):"]
    for n, v in r.params.items():
        iv = r.intervals.get(n, [math.nan, math.nan])
        flag = warnings.get(n)
        tags = "".join(f" ({x})" for x in _imposed(r, n) + _unused(r, n))
        lines.append(f"  {n:>{width}} = {v:<12.6g} [{_g(iv[0])}, {_g(iv[1])}]{tags}"
                     + (f"  WARNING: {flag}" if flag else ""))
    ident = r.identifiability
    for n, why in (ident.get("flags") or {}).items():
        lines.append(f"  NOT IDENTIFIED: {n}: {'; '.join(why)}")
    if ident.get("unidentified"):
        lines.append(f"  ({hint}; extrapolations lean on it)")
    return lines


def parameter_rows(r) -> list[dict]:
    """The parameter table of any law: ``name``, ``estimate``, ``lo``, ``hi``, ``identified``,
    ``note`` (fixed, tied, a prior, at a bound, why not identified)."""
    ident = r.identifiability
    flags = ident.get("flags") or {}
    unidentified = set(ident.get("unidentified") or []) | set(flags)
    at_bound = (r.diagnostics or {}).get("at_bound") or {}
    rows = []
    for n, v in r.params.items():
        iv = r.intervals.get(n) or [math.nan, math.nan]
        imposed = _imposed(r, n)
        notes = imposed + ([str(at_bound[n])] if at_bound.get(n) else [])
        # a flag that repeats the bound note adds nothing: the interval's reason is kept
        notes += [f for f in flags.get(n) or [] if not f.startswith("estimate ")] + _unused(r, n)
        lo, hi = (as_float(x) for x in iv)
        rows.append({"name": n, "estimate": float(v),
                     "lo": math.nan if lo is None else lo, "hi": math.nan if hi is None else hi,
                     "identified": imposed[:1] == ["fixed"] or n not in unidentified,
                     "note": "; ".join(notes)})
    return rows


# a shape factor below this is switched off (exp(u) reaches 1e-17 where the data want none)
UNUSED = 1e-8


def _imposed(r, n: str) -> list[str]:
    """What the fit imposed on parameter ``n``: fixed, tied (``= B``), a prior."""
    spec = getattr(r, "spec", None)
    fixed = spec.fix if spec is not None else (getattr(r, "fixed", None) or {})
    tie = spec.tie if spec is not None else {}
    out = ["fixed"] if n in fixed else ([f"= {tie[n]}"] if n in tie else [])
    pr = (getattr(r, "prior", None) or {}).get(n)
    return out + ([f"prior {pr[0]:g} +- {pr[1]:g}"] if pr else [])


def _unused(r, n: str) -> list[str]:
    """["~0: this factor is unused"] for a Chinchilla-family shape factor below UNUSED."""
    spec = getattr(r, "spec", None)
    try:
        param = spec.form.param(n) if spec is not None else None
    except KeyError:
        return []
    return ["~0: this factor is unused"] if param is not None and param.kind == "positive" \
        and abs(r.params[n]) < UNUSED else []


def short_lines(r) -> list[str]:
    """A law in a dozen lines (a notebook's repr, the demo's summary)."""
    rows = parameter_rows(r)
    width = max([6] + [len(x["name"]) for x in rows])
    head = head_lines(r)[:2]
    if len(head[0]) > 100:  # a curve form's whole expression: report() has it
        head[0] = head[0][:96] + " ..."
    lines = head + [f"parameters ({r.level:.0%} intervals):"]
    for x in rows:
        flag = "" if x["identified"] else "  NOT IDENTIFIED"
        note = x["note"] if len(x["note"]) <= 60 else x["note"].split("; ")[0]
        lines.append(f"  {x['name']:>{width}} = {x['estimate']:<11.5g} "
                     f"[{_g(x['lo'])}, {_g(x['hi'])}]{flag}" + (f"  ({note})" if note else ""))
    d = r.diagnostics or {}
    fit = []
    if d.get("rmse_log") is not None:
        fit.append(f"rmse(log) {_g(d.get('rmse_log'))}")
    if d.get("max_abs_rel_residual") is not None:
        fit.append(f"max |rel residual| {_pct(d.get('max_abs_rel_residual'))}")
    if "converged" in d:
        fit.append("converged" if d.get("converged") else "NOT CONVERGED")
    if fit:
        lines.append("fit: " + ", ".join(fit))
    bt = d.get("backtest") or {}
    if bt.get("rollout_mean_abs_final") is not None:
        llo = (bt.get("leave_largest_out") or {}).get("mean_abs_final")
        lines.append(f"backtest: rollout mean |err| {_pct(bt.get('rollout_mean_abs_final'))}"
                     f", leave-largest-out {_pct(llo)}")
    lines.append(f"band: {r.band_method}")
    return lines


def bootstrap_line(b: dict, how: str = "") -> str:
    """The run-level bootstrap's record (diagnostics.bootstrap), any kind."""
    return (f"bootstrap: {b['valid']} of {b['replicates']} run-level replicates usable "
            f"({b.get('degenerate', 0)} degenerate, {b.get('not_converged', 0)} not converged)"
            + (f"; {how}" if how else ""))


def auto_lines(auto) -> list[str]:
    """How ``--form auto`` chose (diagnostics.auto), any kind."""
    if not auto:
        return []
    lines = [f"form chosen by --form auto: {auto['chosen']} ({auto['why']})"]
    for c in auto.get("candidates") or []:
        if "error" in c:
            lines.append(f"  {c['form']:<26} not fitted: {c['error']}")
        else:
            lines.append(f"  {c['form']:<26} rollout mean |err| "
                         f"{_pct(c.get('rollout_mean_abs_final'))}, leave-largest-out "
                         f"{_pct(c.get('leave_largest_out_abs_final'))}, objective "
                         f"{_g(c.get('objective'))}")
    return lines


def fit_lines(r) -> list[str]:
    """A Chinchilla-family law's own report lines."""
    d = r.diagnostics
    lines = []
    if r.by:
        lines.append(f"{len(r.groups)} fits, one per {r.by}:")
        lines.append(f"  {r.by:>8}  " + "  ".join(f"{n:>10}" for n in r.spec.form.names))
        for v, g in r.groups:
            lines.append(f"  {v:8.3f}  " + "  ".join(f"{g.params[n]:10.4g}"
                                                       for n in r.spec.form.names))
    else:
        lines += parameter_lines(r, d.get("at_bound", {}),
                                 "fix it with --fix NAME=VALUE or regularise it with --prior "
                                 "NAME=MEAN:SD")
        ss = d.get("starts_status", {})
        if r.objective == "ols":
            lines.append(f"solver: ols of log(L - E) on log C (least squares), residual sum of "
                         f"squares {_g(d.get('objective'), '{:.10g}')}; Student-t with "
                         f"{_g(d.get('dof'))} dof")
        else:
            lines.append(f"solver: summed Huber(delta={d.get('huber_delta')}) on log loss = "
                         f"{_g(d.get('objective'), '{:.10g}')}; {d.get('starts')} starts "
                         f"({', '.join(f'{v} {k}' for k, v in ss.items() if v)}); best "
                         f"converged: {d.get('converged')}")
        lines.append(f"fit: rmse(log) {_g(d.get('rmse_log'))}, max |rel residual| "
                     f"{_pct(d.get('max_abs_rel_residual'))}, residual dof {_g(d.get('dof'))}; "
                     f"{d.get('points_note')}")
        b = d.get("bootstrap", {})
        lines.append(bootstrap_line(b) if b.get("replicates") else
                     "bootstrap: none (bands from the Student-t lack-of-fit interval only)")
    al = d.get("allocation")
    a = as_float(al.get("a")) if al else None
    if al and (a is None or not math.isfinite(a)):
        lines.append(f"compute-optimal: not defined ({al.get('not_defined') or 'a is missing'})")
    elif al:
        iv = al.get("a_interval")
        lines.append(f"compute-optimal: N_opt ~ C^{_g(al['a'], '{:.4f}')}"
                     + (f" [{_g(iv[0], '{:.4f}')}, {_g(iv[1], '{:.4f}')}]" if iv else "")
                     + f", D_opt ~ C^{_g(al.get('b'), '{:.4f}')}  (C = {_g(al.get('k'))} N D)"
                     + (f"; G not defined: {al['not_defined']}" if al.get("not_defined")
                        else ""))
    if d.get("backtest"):
        lines += _backtest_lines(d["backtest"])
    cmp_ = d.get("trajectory_vs_per_fraction")
    if cmp_ and not cmp_.get("held_out") and not cmp_.get("better"):
        lines.append("trajectory vs per-fraction fits: not compared (no rung held out)")
    elif cmp_:
        lines.append("trajectory vs per-fraction fits (same held-out rungs: "
                     f"{', '.join(cmp_.get('held_out', [])) or 'none'}):")
        for k, v in cmp_.items():
            if isinstance(v, dict) and k != "folds":
                lines.append(f"  {k:<28} rollout mean |err|: final {_pct(v.get('final'))}, "
                             f"whole curve {_pct(v.get('curve'))}")
        if cmp_.get("better"):
            lines.append(f"  better on held-out rungs: {cmp_['better']}")
    lines += auto_lines(d.get("auto"))
    sw = d.get("scale_weighting")
    if sw and sw.get("applied"):
        lines.append(f"scale weighting (runs weighted by decades below the largest run's "
                     f"{sw.get('scale')}): {sw.get('chosen')}: {sw.get('why')}")
    w = d.get("scale_weights")
    if w:
        lines.append(f"  weights exp(-d^2 / 2 h^2), h = {_g(w.get('bandwidth_decades'))} "
                     f"decades: {_g(w.get('effective_runs'), '{:.1f}')} effective runs, "
                     f"{w.get('near_runs')} at weight {_g(w.get('near_weight'))} or more (the "
                     f"band's noise part), smallest {_g(w.get('smallest_weight'), '{:.2g}')}")
    rule = d.get("asymptote_rule")
    if rule and rule.get("applied"):
        lines.append(f"asymptote rule (short ladder, {rule['sizes']} sizes, E not "
                     f"identified): chose {rule.get('chosen')}: {rule.get('why')}")
    layer = d.get("forecast_layer")
    if layer:
        lines.append(f"estimates: {layer.get('estimates')}")
        if layer.get("estimator_params"):
            lines.append("  the form's own estimator: " + ", ".join(
                f"{k} {_g(v)}" for k, v in layer["estimator_params"].items()))
        bp = d.get("band_prior") or {}
        if layer.get("band") and bp:
            lines.append(f"band (forecast layer): noise log sd and extrapolation rate pooled "
                         f"with their cross-ladder values {_g(bp.get('noise_log_sd'))} and "
                         f"{_g(bp.get('rate'))}/decade, worth {_g(bp.get('weight'))} "
                         f"observations ({bp.get('source', '')})")
    dropped = d.get("dropped_rows", [])
    lines += [f"dropped: {line}" for line in dropped[:20]]
    if len(dropped) > 20:
        lines.append(f"dropped: ... and {len(dropped) - 20} more rows")
    return lines


def _backtest_lines(bt) -> list[str]:
    folds = bt.get("folds", [])
    if not folds:
        why = "; ".join(s["reason"] for s in bt.get("skipped", [])) or "one scale level only"
        return [f"backtest: not possible ({why})"]
    out = ["backtest (fit on smaller runs, predict the next scale level):"]
    for f in folds:
        errs = ", ".join(_pct(e) for e in f["final_rel_err"][:6])
        more = " ..." if len(f["final_rel_err"]) > 6 else ""
        curve = f.get("curve_mean_abs_rel_err")
        out.append(f"  fit on {f['train_runs']:>3} runs -> {len(f['held_out'])} held out: "
                   f"final err {errs}{more}" + (f"; curve mean |err| {_pct(curve)}"
                                                if curve is not None else ""))
    llo = bt.get("leave_largest_out", {})
    out.append(f"  rollout mean |err| (final): {_pct(bt.get('rollout_mean_abs_final'))}; "
               f"leave-largest-out: {_pct(llo.get('mean_abs_final'))}"
               + (f"; band coverage (t-interval bands of the refits) "
                  f"{bt['band_coverage_final']:.0%}"
                  if bt.get("band_coverage_final") is not None else ""))
    return out


# ----------------------------------------------------------------------------- several metrics

EXPONENTS = ("alpha", "beta", "gamma")  # the forms' exponents (ladder.fit.forms), in this order


def metric_summary(metric: str, law, df) -> dict:
    """One metric's line of a multi-metric fit: form, exponents, backtest errors and the band's
    relative half-width at the largest run's last point of ``df`` (None where it cannot say)."""
    d = law.diagnostics or {}
    bt = d.get("backtest") or {}
    row = {"metric": metric, "form": law.form,
           "exponents": {n: law.params[n] for n in EXPONENTS if n in (law.params or {})},
           "rollout_mean_abs_final": as_float(bt.get("rollout_mean_abs_final")),
           "leave_largest_out_abs_final": as_float(
               (bt.get("leave_largest_out") or {}).get("mean_abs_final")),
           "band_half_width_rel": None, "band_at": None}
    if getattr(law, "spec", None) is None or not len(df):
        return row  # a curve law predicts along a schedule (ladder.fit.curve_law)
    size = next((c for c in ("compute", "tokens", "params") if df[c].notna().any()), None)
    if size is None:
        return row
    last = df.loc[df[size].idxmax()]
    inputs = {}
    for k in ("params", "active_params", "tokens", "compute", "fraction"):
        v = float(last[k]) if k in df.columns else math.nan   # numpy numbers, or NaN
        if math.isfinite(v):
            inputs[k] = v
    try:
        p = law.predict(**inputs, level=law.level)
        loss, lo, hi = (float(x) for x in (p.loss, p.lo, p.hi))
    except (InputError, ValueError, TypeError, ArithmeticError):
        return row  # the law needs an input the table does not give: no band to show
    if all(math.isfinite(v) for v in (loss, lo, hi)) and loss > 0:
        row["band_half_width_rel"] = (hi - lo) / 2 / loss
    row["band_at"] = {"run": str(last["run"]), **inputs}
    return row


def summary_lines(rows: list[dict], level: float) -> list[str]:
    """The one-line-per-metric table of a multi-metric fit (``refused`` rows: not fitted)."""
    w = max([6] + [len(r["metric"]) for r in rows])
    fitted = sum("refused" not in r for r in rows)
    out = [f"{fitted} of {len(rows)} metrics fitted, one law each "
           f"(band: +- half-width at the largest run's last point, {level:.0%}):",
           f"  {'metric':<{w}}  {'form':<20} {'exponents':<26} {'rollout |err|':>13} "
           f"{'leave-largest-out':>17} {'band +-':>8}"]
    for r in rows:
        if "refused" in r:
            out.append(f"  {r['metric']:<{w}}  refused: {r['refused']}")
            continue
        ex = " ".join(f"{n} {_g(v, '{:.3g}')}" for n, v in r["exponents"].items()) or "-"
        out.append(f"  {r['metric']:<{w}}  {r['form']:<20} {ex:<26} "
                   f"{_pct(r['rollout_mean_abs_final'], ''):>13} "
                   f"{_pct(r['leave_largest_out_abs_final'], ''):>17} "
                   f"{_pct(r['band_half_width_rel'], ''):>8}")
    return out
