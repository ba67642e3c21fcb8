"""`ladder fit`, `ladder compare` and `ladder predict` (arguments are parsed in cli/main)."""

from __future__ import annotations

import contextlib
import json
import math
import sys
import warnings

import numpy as np
import pandas as pd

from ladder.cli.output import recorded_warnings, tell
from ladder.io import (EX_DATAERR, EX_USAGE, InputError, atomic_write_json, check_writable, number,
                       to_jsonable)


def _pairs(items, what: str, numeric: bool) -> dict:
    out = {}
    for item in items or []:
        for part in str(item).split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise InputError(f"expected NAME=VALUE, got {part!r}", field=what,
                                 exit_code=EX_USAGE)
            k, v = (s.strip() for s in part.split("=", 1))
            if numeric:
                try:
                    v = float(v)
                except ValueError:
                    raise InputError(f"{k}: not a number: {v!r}", field=what,
                                     exit_code=EX_USAGE) from None
            out[k] = v
    return out


def _priors(items) -> dict:
    """``NAME=MEAN:SD`` pairs (several per flag, comma-separated) -> {name: (mean, sd)}."""
    out = {}
    for k, v in _pairs(items, "--prior", False).items():
        mean, sep, sd = v.partition(":")
        try:
            m, s = float(mean), float(sd)
        except ValueError:
            raise InputError(f"{k}: expected NAME=MEAN:SD, got {k}={v}", field="--prior",
                             exit_code=EX_USAGE) from None
        if not sep or not s > 0:
            raise InputError(f"{k}: expected NAME=MEAN:SD with SD > 0, got {k}={v}",
                             field="--prior", exit_code=EX_USAGE)
        out[k] = (m, s)
    return out


def unconverged(res) -> list[str]:
    """What did not converge in a fit result (empty when everything did): the best start of a
    single law, the failing values of a ``by`` fit, or a curve law's solver."""
    d = getattr(res, "diagnostics", {}) or {}
    if getattr(res, "groups", None):
        return [f"{res.by}={v:g}" for v, g in res.groups if not g.diagnostics.get("converged")]
    return [] if d.get("converged", True) else ["the best start"]


def _print_warnings(command: str, caught) -> None:
    """Each distinct warning once, on stderr, without the points reader's per-row drops."""
    seen = set()
    for w in caught:
        msg = str(w.message)
        if msg not in seen and "dropped:" not in msg:
            seen.add(msg)
            print(f"ladder {command}: warning: {msg}", file=sys.stderr)


def check_fit_numbers(args) -> None:
    """--level in (0, 1) and --bootstrap a count, before any work. 10**5 replicates: ~1e3x the
    default (200); beyond it memory, not accuracy, grows."""
    number(args.level, field="--level", lo=0, hi=1, lo_open=True, hi_open=True,
           exit_code=EX_USAGE)
    number(args.bootstrap, field="--bootstrap", lo=0, hi=100_000, integral=True,
           exit_code=EX_USAGE)


def fit_main(args) -> int:
    """`ladder fit`. Each ``--metric`` is a key or a glob over the keys the sources hold
    (ladder.fit.points.expand_metrics): one key, law.json is its law (law/3); several,
    :func:`_fit_many`."""
    from ladder.fit.points import expand_metrics
    check_fit_numbers(args)
    if args.out:
        check_writable(args.out, field="--out")
    if args.form == "task" or args.via:
        return _fit_task_main(args)
    from ladder.sources.keymap import load_keymap
    keymap = load_keymap(args.keys)
    metrics = expand_metrics(args.metric, args.sources, keymap=keymap)
    if len(metrics) > 1:
        return _fit_many(args, metrics, keymap)
    with recorded_warnings() as caught:
        res, df, doc = _fit_metric(args, metrics[0], keymap)
    _print_warnings("fit", caught)
    with np.errstate(over="ignore"):  # a law beyond float64 is refused below, in one line
        shown = json.dumps(to_jsonable(doc)) if args.json else res.report()
    doc = dict(doc, points=law_points(df))
    with _shown_if_refused(shown):
        _check_converged(args, res)
        if args.out:
            _readable(doc)
    _write_then_tell(args.out, doc, shown, as_json=args.json)
    return 0


@contextlib.contextmanager
def _shown_if_refused(shown: str):
    """A refusal (InputError) inside shows the report first: its solver line says why."""
    try:
        yield
    except InputError:
        tell(shown)
        raise


