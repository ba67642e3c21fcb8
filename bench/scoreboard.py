"""The scoreboard that decides the fit's defaults (issue 35): every public ladder, one protocol.

Each ladder of ../shared/anchors is fitted on the fit set of PROTOCOL (written once, below,
before any result was looked at) and forecasts its targets; per ladder the table gives the mean
and max |error| at the targets (predicted / actual - 1), the coverage of the 90% band, its mean
half-width (relative to the actual), and the interval score of Gneiting and Raftery (2007, eq.
43) at alpha = 0.1, relative to the actual so that ladders of different losses compare:

    IS = [(hi - lo) + (2 / alpha) (lo - y)+ + (2 / alpha) (y - hi)+] / y

beside the authors' own figure where they published one; then one aggregate: the mean over
ladders of the mean relative interval score (every ladder weighs the same, whatever its number of
targets), the mean over ladders of the mean |error|, and the pooled coverage over every target.

A variant (VARIANTS) is a way of fitting: the defaults, the defaults of 35366f1 (the code before
issue 35, through ``--old-tree``), or a candidate default. Anything a variant learns from data (a
prior's centre, a width) is learned leave-one-ladder-out: the ladder being scored never informs
its own variant. Per-ladder results are cached (keyed by the variant, the ladder, and the source
of ladder/fit/), so a second run only fits what changed.

    python bench/scoreboard.py [--variant NAME ...] [--ladders SUBSTRING ...] \
        [--baseline-json LABEL=PATH] [--out docs/scoreboard.md] [--json OUT.json]

35366f1's code (its packages were the top-level fit/ and predict/):

    git archive 35366f1 fit predict model ladder | tar -x -C /tmp/old35
    SCOREBOARD_OLD_TREE=/tmp/old35 python bench/scoreboard.py --variant defaults --json old.json

SCOREBOARD_OLD_TREE: an import shim maps ``ladder.fit`` and ``ladder.predict`` onto that tree's
``fit`` and ``predict`` (this file and bench/accuracy.py stay this checkout's); its --json
output goes beside the current code's with ``--baseline-json 35366f1=old.json``.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib
import json
import math
import os
import pkgutil
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _old_layout_shim(tree: Path) -> None:
    """Import ``ladder.fit`` / ``ladder.predict`` from an old checkout whose packages were the
    top-level ``fit`` and ``predict`` (and ``ladder`` only the base modules)."""
    sys.path.insert(0, str(tree))
    import ladder  # the old checkout's base package
    for name in ("fit", "predict"):
        pkg = importlib.import_module(name)
        sys.modules[f"ladder.{name}"] = pkg
        setattr(ladder, name, pkg)
        for m in pkgutil.iter_modules(pkg.__path__):
            sys.modules[f"ladder.{name}.{m.name}"] = importlib.import_module(f"{name}.{m.name}")


if os.environ.get("SCOREBOARD_OLD_TREE"):
    _old_layout_shim(Path(os.environ["SCOREBOARD_OLD_TREE"]))
sys.path.insert(0, str(ROOT))  # bench/ of this checkout (an old tree has its own)

from bench.accuracy import ladder_tables  # noqa: E402  (the one loader of the anchors' ladders)

ALPHA = 0.1          # the band's miss rate: 90% bands (the level every forecast here reports)
BOOTSTRAP = 100      # run-level replicates per fit (the band's parameter term); fixed, seed 0
SEED = 0
# A ladder's mean |error| "worsens beyond its noise" when it grows by more than the larger of the
# standard error of its |errors| over its targets and NOISE_FLOOR: 0.1% is 3-7x the seed-to-seed
# sd of a final eval loss (Marin's d512 swarm, 3 seeds a mixture: 0.015-0.03% of the macro BPB,
# anchors/marin_mixture_study), so it also holds the data-order and eval-set variation one
# held-out comparison carries.
NOISE_FLOOR = 0.001


# ----------------------------------------------------------------------------- the protocol
# Written once, before any result was looked at (issue 35 item 1). fit: the runs each ladder is
# fitted on ("authors" = the authors' own fit set where they extrapolated from one; else every
# run below the targets); targets: the runs forecast; authors: the authors' mean |error| at those
# targets where they published one (a fraction), and what it is.


@dataclass(frozen=True)
class Protocol:
    ladder: str
    fit: str              # "authors" or "all" (bench.accuracy.ladder_tables' sets)
    fit_text: str
    targets_text: str
    authors: float | None = None
    authors_text: str = "no published held-out error at these targets"


PROTOCOL = (
    Protocol("Gadre rpj", "authors", "5 small runs (4 at M=20, d=96 at M=320)",
             "3 open_lm runs: 1.4B M=20, 1.4B M=640, 6.9B M=20",
             0.0072, "their law: 1.4B M=640 0.71%, 6.9B 0.73% (mean of the two)"),
    Protocol("Gadre rw_original", "authors", "5 small runs (as RPJ)",
             "3 open_lm runs (as RPJ)"),
    Protocol("Gadre c4_original", "authors", "5 small runs (as RPJ)",
             "open_lm runs (as RPJ)"),
    Protocol("OLMo finals", "authors", "190M-1B x 1, 2, 5, 10xC finals (configs/final.json)",
             "7B-4T and 13B-5T finals (C4)", 0.038, "13B: -3.8% (2.344 vs 2.438)"),
    Protocol("OLMo curves", "all", "the same 16 runs' C4 eval curves, every 10%",
             "7B-4T and 13B-5T finals (C4)", 0.038, "13B: -3.8% (their fit: finals)"),
    Protocol("Epoch Chinchilla", "all", "every point below 10^21.3 FLOPs",
             "the 14 points at 10^21.3-10^22.1 FLOPs"),
    Protocol("Porian tuned RW", "all", "11 smaller budgets (RW, tuned, const LR)",
             "every run of the largest budget (2.56e19)"),
    Protocol("Llama 3 IsoFLOP", "all", "every budget but the largest (digitised)",
             "every point of the largest budget"),
    Protocol("Muennighoff single-epoch", "all", "single-epoch runs below the largest size",
             "the largest size's single-epoch runs"),
    Protocol("Step Law dense", "all", "best-LR/batch loss of every (N, D) below the largest N",
             "the largest N's (N, D) cells"),
    Protocol("Marin Nemotron isoFLOP", "all", "the Nemotron isoFLOP sweep (1.8e18-3e20)",
             "validation-optimal 1e21 run (2.7655)", 0.0002,
             "Delphi (same lab, later recipe): 1e21 +0.02%"),
    Protocol("Gemstones hot", "all", "19 models <= 1.05B, every 10B tokens to 100B",
             "the three ~2B models at 350B tokens"),
)
# Not scored, and why (the list): the MPL curves (Luo et al. 2025) and Schaipp's
# schedules are schedule-aware curve-law problems (one model size, schedules held out; bench/
# accuracy_curves.py scores them against the authors); the Marin mixture study has two rungs
# below its d1536 target per mixture, fewer than any form's free parameters.
NOT_SCORED = {
    "multipower_luo2025": "one size's schedules held out: a curve-law problem "
                          "(bench/accuracy_curves.py, against the authors' 0.11-0.17%)",
    "schaipp2025_lr_schedules": "ordering of schedules, no size ladder "
                                "(bench/accuracy_curves.py)",
    "marin_mixture_study": "2 rungs below the d1536 target per mixture: fewer points than "
                           "any form's free parameters",
}


# ----------------------------------------------------------------------------- variants
@dataclass(frozen=True)
class Variant:
    """A way of fitting. ``kwargs(ctx)`` gives fit_law's keywords for one ladder; ``ctx``
    holds the ladder's fit set and, for a variant that learns from other ladders
    (``learns_from``), those ladders' results of that variant (never this ladder's)."""
    name: str
    text: str
    kwargs: Callable[[dict], dict]
    learns_from: str | None = None


def _fixed(**kw) -> Callable[[dict], dict]:
    return lambda ctx: dict(kw)


def e_fraction_prior(ctx: dict) -> dict:
    """A Gaussian prior on E as a fraction of the fit set's smallest loss, its mean and sd the
    mean and sd over the OTHER ladders of E / smallest loss of their plain fits (leave one
    ladder out)."""
    fr = [r["E_fraction"] for name, r in ctx["others"].items()
          if r.get("E_fraction") is not None and math.isfinite(r["E_fraction"])]
    base = {"asymptote_rule": False, "scale_weighting": False}
    if len(fr) < 2:
        return base
    m, s = float(np.mean(fr)), float(np.std(fr, ddof=1))
    lmin = float(ctx["fit"]["loss"].min())
    return dict(base, prior={"E": (m * lmin, s * lmin)}, _learned={"E_fraction": (m, s)})


def _median_of_others(ctx: dict, key: str) -> float | None:
    v = [r["band_terms"][key] for r in ctx["others"].values()
         if (r.get("band_terms") or {}).get(key) is not None
         and math.isfinite(r["band_terms"][key])]
    return float(np.median(v)) if v else None


def learned_band_prior(ctx: dict) -> dict | None:
    """The band prior of ladder.fit.law.BAND_PRIOR, its centres the medians over the OTHER
    ladders' own terms (their plain fits), leave one ladder out; its weight the library's."""
    import ladder.fit.law as law
    if not hasattr(law, "BAND_PRIOR"):      # code before the band prior (35366f1)
        return None
    noise, rate = _median_of_others(ctx, "noise_log_sd"), _median_of_others(ctx, "rate")
    if noise is None or rate is None:
        return None
    return {"noise_log_sd": noise, "rate": rate, "weight": law.BAND_PRIOR_WEIGHT,
            "source": "leave-one-ladder-out"}


def band_prior_only(ctx: dict) -> dict:
    bp = learned_band_prior(ctx)
    return {"asymptote_rule": False, "scale_weighting": False,
            **({} if bp is None else {"band_prior": bp, "_learned": {"band_prior": bp}})}


def e_and_band_prior(ctx: dict) -> dict:
    kw, bp = e_fraction_prior(ctx), learned_band_prior(ctx)
    if bp is not None:
        kw["band_prior"] = bp
        kw["_learned"] = dict(kw.get("_learned") or {}, band_prior=bp)
    return kw


VARIANTS = {v.name: v for v in (
    Variant("defaults", "fit_law's defaults in the code under test (they learn nothing from "
            "these ladders; a default that did would be scored leave-one-ladder-out, as the "
            "prior variants below are)", _fixed()),
    Variant("rules", "35366f1's stack: form auto + scale weights + asymptote rule",
            _fixed(asymptote_rule=True, scale_weighting=True)),
    Variant("plain", "form auto, no scale weights, no asymptote rule",
            _fixed(asymptote_rule=False, scale_weighting=False)),
    Variant("weights-only", "form auto + scale weights, no asymptote rule",
            _fixed(asymptote_rule=False, scale_weighting=True)),
    Variant("no-weights", "form auto + asymptote rule, no scale weights",
            _fixed(asymptote_rule=True, scale_weighting=False)),
    Variant("no-one-se", "the defaults, but --form auto takes the final-point form with the "
            "lowest rollout error, not the simplest within one standard error of it "
            "(FitConfig.one_se_form=False)", _fixed(one_se_form=False)),
    Variant("own-folds", "the defaults, but the asymptote rule scores each variant on its own "
            "rollout folds, not on the folds they share (FitConfig.shared_folds=False)",
            _fixed(shared_folds=False)),
    Variant("e-prior", "form auto + a prior on E / smallest loss learned on the other ladders "
            "(plain fits), no rules", e_fraction_prior, learns_from="plain"),
    Variant("band-prior", "plain + the band prior learned on the other ladders",
            band_prior_only, learns_from="plain"),
    Variant("e+band-prior", "plain + the E prior + the band prior, both learned on the other "
            "ladders", e_and_band_prior, learns_from="plain"),
)}


# ----------------------------------------------------------------------------- scoring
@dataclass
class LadderScore:
    ladder: str
    variant: str
    y: list = field(default_factory=list)
    pred: list = field(default_factory=list)
    lo: list = field(default_factory=list)
    hi: list = field(default_factory=list)
    form: str = ""
    E_fraction: float | None = None
    seconds: float = 0.0
    error: str | None = None
    learned: dict | None = None
    band_terms: dict | None = None
    power_grid: dict | None = None   # {str(power): [lo, hi]} of the same fit (POWERS)

    @property
    def ok(self) -> bool:
        return self.error is None and len(self.y) > 0

    def arrays(self):
        return (np.asarray(self.y, float), np.asarray(self.pred, float),
                np.asarray(self.lo, float), np.asarray(self.hi, float))

    def metrics(self) -> dict:
        if not self.ok:
            return {}
        y, p, lo, hi = self.arrays()
        err = p / y - 1
        lo = np.where(np.isfinite(lo), lo, -np.inf)
        hi = np.where(np.isfinite(hi), hi, np.inf)
        score = ((hi - lo) + (2 / ALPHA) * np.clip(lo - y, 0, None)
                 + (2 / ALPHA) * np.clip(y - hi, 0, None)) / y
        a = np.abs(err)
        return {"n": int(y.size), "mean_abs": float(a.mean()), "max_abs": float(a.max()),
                "coverage": float(np.mean((lo <= y) & (y <= hi))),
                "half_width": float(np.mean((hi - lo) / 2 / y)),
                "interval_score": float(score.mean()),
                "noise": max(float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else 0.0,
                             NOISE_FLOOR),
                "errors": [float(e) for e in err]}

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in ("ladder", "variant", "y", "pred", "lo", "hi",
                                                "form", "E_fraction", "seconds", "error",
                                                "learned", "band_terms", "power_grid")}


def _query(df, fit_df) -> dict:
    kw = {c: df[c].to_numpy(float) for c in ("params", "tokens", "compute")}
    if "fraction" in fit_df.columns:  # a table of curves: its targets are the runs' ends
        kw["fraction"] = df["fraction"].to_numpy(float) if "fraction" in df.columns \
            else np.ones(len(df))
    return kw


def score_ladder(name: str, fit_df, targets, variant: Variant, ctx: dict) -> LadderScore:
    from ladder.fit import fit_law, load_points
    out = LadderScore(name, variant.name)
    kw = variant.kwargs(dict(ctx, fit=fit_df))
    out.learned = kw.pop("_learned", None)
    t0 = time.process_time()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = fit_law(load_points(fit_df.copy()), bootstrap=BOOTSTRAP, level=1 - ALPHA,
                        seed=SEED, **kw)
            p = r.predict(**_query(targets, fit_df))
    except Exception as e:  # noqa: BLE001 - a ladder a variant cannot fit is a row saying so
        out.error = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
        out.seconds = time.process_time() - t0
        return out
    out.seconds = time.process_time() - t0
    out.y = [float(v) for v in targets["loss"]]
    out.pred = [float(v) for v in np.broadcast_to(p.loss, len(targets))]
    out.lo = [float(v) for v in np.broadcast_to(p.lo, len(targets))]
    out.hi = [float(v) for v in np.broadcast_to(p.hi, len(targets))]
    d = r.diagnostics or {}
    out.form = str((d.get("auto") or {}).get("chosen", r.form))
    if hasattr(r, "band_terms"):
        out.band_terms = r.band_terms(1 - ALPHA)
    if "E" in r.params:
        out.E_fraction = float(r.params["E"]) / float(fit_df["loss"].min())
    out.power_grid = _power_grid(r, _query(targets, fit_df), len(targets))
    return out


# The extrapolation term's power (ladder.fit.backtest.EXTRAPOLATION_POWER: log sd = s d^p
# outside the fitted runs), scored leave-one-ladder-out from these candidates: every fit's band
# is recomputed at each (it moves no estimate), and each ladder is scored at the power that
# gives the OTHER ladders the lowest mean interval score (lolo_power).
POWERS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _power_grid(r, query: dict, n: int) -> dict | None:
    """{power: [lo, hi]} of fit ``r``'s band at each of POWERS; None for code without the
    power model (35366f1) or a law without a rollout record."""
    try:
        from ladder.fit.backtest import pooled_scale
    except ImportError:
        return None
    ex = ((r.diagnostics or {}).get("backtest") or {}).get("extrapolation")
    if not isinstance(ex, dict) or "power" not in ex:
        return None
    folds = r.diagnostics["backtest"].get("folds")
    saved = (ex["power"], ex.get("log_sd_scale"))
    out = {}
    try:
        for pw in POWERS:
            ex["power"], ex["log_sd_scale"] = pw, pooled_scale(folds, pw)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                p = r.predict(**query)
            out[str(pw)] = [[float(v) for v in np.broadcast_to(p.lo, n)],
                            [float(v) for v in np.broadcast_to(p.hi, n)]]
    finally:
        ex["power"], ex["log_sd_scale"] = saved
    return out


def lolo_power(scores: dict[str, LadderScore], name: str) -> dict[str, LadderScore]:
    """``scores`` (a variant with power grids) with each ladder's band at the power that gives
    the other ladders the lowest mean interval score (leave one ladder out); a ladder without
    a grid keeps its band."""
    def at(s: LadderScore, pw: str) -> LadderScore:
        if not s.ok or not s.power_grid or pw not in s.power_grid:
            return s
        lo, hi = s.power_grid[pw]
        return LadderScore(**dict(s.to_json(), variant=name, lo=lo, hi=hi,
                                  learned={"power": float(pw)}))
    keys = [str(p) for p in POWERS]
    out = {}
    for k, s in scores.items():
        others = [o for n, o in scores.items() if n != k and o.ok]
        best = min(keys, key=lambda pw: np.mean([at(o, pw).metrics()["interval_score"]
                                                 for o in others]))
        out[k] = at(s, best)
    return out


# ----------------------------------------------------------------------------- cache
@functools.cache
def _code_key() -> str:
    """The source of ladder/fit/ as imported (this checkout's or --old-tree's), hashed once, at
    the first fit (a file edited during a run does not re-key what the run computed)."""
    import ladder.fit as pkg
    h = hashlib.sha256()
    for f in sorted(Path(pkg.__file__).parent.glob("*.py")):
        # not the library's band prior centres (ladder.fit.law.BAND_PRIOR, one line): learned
        # from these ladders' plain fits, they are read by no variant (each uses its own
        # leave-one-ladder-out value, or none), so writing them re-keys nothing
        src = b"\n".join(x for x in f.read_bytes().splitlines()
                          if not x.startswith(b"BAND_PRIOR = "))
        h.update(f.name.encode() + src)
    return h.hexdigest()[:16]


def _cache_path(cache: Path, variant: Variant, name: str, extra: str = "") -> Path:
    proto = repr(next(p for p in PROTOCOL if p.ladder == name)) + f"{BOOTSTRAP}{SEED}{ALPHA}"
    key = hashlib.sha256(f"{_code_key()}|{variant.name}|{proto}|{extra}".encode()).hexdigest()
    return cache / f"{variant.name}-{name.replace(' ', '_')}-{key[:16]}.json"


def run_variant(variant: Variant, ladders: dict, cache: Path | None, log=print,
                all_ladders: dict | None = None) -> dict[str, LadderScore]:
    """{ladder: score} of one variant; a variant that learns from another first runs that
    one on every ladder (all_ladders), so each ladder's context is the others'."""
    others: dict = {}
    if variant.learns_from:
        base = run_variant(VARIANTS[variant.learns_from], all_ladders or ladders, cache, log)
        others = {k: v.to_json() for k, v in base.items() if v.ok}
    out = {}
    for proto in PROTOCOL:
        if proto.ladder not in ladders:
            continue
        fit_df, targets = ladders[proto.ladder]
        ctx = {"others": {k: v for k, v in others.items() if k != proto.ladder}}
        extra = json.dumps(sorted((k, v.get("E_fraction"), v.get("band_terms"))
                                  for k, v in ctx["others"].items()))
        path = _cache_path(cache, variant, proto.ladder, extra) if cache else None
        if path is not None and path.exists():
            out[proto.ladder] = LadderScore(**json.loads(path.read_text()))
            continue
        s = score_ladder(proto.ladder, fit_df, targets, variant, ctx)
        log(f"  {variant.name:<12} {proto.ladder:<26} {s.seconds:6.1f} s CPU  "
            + (s.error or f"form {s.form}"))
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(s.to_json()))
            tmp.replace(path)
        out[proto.ladder] = s
    return out


def load_ladders(anchors: Path, only=None) -> dict:
    """{ladder: (fit set, targets)} by the protocol (the tables from bench.accuracy)."""
    tables = ladder_tables(anchors)
    out = {}
    for proto in PROTOCOL:
        if proto.ladder not in tables or (only and not any(o in proto.ladder for o in only)):
            continue
        allr, targets, authors = tables[proto.ladder]
        out[proto.ladder] = (authors if proto.fit == "authors" else allr, targets)
    return out


def default_anchors() -> Path:
    """../shared/anchors beside this checkout (the main one), or beside its parent (a git
    worktree one level further down)."""
    for p in (ROOT.parent / "shared" / "anchors", ROOT.parent.parent / "shared" / "anchors"):
        if p.is_dir():
            return p
    return ROOT.parent / "shared" / "anchors"


# ----------------------------------------------------------------------------- tables
def aggregate(scores: dict[str, LadderScore]) -> dict:
    ms = {k: s.metrics() for k, s in scores.items() if s.ok}
    if not ms:
        return {"ladders": 0}
    ys = [s.arrays() for s in scores.values() if s.ok]
    inside = np.concatenate([(np.where(np.isfinite(lo), lo, -np.inf) <= y)
                             & (y <= np.where(np.isfinite(hi), hi, np.inf))
                             for y, _, lo, hi in ys])
    return {"ladders": len(ms), "failed": sorted(k for k, s in scores.items() if not s.ok),
            "targets": int(inside.size),
            "interval_score": float(np.mean([m["interval_score"] for m in ms.values()])),
            "mean_abs": float(np.mean([m["mean_abs"] for m in ms.values()])),
            "max_abs": float(np.max([m["max_abs"] for m in ms.values()])),
            "coverage_pooled": float(inside.mean()),
            "coverage_mean": float(np.mean([m["coverage"] for m in ms.values()])),
            "half_width": float(np.mean([m["half_width"] for m in ms.values()]))}


def markdown(results: dict[str, dict[str, LadderScore]]) -> str:
    """One table per variant, then the aggregates side by side."""
    lines = []
    for vname, scores in results.items():
        lines += [f"### {vname}", "",
                  "| ladder | targets | form | mean abs err | max abs err | coverage (90%) | "
                  "mean half-width | interval score (rel.) | authors' mean abs err |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---|"]
        for proto in PROTOCOL:
            s = scores.get(proto.ladder)
            if s is None:
                continue
            auth = f"{proto.authors:.2%} ({proto.authors_text})" if proto.authors is not None \
                else "-"
            if not s.ok:
                lines.append(f"| {proto.ladder} | - | fails: {s.error} | | | | | | {auth} |")
                continue
            m = s.metrics()
            lines.append(f"| {proto.ladder} | {m['n']} | {s.form} | {m['mean_abs']:.2%} | "
                         f"{m['max_abs']:.2%} | {m['coverage']:.0%} | {m['half_width']:.2%} | "
                         f"{m['interval_score']:.4f} | {auth} |")
        a = aggregate(scores)
        if a["ladders"]:
            lines.append(f"| **aggregate** ({a['ladders']} ladders, {a['targets']} targets) | "
                         f"| | {a['mean_abs']:.2%} | {a['max_abs']:.2%} | "
                         f"{a['coverage_pooled']:.0%} pooled ({a['coverage_mean']:.0%} mean) | "
                         f"{a['half_width']:.2%} | **{a['interval_score']:.4f}** | |")
        lines.append("")
    lines += ["### aggregates", "",
              "| variant | interval score (mean over ladders) | mean abs err | pooled coverage | "
              "mean half-width | failed |", "|---|---:|---:|---:|---:|---|"]
    for vname, scores in results.items():
        a = aggregate(scores)
        if a["ladders"]:
            lines.append(f"| {vname} | {a['interval_score']:.4f} | {a['mean_abs']:.2%} | "
                         f"{a['coverage_pooled']:.0%} | {a['half_width']:.2%} | "
                         f"{', '.join(a['failed']) or '-'} |")
    return "\n".join(lines) + "\n"


def protocol_markdown() -> str:
    lines = ["| ladder | fit set | targets | authors' figure |", "|---|---|---|---|"]
    for p in PROTOCOL:
        lines.append(f"| {p.ladder} | {p.fit_text} | {p.targets_text} | {p.authors_text} |")
    for k, why in NOT_SCORED.items():
        lines.append(f"| {k} | not scored | | {why} |")
    return "\n".join(lines) + "\n"


def _decisions(path: Path) -> str:
    """The hand-written "## Decisions" section of an existing --out file (up to the next "## "
    heading), so that regenerating the tables keeps what was decided on them; "" if none."""
    if not path.exists():
        return ""
    text = path.read_text()
    start = text.find("\n## Decisions")
    if start < 0:
        return ""
    end = text.find("\n## ", start + 1)
    return text[start + 1:end + 1 if end >= 0 else len(text)].rstrip("\n") + "\n\n"


def compare(base: dict[str, LadderScore], new: dict[str, LadderScore]) -> dict:
    """Does ``new`` pass the rule for a change of default against ``base``: a lower aggregate
    interval score, and no ladder's mean |error| worse by more than its noise (the base's)?"""
    worse = []
    for k, b in base.items():
        n = new.get(k)
        if not b.ok:
            continue
        if n is None or not n.ok:
            worse.append(f"{k}: fails")
            continue
        mb, mn = b.metrics(), n.metrics()
        if mn["mean_abs"] - mb["mean_abs"] > mb["noise"]:
            worse.append(f"{k}: {mb['mean_abs']:.2%} -> {mn['mean_abs']:.2%} "
                         f"(noise {mb['noise']:.2%})")
    ab, an = aggregate(base), aggregate(new)
    return {"interval_score": (ab.get("interval_score"), an.get("interval_score")),
            "better": an.get("interval_score", math.inf) < ab.get("interval_score", -math.inf),
            "worse_ladders": worse, "passes": not worse and
            an.get("interval_score", math.inf) < ab.get("interval_score", -math.inf)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--anchors", default=str(default_anchors()))
    ap.add_argument("--variant", action="append", default=None, choices=sorted(VARIANTS),
                    help="a variant to score (repeat; default: defaults)")
    ap.add_argument("--ladders", action="append", default=None, metavar="SUBSTRING",
                    help="only ladders whose name contains this (repeat)")
    ap.add_argument("--baseline-json", action="append", default=[], metavar="LABEL=PATH",
                    help="a --json output of another run (e.g. 35366f1's code) to put beside")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "ladder-scoreboard"))
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--out", default=None, help="write the markdown tables here")
    ap.add_argument("--json", default=None, help="write every ladder's numbers here")
    args = ap.parse_args(argv)
    anchors = Path(args.anchors)
    if not anchors.is_dir():
        print(f"skip: no anchors folder at {anchors}")
        return 0
    ladders = load_ladders(anchors, args.ladders)
    all_ladders = load_ladders(anchors) if args.ladders else ladders
    cache = None if args.no_cache else Path(args.cache)
    results: dict[str, dict[str, LadderScore]] = {}
    for spec in args.baseline_json:
        label, path = spec.split("=", 1)
        obj = json.loads(Path(path).read_text())
        for vname, rows in obj["results"].items():
            results[f"{label} {vname}"] = {k: LadderScore(**v) for k, v in rows.items()
                                           if k in ladders}
    t0 = time.perf_counter()
    for vname in args.variant or ["defaults"]:
        results[vname] = run_variant(VARIANTS[vname], ladders, cache, all_ladders=all_ladders,
                                     log=lambda s: print(s, file=sys.stderr, flush=True))
        if any(s.power_grid for s in results[vname].values()) and len(ladders) > 1:
            label = f"{vname} (power learned leave-one-ladder-out)"
            results[label] = lolo_power(results[vname], label)
    text = markdown(results)
    print(text)
    names = list(results)
    for n in names[1:]:
        c = compare(results[names[0]], results[n])
        print(f"{n} against {names[0]}: interval score {c['interval_score'][0]:.4f} -> "
              f"{c['interval_score'][1]:.4f}; ladders worse beyond noise: "
              f"{'; '.join(c['worse_ladders']) or 'none'}; passes: {c['passes']}")
    print(f"({time.perf_counter() - t0:.0f} s)")
    if args.out:
        kept = _decisions(Path(args.out))
        doc = (f"# Scoreboard (bench/scoreboard.py)\n\nWritten by `python bench/scoreboard.py "
               f"{' '.join(argv if argv is not None else sys.argv[1:])}`. Per ladder: errors "
               "predicted / actual - 1 at the targets; coverage of the 90% band; mean half-width "
               "and the interval score (Gneiting & Raftery 2007, alpha 0.1) relative to the "
               f"actual; {BOOTSTRAP} bootstrap replicates, seed {SEED}. Aggregate: the mean over "
               "ladders (each ladder weighs the same), coverage pooled over every target.\n\n"
               + kept + "## Protocol (fixed before any result was seen)\n\n" + protocol_markdown()
               + "\n## Results\n\n" + text)
        tmp = Path(args.out).with_suffix(".tmp")
        tmp.write_text(doc)
        tmp.replace(args.out)
    if args.json:
        obj = {"protocol": [p.__dict__ for p in PROTOCOL], "alpha": ALPHA,
               "bootstrap": BOOTSTRAP, "results": {v: {k: s.to_json() for k, s in r.items()}
                                                   for v, r in results.items()},
               "aggregate": {v: aggregate(r) for v, r in results.items()}}
        tmp = Path(args.json).with_suffix(".tmp")
        tmp.write_text(json.dumps(obj, indent=1))
        tmp.replace(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
