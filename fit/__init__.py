"""Scaling-law fitting: points table -> law with calibrated uncertainty -> law.json.

No JAX here (a user fitting a CSV on a laptop must not pay for JAX start-up); ladder.io,
ladder.specs and ladder.counting are plain Python.

    from fit import load_points, fit_law, load_law
    df = load_points(["runs/"], metric="eval_dropless/loss")
    res = fit_law(df, form="trajectory", bootstrap=200)
    res.predict(compute=2.6e24, fraction=1.0)   # Prediction(loss, lo, hi, level)
"""

from fit.allocation import Allocation, IsoFlopResult, allocation, isoflop_approach2
from fit.law import FitResult, Prediction, fit_law
from fit.lawjson import load_law
from fit.points import load_points

__all__ = ["load_points", "fit_law", "load_law", "FitResult", "Prediction", "allocation",
           "Allocation", "isoflop_approach2", "IsoFlopResult"]
