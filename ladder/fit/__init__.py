"""Scaling-law fitting: points table -> law with calibrated uncertainty -> law.json.

No JAX here (a user fitting a CSV on a laptop must not pay for JAX start-up); ladder.io,
ladder.specs and ladder.counting are plain Python.

    from ladder.fit import load_points, fit_law, load_law
    df = load_points(["runs/"], metric="eval_dropless/loss")   # or CSV / Parquet tables
    res = fit_law(df, form="trajectory", bootstrap=200)         # -> FitResult
    res.predict(compute=2.6e24 * 0.5, fraction=0.5)             # Prediction(loss, lo, hi, level)
    print(res.report()); law = res.to_json()                    # schema "law/3"
    load_law("law.json", metric="paloma/c4_en/loss")            # one law of a multi-metric file
    load_laws("law.json")                                       # {metric key: law}, every one

Forms (``ladder.fit.forms``): ``compute`` E + A C^-alpha; ``chinchilla`` E + A/N^alpha + B/D^beta;
``trajectory`` E + A C_T^-alpha h(g), one joint law of a run's whole curve, with C_T the planned
total compute (= compute so far / fraction; inputs stay in the points-table convention, compute
so far) and h a positive factor, non-increasing in the fraction g by construction, h(1) = 1;
``moe`` E + A Na^-alpha (N/Na)^-gamma + B/D^beta; ``auto`` (the default) picks by rollout
backtest among every form the columns allow (the tied-exponent Chinchilla form included; the
curve laws for a table of curves). The real ladder's method is ``fit_law(df, form="compute",
fix={"E": 1.5}, by="fraction", objective="ols")`` (least squares of log(L - E) on log C).
``prior={"E": (1.5, 0.2)}`` regularises a parameter; parameters the ladder does not pin down are
flagged (``diagnostics["identifiability"]``), and on a short ladder the default chooses among
free, prior and fixed-E variants (``ladder.fit.law.asymptote_rule``); where the rollout backtest
says so, runs far below the ladder's top are down-weighted (``fit.law.scale_weight_rule``).

Solver (``fit.solver``, ``fit.law``): summed Huber(1e-3) on log residuals, every start of a grid
(Chinchilla: the paper's 4,500) run by a batched numpy L-BFGS with per-start convergence
status, the best distinct candidates polished to 1e-15 relative decrease.
Uncertainty: run-level Bayesian bootstrap (weighting runs); bands combine it with run-to-run
noise (the residual quantile) and the law's extrapolation error outside its runs (see
``fit.result``). Every law, curve laws included, is a ``fit.LawResult`` (``fit.result``: one
``predict``/``band``/``report``/``to_json`` and law.json envelope; the ``fit.Law`` protocol of
``ladder.fit.prediction``). Backtests:
rollout and leave-the-largest-out (``ladder.fit.backtest``). Allocation and IsoFLOP Approach 2:
``fit.allocation``. Schedule-aware curve laws (mpl, momentum): ``fit.curve_forms`` (fitted
by ``fit.curve_fit``, the law ``fit.curve_law``). Downstream accuracy in two steps (task loss
by any form, then a sigmoid to accuracy; ``--form task --via LOSS_KEY``): ``ladder.fit.task``
(``fit.law.fit_task``). Two recipes' compute-equivalent multiplier: ``fit.law.compare_points``
(``fit.compare``).
"""

# The package's names, each imported from its module when first asked for (PEP 562): importing
# ladder.fit.forms (the command line's list of forms) then costs numpy, not pandas and scipy.
_WHERE = {"Allocation": "allocation", "IsoFlopResult": "allocation", "allocation": "allocation",
          "isoflop_approach2": "allocation", "FitResult": "law", "LawResult": "law",
          "Prediction": "law", "fit_law": "law", "load_law": "law", "load_laws": "law",
          "load_points": "points", "Law": "prediction", "TaskLaw": "task_law",
          "fit_task": "law", "compare_points": "law", "FitConfig": "config"}
__all__ = sorted(_WHERE)


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module 'ladder.fit' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f"ladder.fit.{_WHERE[name]}"), name)
