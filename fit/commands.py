"""`ladder fit` and `ladder predict`: parse-free entry points called by ladder/cli.py."""

from __future__ import annotations

import json
import math
import sys
import warnings

import numpy as np
import pandas as pd

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


def fit_main(args, *, offline_points=None) -> int:
    """`ladder fit`. ``offline_points(path, metric, sizes)`` turns a W&B offline run directory
    into a points table; its record log is read by predict, above fit, so the CLI hands the reader
    down (``ladder.commands.fit_main``) instead of fit importing it."""
    from fit.law import fit_law
    from fit.points import is_wandb_offline_dir, load_points
    # checked before any work: a bad --out or --level must not cost a finished fit
    number(args.level, field="--level", lo=0, hi=1, lo_open=True, hi_open=True,
           exit_code=EX_USAGE)
    # 10**5 replicates: already ~1e3x the default (200); beyond it memory, not accuracy, grows
    number(args.bootstrap, field="--bootstrap", lo=0, hi=100_000, integral=True,
           exit_code=EX_USAGE)
    if args.out:
        check_writable(args.out, field="--out")
    if args.form == "task" or getattr(args, "via", None):
        return _fit_task_main(args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sizes = getattr(args, "sizes", None)
        from ladder.keymap import load_keymap
        keymap = load_keymap(getattr(args, "keys", None))
        offline = [s for s in args.sources if is_wandb_offline_dir(s)]
        if offline and offline_points is None:
            raise InputError("a W&B offline run directory needs predict's record reader (run "
                             "`ladder fit`, or pass offline_points)", path=offline[0],
                             field="SOURCE")
        sources = [(offline_points(s, args.metric, sizes, keymap=keymap) if keymap else
                    offline_points(s, args.metric, sizes)) if s in offline else s
                   for s in args.sources]
        df = load_points(sources, args.metric, sizes=sizes, keymap=keymap,
                         include_target=getattr(args, "include_target", False))
        if not len(df):
            dropped = df.attrs.get("dropped") or []
            first = f" (e.g. {dropped[0]})" if dropped else ""
            raise InputError(f"no usable points: every row was dropped{first}",
                             path=args.sources[0], field="loss")
        res = fit_law(df, form=args.form, fix=_pairs(args.fix, "--fix", True),
                      tie=_pairs(args.tie, "--tie", False), by=args.by,
                      bootstrap=args.bootstrap, level=args.level, seed=args.seed,
                      params_column=args.params_column, metric=df.attrs.get("metric"),
                      objective=args.objective, prior=_priors(args.prior),
                      asymptote_rule=not getattr(args, "free_asymptote", False),
                      scale_weighting=not getattr(args, "equal_weights", False))
    _print_warnings("fit", caught)
    as_json = getattr(args, "json", False)
    with np.errstate(over="ignore"):  # a law beyond float64 is refused below, in one line
        doc = res.to_json()
        if keymap is not None:  # another trainer's names (and FLOP convention) went in
            conv = {**(doc.get("conventions") or {}), "metric_keys": keymap.to_dict()}
            if "flops" in keymap.theirs:  # a run without our rung spec: the trainer counted
                key, scale = keymap.theirs["flops"]
                conv["flops_source"] = (f"runs without a ladder rung: compute = {key} x "
                                        f"{scale:g} as the trainer logged it (its own FLOP "
                                        f"count, not {conv.get('flops', 'flops-v1')})")
            doc["conventions"] = conv
        print(json.dumps(to_jsonable(doc)) if as_json else res.report())
    bad = unconverged(res)
    if bad and not args.allow_unconverged:
        # a law from a solver that stopped early is not the optimum it claims to be: refuse to
        # write it unless the user accepts that (the report above shows how far it got)
        raise InputError(f"{', '.join(bad)} did not converge (see the solver line above); "
                         "nothing written; rerun with --allow-unconverged to keep it anyway",
                         field="diagnostics.converged", exit_code=EX_DATAERR)
    if args.out:
        doc["points"] = law_points(df)
        _readable(doc)
        atomic_write_json(args.out, doc)
        print(f"wrote {args.out}", file=sys.stderr if as_json else sys.stdout)
    return 0


def _fit_task_main(args) -> int:
    """`ladder fit TABLE --form task --via LOSS_KEY --metric ACC_KEY` (fit.task): points tables
    (CSV, Parquet) with one row per (run, eval) and a column for each key."""
    from pathlib import Path

    from fit.task import fit_task
    from ladder.io import read_table
    if args.form != "task":
        raise InputError(f"--via goes with --form task, not --form {args.form}", field="--via",
                         exit_code=EX_USAGE)
    if not args.via:
        raise InputError("--form task needs --via LOSS_KEY (the task-loss column)",
                         field="--via", exit_code=EX_USAGE)
    if not args.metric:
        raise InputError("--form task needs --metric ACC_KEY (the accuracy column)",
                         field="--metric", exit_code=EX_USAGE)
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
        for col in ("run", args.via, args.metric):
            if col not in t.columns:
                raise InputError(f"missing column (columns: {', '.join(t.columns)})", path=src,
                                 field=col)
        frames.append(t)
    df = pd.concat(frames, ignore_index=True)
    where = args.sources[0] if len(args.sources) == 1 else ", ".join(args.sources)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        law = fit_task(df, args.via, args.metric, form=args.via_form, bootstrap=args.bootstrap,
                       level=args.level, seed=args.seed, where=where,
                       fix=_pairs(args.fix, "--fix", True), tie=_pairs(args.tie, "--tie", False),
                       params_column=args.params_column, objective=args.objective,
                       prior=_priors(args.prior),
                       asymptote_rule=not getattr(args, "free_asymptote", False),
                       scale_weighting=not getattr(args, "equal_weights", False))
    _print_warnings("fit", caught)
    as_json = getattr(args, "json", False)
    with np.errstate(over="ignore"):
        doc = law.to_json()
        print(json.dumps(to_jsonable(doc)) if as_json else law.report())
    bad = unconverged(law.step1)
    if bad and not args.allow_unconverged:
        raise InputError(f"step 1: {', '.join(bad)} did not converge; nothing written; rerun "
                         "with --allow-unconverged to keep it anyway",
                         field="diagnostics.converged", exit_code=EX_DATAERR)
    if args.out:
        _readable(doc)
        atomic_write_json(args.out, doc)
        print(f"wrote {args.out}", file=sys.stderr if as_json else sys.stdout)
    return 0


def _readable(obj: dict) -> None:
    """What `fit` writes, `predict` reads: the law is read back through the one reader before
    it is written, and refused (exit 65, nothing written) when the reader would refuse it (an
    ols fit, which has no solver box, of losses whose log A is beyond law.json's range)."""
    from fit.law import law_from_json
    try:
        law_from_json(json.loads(json.dumps(to_jsonable(obj))))
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
    if getattr(args, "schedule", None):
        try:
            from fit.curves import predict_schedule_main
        except ImportError:
            raise InputError("--schedule needs the schedule-aware curve laws (fit.curves)",
                             field="--schedule", exit_code=EX_USAGE) from None
        return predict_schedule_main(args)
    from fit.law import load_law
    number(args.level, field="--level", lo=0, hi=1, lo_open=True, hi_open=True,
           exit_code=EX_USAGE)
    for name in ("params", "active_params", "tokens", "compute"):
        number(getattr(args, name), field=f"--{name.replace('_', '-')}", lo=0, lo_open=True,
               allow_none=True, exit_code=EX_USAGE)
    number(args.fraction, field="--fraction", lo=0, hi=1, lo_open=True, allow_none=True,
           exit_code=EX_USAGE)
    law = load_law(args.law)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
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
    for w in caught:
        print(f"ladder predict: warning: {w.message}", file=sys.stderr)
    out = pred.to_dict()
    if getattr(law, "via", None):  # a task law (fit.task): loss/lo/hi are the accuracy
        p1 = law.predict_loss(params=args.params, active_params=args.active_params,
                              tokens=args.tokens, compute=args.compute,
                              fraction=args.fraction, level=args.level)
        out.update(metric=law.metric, accuracy=out["loss"],
                   via={"key": law.via, **{k: v for k, v in p1.to_dict().items()
                                           if k in ("loss", "lo", "hi")}})
    print(json.dumps(to_jsonable(out)))
    return 0


def compare_main(args, *, offline_points=None, figures=None) -> int:
    """`ladder compare A B`: the compute-equivalent multiplier of recipe B over recipe A, per
    metric (fit.compare). Prints a report (or ``--json``: ``{metric: {multiplier, lo, hi,
    per_size, trend, ...}}``); ``--out DIR`` gets compare.json and, with ``figures``
    (compare.json's object -> {file name: PNG bytes}; the reports layer draws them, so
    ladder.commands.compare_main hands it down), the figures, all swapped in at once.
    ``offline_points`` as for :func:`fit_main`."""
    from pathlib import Path

    from fit.compare import compare_points
    from fit.points import is_wandb_offline_dir, load_points
    number(args.level, field="--level", lo=0, hi=1, lo_open=True, hi_open=True,
           exit_code=EX_USAGE)
    number(args.bootstrap, field="--bootstrap", lo=0, hi=100_000, integral=True,
           exit_code=EX_USAGE)
    number(args.at, field="--at", lo=0, lo_open=True, allow_none=True, exit_code=EX_USAGE)
    if args.out:
        check_writable(args.out, field="--out", directory=True)
    at, at_source = args.at, (f"--at {args.at:g}" if args.at is not None else None)
    if getattr(args, "target_compute", None) is not None:
        at, at_source = args.target_compute
    metrics = _compare_metrics(args)
    fit_opts = {"fix": _pairs(args.fix, "--fix", True), "objective": args.objective,
                "asymptote_rule": not args.free_asymptote,
                "scale_weighting": not args.equal_weights}
    sizes = getattr(args, "sizes", None)
    results, caught_all = {}, []
    for metric in metrics:
        tables = []
        for src in (args.a, args.b):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if is_wandb_offline_dir(src):
                    if offline_points is None:
                        raise InputError("a W&B offline run directory needs predict's record "
                                         "reader (run `ladder compare`)", path=src,
                                         field="SOURCE")
                    src_df = offline_points(src, metric, sizes)
                else:
                    src_df = src
                df = load_points([src_df], metric, sizes=sizes,
                                 include_target=getattr(args, "include_target", False))
            caught_all += caught
            if metric is None:  # a table's own loss column, else runs' default metric
                metric = "loss" if Path(str(src)).is_file() else df.attrs.get("metric")
            if not len(df):
                raise InputError(f"{metric}: no usable points: every row was dropped",
                                 path=src, field="loss")
            df.attrs["source"] = str(src)
            tables.append(df)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cmp, fits = compare_points(tables[0], tables[1], metric=metric, form=args.form,
                                       at=at, at_source=at_source, bootstrap=args.bootstrap,
                                       level=args.level, seed=args.seed, **fit_opts)
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
        print(json.dumps(to_jsonable(obj)))
    else:
        from fit.compare import report
        print(report(results, a=args.a, b=args.b))
    if args.out:
        from ladder.io import atomic_write_bytes, staged_dir
        doc = {"schema": "compare/1", "a": str(args.a), "b": str(args.b), "metrics": obj}
        pngs = figures(to_jsonable(doc)) if figures is not None else {}
        with staged_dir(args.out, own=("*.png", "compare.json")) as tmp:
            atomic_write_json(tmp / "compare.json", doc)
            for name, data in pngs.items():
                atomic_write_bytes(tmp / name, data)
        print(f"wrote {args.out}/compare.json" + (f" and {len(pngs)} figure(s)" if pngs else ""),
              file=sys.stderr if args.json else sys.stdout)
    return 0


def _compare_metrics(args) -> list[str]:
    """--metric keys in order, each glob (``bpb/*``) expanded over the columns of A's points
    table (a CSV or Parquet file); none: the table's ``loss`` (or runs' default metric)."""
    import fnmatch
    from pathlib import Path
    keys = list(args.metric or [])
    if not keys:
        return [None]
    out = []
    for k in keys:
        if not any(ch in k for ch in "*?["):
            out.append(k)
            continue
        if not Path(args.a).is_file():
            raise InputError(f"a metric pattern ({k}) needs A to be a points table, whose "
                             "columns it is matched against", path=args.a, field="--metric",
                             exit_code=EX_USAGE)
        from ladder.io import read_table
        cols = [str(c).strip() for c in read_table(args.a).columns]
        hit = [c for c in cols if fnmatch.fnmatchcase(c, k)]
        if not hit:
            raise InputError(f"no column matches {k!r}; columns: {', '.join(cols)}",
                             path=args.a, field="--metric", exit_code=EX_USAGE)
        out += [c for c in hit if c not in out]
    return list(dict.fromkeys(out))
