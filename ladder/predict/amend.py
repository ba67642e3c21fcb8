"""An amended forecast after a change of plan at step S (issue 27): a new data mixture (with the
compute multiplier M `ladder compare` measured for it), a new sequence length, or a new schedule.

``ladder preregister --amend OLD.json --reason ... --at-step S --source RUN ...`` writes a
pre-registration (schema prereg/2, with a ``change`` section) whose forecast is the old one's
rows before S, carried unchanged (:func:`check_carried` lets the watcher verify that), and from
S on the *evidence* for the new plan, anchored on the run's own evals up to S.

The evidence is the law along the run as it now will be: the ``transition`` of
:data:`TRANSITIONS` (the words each registers), :data:`DEFAULT` measured best; a new schedule
(``--law`` and ``--target`` of the new plan) is the new plan's law at each fraction. The
anchor: the mean log ratio of the run's last ``ANCHOR_EVALS`` evals at or before S to the
evidence there, so the amended curve passes through the run where it is.

The band (the law's part and the change's, registered apart and combined):
:func:`ladder.predict.band.amended_band`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ladder.io import EX_DATAERR, EX_USAGE, InputError, as_float, read_json

ANCHOR_EVALS = 3        # the last evals at or before S that place the anchor (a compromise:
#                         one eval carries its full noise; many reach back to where the run's
#                         ratio to the law was another)


# the default: on the cpu ladder's data switch (bench/mixture_switch.py, docs/LOG.md) the eval
# loss followed the new data much faster than its compute; relax came closest at 30% (where it
# was added) and at 50% (a run it was not chosen on): mean error after the switch 1.5% and 1.3%
# against 2.5% and 2.9%
DEFAULT = "relax"
DEFAULT_WIDTH = 0.05    # relax's width, a fraction of the run (fixed before either switch run)
TRANSITIONS = {  # compute: effective_inputs; recipe and relax: _evidence
    "compute": ("effective compute: after S each unit of compute counts M x k (M the recipe's "
                "multiplier, k the tokens-per-step ratio of a new sequence length), so the "
                "forecast leaves the old one at S without a jump"),
    "recipe": "the new recipe's law from step 0, shifted to the anchor",
    "relax": ("the old plan's curve relaxing to the new recipe's (its law from step 0): the log "
              "gap left at f is exp(-(f - f_S) / {width:g}) of the gap, shifted to the anchor"),
}


@dataclass(frozen=True)
class Multiplier:
    """A compute multiplier of the new recipe over the old, with its interval at ``level``."""

    value: float
    lo: float
    hi: float
    level: float | None     # None: the interval's level is the band's
    source: str

    def __post_init__(self):
        for name in ("value", "lo", "hi"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InputError(f"{name} must be a positive finite number, got {v!r}",
                                 field="--multiplier", exit_code=EX_USAGE)
        if not self.lo <= self.value <= self.hi:
            raise InputError(f"expected LO <= M <= HI, got {self.value}:{self.lo}:{self.hi}",
                             field="--multiplier", exit_code=EX_USAGE)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def parse_multiplier(text: str) -> Multiplier:
    """``M`` or ``M:LO:HI`` (``--multiplier``)."""
    parts = str(text).split(":")
    if len(parts) not in (1, 3):
        raise InputError(f"expected M or M:LO:HI, got {text!r}", field="--multiplier",
                         exit_code=EX_USAGE)
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        raise InputError(f"expected numbers (M or M:LO:HI), got {text!r}",
                         field="--multiplier", exit_code=EX_USAGE) from None
    m = vals[0]
    lo, hi = (vals[1], vals[2]) if len(vals) == 3 else (m, m)
    return Multiplier(m, lo, hi, None, f"--multiplier {text}")


def multiplier_from_compare(path: str, metric: str | None) -> Multiplier:
    """The multiplier of a `ladder compare --json` file (``{metric: {multiplier, lo, hi, level,
    ...}}``) for ``metric`` (the pre-registration's; the file's only metric when it has one)."""
    doc = read_json(path, field="--compare")
    if isinstance(doc, Mapping) and doc.get("schema") == "compare/1":
        # the compare.json of `ladder compare --out`: the same objects under "metrics"
        doc = doc.get("metrics")
    if not isinstance(doc, Mapping) or not doc:
        raise InputError("expected the object `ladder compare --json` prints", path=path,
                         field="--compare")
    keys = [k for k, v in doc.items() if isinstance(v, Mapping) and "multiplier" in v]
    if not keys:
        raise InputError("no metric with a 'multiplier' in it", path=path, field="--compare")
    if metric in keys:
        key = metric
    elif len(keys) == 1:
        key = keys[0]
    else:
        raise InputError(f"holds {', '.join(keys)}; none is the forecast's metric {metric!r}",
                         path=path, field="--compare")
    c = doc[key]
    vals = {k: as_float(c.get(k)) for k in ("multiplier", "lo", "hi", "level")}
    m = vals["multiplier"]
    if m is None or not math.isfinite(m) or m <= 0:
        raise InputError(f"not a positive finite multiplier: {c.get('multiplier')!r}",
                         path=path, field=f"{key}.multiplier", exit_code=EX_DATAERR)
    lo, hi = vals["lo"], vals["hi"]
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0:
        raise InputError("the comparison has no band (lo/hi missing or not finite); give "
                         "--multiplier M:LO:HI with an interval you can defend",
                         path=path, field=f"{key}.lo", exit_code=EX_DATAERR)
    # `ladder compare` widens its interval to hold the estimate (ladder.fit.compare._interval):
    # one that excludes it was not written by it
    for name, bad in (("lo", lo > m), ("hi", hi < m)):
        if bad:
            raise InputError(f"the interval [{lo:g}, {hi:g}] excludes its own multiplier "
                             f"{m:g}", path=path, field=f"{key}.{name}", exit_code=EX_DATAERR)
    level = vals["level"]
    if c.get("level") is not None and (level is None or not 0 < level < 1):
        raise InputError(f"expected a level in (0, 1), got {str(c.get('level'))[:40]!r}",
                         path=path, field=f"{key}.level", exit_code=EX_DATAERR)
    return Multiplier(m, lo, hi, level,
                      f"ladder compare {path} [{key}] at compute {c.get('at')}")


@dataclass(frozen=True)
class Plan:
    """What changes at step ``at_step`` (one or more of: recipe multiplier, seq_len, law)."""

    at_step: int
    multiplier: Multiplier | None = None
    data_tag: str | None = None
    seq_len: int | None = None


def read_evals(source: str, metric: str, *, upto: int | None = None) -> tuple[np.ndarray,
                                                                            np.ndarray]:
    """(steps, values) of ``metric`` in a run (any `ladder watch` source), rows with a finite
    value only, the last value of a step kept (a resumed run re-logs steps), sorted by step."""
    from ladder.sources import open_source
    src = open_source(source)
    found: dict[int, float] = {}
    while True:
        p = src.poll()
        for r in p.rows:
            s, v = as_float(r.get("step")), as_float(r.get(metric))
            if s is None or v is None or not math.isfinite(v) or not math.isfinite(s):
                continue
            if upto is None or s <= upto:
                found[int(s)] = v
        if not p.more:
            break
    steps = np.array(sorted(found), dtype=np.int64)
    return steps, np.array([found[int(s)] for s in steps], dtype=float)


def effective_inputs(target, fraction: np.ndarray, f_s: float, scale: float) -> dict:
    """Law inputs along the run when each unit of compute after ``f_s`` counts ``scale`` times
    (the multiplier times the tokens-per-step ratio): compute and tokens so far are
    C x (min(f, f_s) + scale x max(f - f_s, 0)); the schedule position stays f."""
    g = np.asarray(fraction, float)
    eff = np.minimum(g, f_s) + scale * np.maximum(g - f_s, 0.0)
    out = target.at(g)
    out["compute"] = eff * target.compute
    out["tokens"] = eff * target.tokens
    return out


def amended_forecast(old: Mapping, law, target, plan: Plan, evals: tuple[np.ndarray, np.ndarray],
                     *, level: float, eval_noise: float, every: float = 0.01,
                     transition: str = DEFAULT, width: float = DEFAULT_WIDTH) -> dict:
    """The ``forecast`` rows, ``final`` and ``change`` section of an amendment at step S.

    ``old``: the amended pre-registration; ``law``/``target``: the law and the run as planned
    from now on (the old ones unless the schedule changed); ``evals``: the run's (steps, values)
    at or before S; ``transition`` and its ``width``: the module docstring."""
    from ladder.predict.band import amended_band, registered_half_widths
    from ladder.predict.forecast import grid_fractions
    S = plan.at_step
    steps_new = int(target.steps)
    _check_plan(S, steps_new, transition, width)
    e_steps, e_vals = evals
    keep = (e_steps >= 1) & (e_steps <= S)
    e_steps, e_vals = e_steps[keep], e_vals[keep]
    if not e_steps.size:
        raise InputError(f"the run has no eval of {old.get('metric')!r} at or before step {S}: "
                         f"nothing to anchor the amended forecast on", field="--source",
                         exit_code=EX_DATAERR)
    if np.any(e_vals <= 0):
        raise InputError("the metric must be positive to anchor in log units", field="--source",
                         exit_code=EX_DATAERR)
    f_s = S / steps_new
    m = plan.multiplier or Multiplier(1.0, 1.0, 1.0, None, "none (no recipe change)")
    k = 1.0 if plan.seq_len is None else plan.seq_len / int(old["target"]["seq_len"])
    evidence = _evidence(law, target, f_s=f_s, k=k, level=level, transition=transition,
                         width=width)
    # the anchor: the run's last evals at or before S against the evidence there
    a_steps, a_vals = e_steps[-ANCHOR_EVALS:], e_vals[-ANCHOR_EVALS:]
    a_loss, _, _ = evidence(a_steps / steps_new, m.value)
    ratios = np.log(a_vals / a_loss)
    offset = float(np.mean(ratios))
    # grid after S: every 1% of the run, the eval steps, the end
    g = grid_fractions(target, every=every)
    g = np.unique(np.concatenate([[f_s], g[g > f_s + 1e-12]]))
    c_loss = evidence(g, m.value)[0]   # its band: the old forecast's (below)
    lo_m, _, _ = evidence(g, m.hi)     # more compute-equivalent: lower loss
    hi_m, _, _ = evidence(g, m.lo)
    centre = c_loss * math.exp(offset)
    from ladder.predict.prereg_view import forecast_band
    registered = forecast_band(old)
    old_steps = int(old["target"]["steps"])
    up_f, down_f = registered_half_widths(registered, g * steps_new / old_steps)
    up_s, down_s = registered_half_widths(registered, np.array([f_s]) * steps_new / old_steps)
    band = amended_band(up_f, down_f, up_s[0], down_s[0], level=level, eval_noise=eval_noise,
                        anchor_values=a_vals, evidence=c_loss, evidence_lo=lo_m,
                        evidence_hi=hi_m, multiplier_level=m.level)
    tok_eff = np.minimum(g, f_s) + k * np.maximum(g - f_s, 0.0)
    rows = _rows(old, S, steps_new, g, tok_eff * target.tokens, centre, band)
    final = {"loss": rows[-1]["loss"], "lo": rows[-1]["lo"], "hi": rows[-1]["hi"]}
    change = {
        "at_step": S, "fraction": f_s, "transition": transition,
        "transition_words": TRANSITIONS[transition].format(width=width),
        "transition_width": width if transition == "relax" else None,
        "multiplier": m.to_dict(), "seq_len_ratio": k,
        "data_tag": {"before": (old.get("applicability") or {}).get("data_tag"),
                     "after": plan.data_tag},
        "seq_len": {"before": int(old["target"]["seq_len"]),
                    "after": plan.seq_len or int(old["target"]["seq_len"])},
        "anchor": {"steps": a_steps.tolist(), "values": a_vals.tolist(),
                   "log_ratio": offset, "log_ratios": ratios.tolist(),
                   "sd_log": band.anchor_sd},
        "final_band_share_of_change": band.final_share_of_change,
        "carried_rows": sum(1 for r in rows if r.get("carried")),
        "amends_sha256": old.get("sha256"),
    }
    return {"forecast": rows, "final": final, "change": change}


def _evidence(law, target, *, f_s: float, k: float, level: float, transition: str,
              width: float):
    """``evidence(fractions, multiplier) -> (loss, lo, hi)`` under ``transition``."""
    from ladder.predict.band import law_band

    def recipe(frac, mult):  # the new recipe from step 0 (a seq_len change after S only)
        frac = np.asarray(frac, float)
        inp = effective_inputs(target, frac, 0.0, mult)
        tok = np.minimum(frac, f_s) + k * np.maximum(frac - f_s, 0.0)
        inp["compute"] = inp["compute"] * tok / np.maximum(frac, 1e-300)
        inp["tokens"] = inp["tokens"] * tok / np.maximum(frac, 1e-300)
        return law_band(law, inp, level)

    def evidence(frac, mult):
        if transition == "compute":
            return law_band(law, effective_inputs(target, frac, f_s, mult * k), level)
        if transition == "recipe":
            return recipe(frac, mult)
        frac = np.asarray(frac, float)
        old_plan = law_band(law, effective_inputs(target, frac, f_s, k), level)[0]
        new = recipe(frac, mult)[0]
        w = np.exp(-np.maximum(frac - f_s, 0.0) / width)
        loss = np.exp(np.log(new) + w * (np.log(old_plan) - np.log(new)))
        return loss, loss, loss   # the law's band is taken from the old forecast (below)
    return evidence


def _check_plan(S: int, steps: int, transition: str, width) -> None:
    if not 1 <= S < steps:
        raise InputError(f"must be a step inside the run, 1..{steps - 1}, got {S}",
                         field="--at-step", exit_code=EX_USAGE)
    if transition not in TRANSITIONS:
        raise InputError(f"one of {', '.join(TRANSITIONS)}, got {transition!r}",
                         field="--transition", exit_code=EX_USAGE)
    if not (isinstance(width, (int, float)) and math.isfinite(width) and 0 < width <= 1):
        raise InputError(f"must be in (0, 1] (a fraction of the run), got {width!r}",
                         field="--transition-width", exit_code=EX_USAGE)


def _rows(old: Mapping, S: int, steps_new: int, g: np.ndarray, tokens: np.ndarray,
          centre: np.ndarray, band) -> list[dict]:
    """The old forecast's rows before S (carried unchanged but for the fraction, which is the
    new plan's), then the amended rows from S at fractions ``g`` with their band's parts."""
    rows = [{**r, "fraction": float(st) / steps_new, "carried": True}
            for st, r in _before(old, S)]
    lo, hi = band.bounds(centre)
    for i, f in enumerate(g):
        rows.append({"fraction": float(f), "step": int(round(f * steps_new)),
                     "tokens": float(tokens[i]),
                     "loss": float(centre[i]), "lo": float(lo[i]), "hi": float(hi[i]),
                     "lo_law": float(centre[i] * math.exp(-band.law_down[i])),
                     "hi_law": float(centre[i] * math.exp(band.law_up[i])),
                     "lo_change": float(centre[i] * math.exp(-band.change_down[i])),
                     "hi_change": float(centre[i] * math.exp(band.change_up[i]))})
    return rows


def _before(old: Mapping, S: int) -> list[tuple[float, dict]]:
    """(step, row) of the old forecast's rows before step S (a row without a step: its fraction
    of the old plan's steps)."""
    old_steps = int(old["target"]["steps"])
    out = []
    for r in old["forecast"]:
        st = as_float(r.get("step"))
        st = st if st is not None else as_float(r.get("fraction")) * old_steps
        if st < S:
            out.append((st, r))
    return out


def check_carried(old: Mapping, new: Mapping) -> None:
    """The watcher's check that an amendment at step S carries the old forecast's rows before S
    unchanged (but for the fraction, which is the new plan's): InputError naming the first that
    differs."""
    ch = new.get("change") or {}
    S = ch.get("at_step")
    if not isinstance(S, int):
        raise InputError("change.at_step is not an integer", field="change.at_step")
    before = [r for _, r in _before(old, S)]
    carried = [r for r in new["forecast"] if r.get("carried")]
    if len(carried) != len(before):
        raise InputError(f"carries {len(carried)} rows of the forecast it amends before step "
                         f"{S}, which has {len(before)} there", field="forecast")
    for a, b in zip(before, carried, strict=True):
        for key in ("loss", "lo", "hi"):
            x, y = as_float(a.get(key)), as_float(b.get(key))
            if not (x == y or (x is not None and y is not None and math.isnan(x)
                               and math.isnan(y))):
                raise InputError(f"the carried row at step {b.get('step')} differs from the "
                                 f"forecast it amends ({key} {y} vs {x})", field="forecast")