def _write_then_tell(out, doc: dict, shown: str, *, as_json: bool, note: str = "") -> None:
    """law.json first (atomically), then the report (ladder.cli.output)."""
    if out:
        atomic_write_json(out, doc)
    tell(shown)
    if out:
        tell(f"wrote {out}{note}", file=sys.stderr if as_json else sys.stdout)


def _points(sources, metric: str | None, args, keymap=None):
    """The points table of ``sources`` (a W&B offline run directory read by
    ladder.fit.points.offline_run_points, every other kind by load_points)."""
    from ladder.fit.points import load_points, offline_run_points
    from ladder.sources import is_wandb_offline_dir
    sources = [offline_run_points(s, metric, args.sizes, keymap=keymap)
               if is_wandb_offline_dir(s) else s for s in sources]
    return load_points(sources, metric, sizes=args.sizes, keymap=keymap,
                       include_target=args.include_target)


def _fit_metric(args, metric: str | None, keymap):
    """One metric's fit: (the law, its points table, its law.json document without the
    points)."""
    from ladder.fit.law import fit_law
    df = _points(args.sources, metric, args, keymap)
    if not len(df):
        dropped = df.attrs.get("dropped") or []
        first = f" (e.g. {dropped[0]})" if dropped else ""
        raise InputError(f"no usable points: every row was dropped{first}",
                         path=args.sources[0], field="loss")
    res = fit_law(df, _fit_config(args, form=args.form, by=args.by,
                                  metric=df.attrs.get("metric"), **_law_options(args)))
    with np.errstate(over="ignore"):  # a law beyond float64 is refused by _readable
        doc = res.to_json()
    if keymap is not None:  # another trainer's names (and FLOP convention) went in
        conv = {**(doc.get("conventions") or {}), "metric_keys": keymap.to_dict()}
        if "flops" in keymap.theirs:  # a run without our rung spec: the trainer counted
            key, scale = keymap.theirs["flops"]
            conv["flops_source"] = (f"runs without a ladder rung: compute = {key} x "
                                    f"{scale:g} as the trainer logged it (its own FLOP "
                                    f"count, not {conv.get('flops', 'flops-v1')})")
        doc["conventions"] = conv
    return res, df, doc


def _fit_config(args, **fields):
    """The FitConfig of the options `fit` and `compare` share (main._fit_options), with
    ``fields``."""
    from ladder.fit.config import FitConfig
    return FitConfig(fix=_pairs(args.fix, "--fix", True), bootstrap=args.bootstrap,
                     level=args.level, seed=args.seed, objective=args.objective,
                     # None: fit_law's default (the forecast devices on for --form auto only,
                     # a named form its own estimator); the flags turn them off
                     asymptote_rule=False if args.free_asymptote else None,
                     scale_weighting=False if args.equal_weights else None,
                     **fields)


def _law_options(args) -> dict:
    """The FitConfig fields only `ladder fit` has options for."""
    return {"tie": _pairs(args.tie, "--tie", False), "prior": _priors(args.prior),
            "params_column": args.params_column}


def _check_converged(args, res) -> None:
    bad = unconverged(res)
    if bad and not args.allow_unconverged:
        # a law from a solver that stopped early is not the optimum it claims to be: refuse to
        # write it unless the user accepts that (the report above shows how far it got)
        raise InputError(f"{', '.join(bad)} did not converge (see the solver line above); "
                         "nothing written; rerun with --allow-unconverged to keep it anyway",
                         field="diagnostics.converged", exit_code=EX_DATAERR)


