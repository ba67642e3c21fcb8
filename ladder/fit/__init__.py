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

Forms (fit.forms): ``compute`` E + A C^-alpha; ``chinchilla`` E + A/N^alpha + B/D^beta;
``trajectory`` E + A C_T^-alpha h(g), a run's whole curve (C_T = compute so far / fraction, h
non-increasing in the fraction g, h(1) = 1); ``moe``; the curve laws (fit.curve_forms);
``auto`` (the default) picks by rollout backtest (fit.law). The real ladder's method:
``fit_law(df, form="compute", fix={"E": 1.5}, by="fraction", objective="ols")``.

Fitting: fit.estimate (summed Huber on log residuals, the batched L-BFGS of fit.solver); the
band: fit.result; backtests: fit.backtest; allocation: fit.allocation; IsoFLOP: fit.isoflop;
downstream accuracy: fit.task (``fit.law.fit_task``); two recipes' compute-equivalent
multiplier: fit.compare (``fit.law.compare_points``). Every law is a ``fit.LawResult``.
"""

# The package's names, each imported from its module when first asked for (PEP 562): importing
# ladder.fit.forms (the command line's list of forms) then costs numpy, not pandas and scipy.
_WHERE = {"Allocation": "allocation", "allocation": "allocation", "FitResult": "law",
          "LawResult": "law", "Prediction": "law", "fit_law": "law", "load_law": "law",
          "load_laws": "law", "load_points": "points", "Law": "prediction",
          "TaskLaw": "task_law", "fit_task": "law", "compare_points": "law",
          "FitConfig": "config"}
__all__ = sorted(_WHERE)


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module 'ladder.fit' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f"ladder.fit.{_WHERE[name]}"), name)
