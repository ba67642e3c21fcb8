"""``FitResult.report()``: the fit as text a person reads at a terminal."""

from __future__ import annotations

import math

from ladder.io import as_float


def _g(x, fmt="{:.4g}"):
    x = as_float(x)  # law.json writes non-finite numbers as "NaN" strings
    if x is None or not math.isfinite(x):
        return "n/a"
    return fmt.format(x)


def _pct(x):
    x = as_float(x)
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:+.2f}%"


def report(r) -> str:
    d = r.diagnostics
    lines = [f"law: {r.form}   {r.expression}" + (f"   (one fit per {r.by})" if r.by else ""),
             (f"metric: {r.metric}   points: {r.inputs.get('n_points')}   runs: "
             f"{r.inputs.get('n_runs')}")]
    if r.by:
        lines.append(f"{len(r.groups)} fits, one per {r.by}:")
        lines.append(f"  {r.by:>8}  " + "  ".join(f"{n:>10}" for n in r.spec.form.names))
        for v, g in r.groups:
            lines.append(f"  {v:8.3f}  " + "  ".join(f"{g.params[n]:10.4g}"
                                                       for n in r.spec.form.names))
    else:
        lvl = f"{r.level:.0%}"
        lines.append(f"parameters ({lvl} intervals):")
        for n, v in r.params.items():
            iv = r.intervals.get(n, [math.nan, math.nan])
            tag = " (fixed)" if n in r.spec.fix else (f" (= {r.spec.tie[n]})" if n in r.spec.tie
                                                      else "")
            flag = d.get("at_bound", {}).get(n)
            pr = (getattr(r, "prior", None) or {}).get(n)
            if pr:
                tag += f" (prior {pr[0]:g} +- {pr[1]:g})"
            lines.append(f"  {n:>6} = {v:<12.6g} [{_g(iv[0])}, {_g(iv[1])}]{tag}"
                         + (f"  WARNING: {flag}" if flag else ""))
        ident = (d.get("identifiability") or {}).get("flags") or {}
        for n, why in ident.items():
            lines.append(f"  NOT IDENTIFIED: {n}: {'; '.join(why)}")
        if (d.get("identifiability") or {}).get("unidentified"):
            lines.append("  (fix it with --fix NAME=VALUE or regularise it with --prior "
                         "NAME=MEAN:SD; extrapolations lean on it)")
        ss = d.get("starts_status", {})
        if getattr(r, "objective", "huber") == "ols":
            lines.append(f"solver: ols of log(L - E) on log C (statsmodels), residual sum of "
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
        if b.get("replicates"):
            lines.append(f"bootstrap: {b['valid']} of {b['replicates']} run-level replicates "
                         f"usable ({b.get('degenerate', 0)} degenerate, "
                         f"{b.get('not_converged', 0)} not converged)")
        else:
            lines.append("bootstrap: none (bands from the Student-t lack-of-fit interval only)")
    al = d.get("allocation")
    if al:
        iv = al.get("a_interval")
        lines.append(f"compute-optimal: N_opt ~ C^{al['a']:.4f}"
                     + (f" [{iv[0]:.4f}, {iv[1]:.4f}]" if iv else "")
                     + f", D_opt ~ C^{al['b']:.4f}  (C = {al['k']:g} N D)")
    bt = d.get("backtest")
    if bt:
        lines += _backtest_lines("backtest", bt)
    cmp_ = d.get("trajectory_vs_per_fraction")
    if cmp_:
        lines.append("trajectory vs per-fraction fits (same held-out rungs: "
                     f"{', '.join(cmp_.get('held_out', [])) or 'none'}):")
        for k, v in cmp_.items():
            if isinstance(v, dict) and k != "folds":
                lines.append(f"  {k:<28} rollout mean |err|: final {_pct(v.get('final'))}, "
                             f"whole curve {_pct(v.get('curve'))}")
        if cmp_.get("better"):
            lines.append(f"  better on held-out rungs: {cmp_['better']}")
    auto = d.get("auto")
    if auto:
        lines.append(f"form chosen by --form auto: {auto['chosen']} ({auto['why']})")
        for c in auto["candidates"]:
            if "error" in c:
                lines.append(f"  {c['form']:<26} not fitted: {c['error']}")
            else:
                lines.append(f"  {c['form']:<26} rollout mean |err| "
                             f"{_pct(c.get('rollout_mean_abs_final'))}, leave-largest-out "
                             f"{_pct(c.get('leave_largest_out_abs_final'))}, objective "
                             f"{_g(c.get('objective'))}")
    rule = d.get("asymptote_rule")
    if rule and rule.get("applied"):
        lines.append(f"asymptote rule (short ladder, {rule['sizes']} sizes, E not "
                     f"identified): chose {rule.get('chosen')}: {rule.get('why')}")
    for line in d.get("dropped_rows", [])[:20]:
        lines.append(f"dropped: {line}")
    if len(d.get("dropped_rows", [])) > 20:
        lines.append(f"dropped: ... and {len(d['dropped_rows']) - 20} more rows")
    return "\n".join(lines)


def _backtest_lines(title, bt) -> list[str]:
    out = []
    folds = bt.get("folds", [])
    if not folds:
        why = "; ".join(s["reason"] for s in bt.get("skipped", [])) or "one scale level only"
        return [f"{title}: not possible ({why})"]
    out.append(f"{title} (fit on smaller runs, predict the next scale level):")
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