def _fit_many(args, metrics: list[str], keymap) -> int:
    """`ladder fit --metric A --metric B ...`: each metric fitted as it would be alone, each
    report, then one summary line per metric; law.json (law/2: ``laws: {key: law}``) holds them
    all. Every metric is tried, so a refusal names all that failed; then nothing is written (a
    file missing some of the asked-for metrics would pass for the whole set)."""
    import time

    from ladder.fit.lawjson import multi_to_json
    from ladder.fit.points import listed_keys
    from ladder.fit.report import metric_summary, summary_lines
    as_json = args.json
    fitted, refused, rows = {}, {}, []
    reports = []  # printed once law.json is written (or refused)
    for metric in metrics:
        t0 = time.perf_counter()
        with recorded_warnings() as caught:
            try:
                res, df, doc = _fit_metric(args, metric, keymap)
                if not as_json:  # before the checks: an unconverged fit shows its solver line
                    with np.errstate(over="ignore"):
                        reports.append(f"== {metric} ==\n{res.report()}\n")
                _check_converged(args, res)
                doc["points"] = law_points(df)
                _readable(doc)
            except InputError as e:
                refused[metric] = e
                rows.append({"metric": metric, "refused": str(e)})
                continue
        _print_warnings(f"fit: {metric}", caught)
        fitted[metric] = doc
        with np.errstate(over="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rows.append(dict(metric_summary(metric, res, df),
                             seconds=round(time.perf_counter() - t0, 2)))
    if refused:
        if not as_json:
            tell("\n".join([*reports, *summary_lines(rows, args.level)]))
        msgs = {m: str(e) for m, e in refused.items()}
        why = (f"all {len(msgs)}, {listed_keys(msgs)}: {next(iter(msgs.values()))}"
               if len(msgs) > 1 and len(set(msgs.values())) == 1
               else "; ".join(f"{m}: {msg}" for m, msg in msgs.items()))
        raise InputError(f"{len(refused)} of {len(metrics)} metrics refused, so no law.json is "
                         f"written ({why})", path=str(args.sources[0]), field="--metric",
                         exit_code=next(iter(refused.values())).exit_code)
    doc = multi_to_json(fitted)
    if args.out:
        _readable(doc)
    if as_json:
        out = dict(doc, laws={m: {k: v for k, v in d.items() if k != "points"}
                              for m, d in fitted.items()}, summary=rows)
        shown = json.dumps(to_jsonable(out))
    else:
        shown = "\n".join([*reports, *summary_lines(rows, args.level)])
    _write_then_tell(args.out, doc, shown, as_json=as_json, note=f" ({len(fitted)} laws)")
    return 0


def _fit_task_main(args) -> int:
    """`ladder fit TABLE --form task --via LOSS_KEY --metric ACC_KEY` (fit.task): points tables
    (CSV, Parquet) with one row per (run, eval) and a column for each key."""
    from pathlib import Path

    from ladder.fit.law import fit_task
    from ladder.io import read_table
    if args.form != "task":
        raise InputError(f"--via goes with --form task, not --form {args.form}", field="--via",
                         exit_code=EX_USAGE)
    if not args.via:
        raise InputError("--form task needs --via LOSS_KEY (the task-loss column)",
                         field="--via", exit_code=EX_USAGE)
    accs = args.metric or []  # repeatable (one law each); a task law maps to one accuracy
    if len(accs) != 1:
        raise InputError("--form task needs one --metric ACC_KEY (the accuracy column)"
                         + (f", got {len(accs)}" if accs else ""), field="--metric",
                         exit_code=EX_USAGE)
    acc = accs[0]
    if args.by:
        raise InputError("--form task takes no --by", field="--by", exit_code=EX_USAGE)
    frames = []
    for src in args.sources:
        if not Path(src).is_file():
            raise InputError("--form task reads points tables (CSV or Parquet, a column per "
                             "key), not runs directories or W&B runs", path=src,
                             field="SOURCE", exit_code=EX_USAGE)
        t = read_table(src)
        t.columns = [str(c).strip() for c in t.columns]
        for col in ("run", args.via, acc):
            if col not in t.columns:
                raise InputError(f"missing column (columns: {', '.join(t.columns)})", path=src,
                                 field=col)
        frames.append(t)
    df = pd.concat(frames, ignore_index=True)
    where = args.sources[0] if len(args.sources) == 1 else ", ".join(args.sources)
    with recorded_warnings() as caught:
        law = fit_task(df, args.via, acc,
                       _fit_config(args, form=args.via_form, **_law_options(args)), where=where)
    _print_warnings("fit", caught)
    with np.errstate(over="ignore"):
        doc = law.to_json()
        shown = json.dumps(to_jsonable(doc)) if args.json else law.report()
    with _shown_if_refused(shown):
        bad = unconverged(law.step1)
        if bad and not args.allow_unconverged:
            raise InputError(f"step 1: {', '.join(bad)} did not converge; nothing written; "
                             "rerun with --allow-unconverged to keep it anyway",
                             field="diagnostics.converged", exit_code=EX_DATAERR)
        if args.out:
            _readable(doc)
    _write_then_tell(args.out, doc, shown, as_json=args.json)
    return 0


def _readable(obj: dict) -> None:
    """What `fit` writes, `predict` reads: the law is read back through the one reader before
    it is written, and refused (exit 65, nothing written) when the reader would refuse it (an
    ols fit, which has no solver box, of losses whose log A is beyond law.json's range)."""
    from ladder.fit.law import laws_from_json
    try:
        laws_from_json(json.loads(json.dumps(to_jsonable(obj))))
    except InputError as e:
        where = "<law>" + (f": field '{e.field}'" if e.field else "") + ": "
        msg = str(e)[len(where):] if str(e).startswith(where) else str(e)
        raise InputError(f"law.json's reader would refuse the fitted law ({msg}); nothing "
                         "written", field=e.field, exit_code=EX_DATAERR) from None


# what `ladder report --law` draws of a fitted table; law.json stays small (a 300,000-row table
# would add ~30 MB): every run's last point, then evenly spaced rows, up to this many
LAW_POINTS_MAX = 2000
LAW_POINT_COLUMNS = ("run", "params", "active_params", "tokens", "compute", "fraction", "loss")


def law_points(df) -> dict:
    """The fitted points as law.json carries them (``points``: columns and rows, JSON numbers or
    null; ``n`` the table's rows, ``kept`` how they were chosen), so a report of a law fitted from
    a CSV draws them without the CSV. At most :data:`LAW_POINTS_MAX` rows."""
    cols = [c for c in LAW_POINT_COLUMNS if c in df.columns and df[c].notna().any()]
    d = df[cols]
    kept = "all"
    if len(d) > LAW_POINTS_MAX:
        last = d.sort_values("fraction").groupby("run", sort=False).tail(1) \
            if {"run", "fraction"} <= set(cols) else d.iloc[:0]
        rest = d.drop(index=last.index)
        room = max(LAW_POINTS_MAX - len(last), 0)
        step = max(len(rest) // room, 1) if room else len(rest) + 1
        d = pd.concat([last.iloc[:LAW_POINTS_MAX], rest.iloc[::step].iloc[:room]]).sort_index()
        kept = f"each run's last point, then every {step}th row (of {len(df)})"
    rows = [[None if isinstance(v, float) and not math.isfinite(v) else v
             for v in row] for row in d.itertuples(index=False, name=None)]
    return {"columns": cols, "rows": to_jsonable(rows), "n": int(len(df)), "kept": kept}


def predict_main(args) -> int:
    if args.schedule:
        return predict_schedule_main(args)
    from ladder.fit.law import load_law
    number(args.level, field="--level", lo=0, hi=1, lo_open=True, hi_open=True,
           exit_code=EX_USAGE)
    for name in ("params", "active_params", "tokens", "compute"):
        number(getattr(args, name), field=f"--{name.replace('_', '-')}", lo=0, lo_open=True,
               allow_none=True, exit_code=EX_USAGE)
    number(args.fraction, field="--fraction", lo=0, hi=1, lo_open=True, allow_none=True,
           exit_code=EX_USAGE)
    law = load_law(args.law, metric=args.metric)
    with recorded_warnings() as caught:
        try:
            pred = law.predict(params=args.params, active_params=args.active_params,
                               tokens=args.tokens, compute=args.compute, fraction=args.fraction,
                               level=args.level)
        except ValueError as e:  # "name: message" from the law's own checks
            name, _, msg = str(e).partition(": ")
            raise InputError(msg or name, field=f"--{name}" if msg else None,
                             exit_code=EX_USAGE) from None
    loss = getattr(pred, "loss", None)
    if loss is None or not all(math.isfinite(float(v)) for v in np.atleast_1d(loss)):
        raise InputError(f"the law predicts a non-finite loss ({loss!r}) here: its terms "
                         "overflow float64 at these inputs", path=args.law, field="fit.u")
    if any(np.any(np.isinf(np.asarray(getattr(pred, k, np.nan), float))) for k in ("lo", "hi")):
        raise InputError("the law's band overflows float64 here (an Infinity bound): its "
                         "uncertainty is beyond what a fit writes", path=args.law,
                         field="uncertainty")
    for w in caught:
        print(f"ladder predict: warning: {w.message}", file=sys.stderr)
    out = pred.to_dict()
    if getattr(law, "via", None):  # a task law (ladder.fit.task): loss/lo/hi are the accuracy
        p1 = law.predict_loss(params=args.params, active_params=args.active_params,
                              tokens=args.tokens, compute=args.compute,
                              fraction=args.fraction, level=args.level)
        out.update(metric=law.metric, accuracy=out["loss"],
                   via={"key": law.via, **{k: v for k, v in p1.to_dict().items()
                                           if k in ("loss", "lo", "hi")}})
    print(json.dumps(to_jsonable(out)))
    return 0


def compare_main(args) -> int:
    """`ladder compare A B`: the compute-equivalent multiplier of recipe B over recipe A, per
    metric (ladder.fit.compare); ``--out DIR`` gets compare.json and its figures, swapped in at
    once."""
    from pathlib import Path

    from ladder.fit.law import compare_points
    from ladder.fit.points import expand_metrics
    check_fit_numbers(args)
    number(args.at, field="--at", lo=0, lo_open=True, allow_none=True, exit_code=EX_USAGE)
    if args.out:
        check_writable(args.out, field="--out", directory=True)
    at, at_source = args.at, (f"--at {args.at:g}" if args.at is not None else None)
    if args.target:
        from ladder.cli.commands import resolve_target
        # 'LADDER' resolves to its rungs and the target, last
        rung = resolve_target(args.target, args)[1][-1]
        # the points-table convention: training FLOPs without the LM head (ladder.fit.points)
        at, at_source = rung.compute(lm_head=False), f"--target {args.target}"
    # --metric keys in order, each glob (``bpb/*``) expanded over the keys A holds; none:
    # ``[None]``, the table's ``loss`` (or runs' default)
    metrics = expand_metrics(args.metric, [args.a])
    config = _fit_config(args, form=args.form)
    results, caught_all = {}, []
    for metric in metrics:
        tables = []
        for src in (args.a, args.b):
            with recorded_warnings() as caught:
                df = _points([src], metric, args)
            caught_all += caught
            if metric is None:  # a table's own loss column, else runs' default metric
                metric = "loss" if Path(str(src)).is_file() else df.attrs.get("metric")
            if not len(df):
                raise InputError(f"{metric}: no usable points: every row was dropped",
                                 path=src, field="loss")
            df.attrs["source"] = str(src)
            tables.append(df)
        with recorded_warnings() as caught:
            cmp, fits = compare_points(tables[0], tables[1], config, metric=metric, at=at,
                                       at_source=at_source)
        caught_all += caught
        for side, res in zip("AB", fits, strict=True):
            bad = unconverged(res)
            if bad and not args.allow_unconverged:
                raise InputError(f"{metric}: recipe {side}'s fit: {', '.join(bad)} did not "
                                 "converge; rerun with --allow-unconverged to compare anyway",
                                 path=str(args.a if side == "A" else args.b),
                                 field="diagnostics.converged", exit_code=EX_DATAERR)
        results[metric] = cmp
    _print_warnings("compare", caught_all)
    obj = {metric: c.to_dict() for metric, c in results.items()}
    if args.json:
        shown = json.dumps(to_jsonable(obj))
    else:
        from ladder.fit.compare import report
        shown = report(results, a=args.a, b=args.b)
    if args.out:  # written before anything is printed (ladder.cli.output)
        from ladder.io import atomic_write_bytes, staged_dir
        doc = {"schema": "compare/1", "a": str(args.a), "b": str(args.b), "metrics": obj}
        from ladder.reports.plots import compare_figures
        pngs = compare_figures(to_jsonable(doc))
        with staged_dir(args.out, own=("*.png", "compare.json")) as tmp:
            atomic_write_json(tmp / "compare.json", doc)
            for name, data in pngs.items():
                atomic_write_bytes(tmp / name, data)
    tell(shown)
    if args.out:
        tell(f"wrote {args.out}/compare.json" + (f" and {len(pngs)} figure(s)" if pngs else ""),
             file=sys.stderr if args.json else sys.stdout)
    return 0


def predict_schedule_main(args) -> int:
    """``ladder predict law.json --schedule FILE|KIND:k=v,...``: CSV ``step,loss,lo,hi``."""
    from ladder.fit.curve_law import CurveLaw
    from ladder.fit.law import load_law
    from ladder.fit.lr_schedules import schedule_source

    if args.tokens is not None:
        raise InputError("has no meaning with --schedule (the schedule sets the run's length)",
                         field="--tokens", exit_code=64)
    law = load_law(args.law, metric=args.metric)
    if not isinstance(law, CurveLaw):
        raise InputError(f"a {law.form} law predicts at points, not along a schedule: "
                         "--schedule needs a curve law (--form mpl or momentum)", path=args.law,
                         field="form")
    at, lr = schedule_source(args.schedule)
    with recorded_warnings() as caught:
        pred = law.predict(schedule=lr, step=None if args.fraction is not None else at,
                           fraction=args.fraction, params=args.params,
                           active_params=args.active_params, compute=args.compute,
                           level=args.level)
    for w in caught:
        print(f"ladder predict: warning: {w.message}", file=sys.stderr)
    sys.stdout.write(pred.to_csv())
    return 0
