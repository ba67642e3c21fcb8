"""The points table: load it from CSV/Parquet files, runs directories and W&B runs, drop bad
rows.

Columns (shared/DESIGN.md): ``run, params, active_params, tokens, compute, fraction, loss`` (+
``step, lr`` for curve laws). ``compute`` (flops-v1, no LM head) and ``tokens`` are *so far* at
the point. A runs directory (read by ``sources.runs``) gives every eval row of every rung as a
point, its compute by the one counter (``Rung.compute``).

Several metrics (DESIGN.md): a long table has a ``metric`` column beside ``loss``, a wide one a
loss column per key; ``load_points`` reads one (a long table of several keys is refused without
one). Bad rows (NaN or non-positive numbers, fractions outside (0, 1], duplicates) are dropped,
listed in ``df.attrs["dropped"]`` and warned of.
"""

from __future__ import annotations

import fnmatch
import functools
import math
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from ladder.io import EX_NOINPUT, EX_USAGE, InputError, as_float, read_json, read_table
from ladder.sources.runs import EXCLUDED, read_runs
from ladder.sources.wandb import (WandbHistory, is_wandb_offline_dir, read_api_runs,
                                  read_offline_run)

DEFAULT_METRIC = "eval_dropless/loss"
NUMERIC = ("params", "active_params", "tokens", "compute", "fraction", "loss", "step", "lr")
POSITIVE = ("params", "active_params", "tokens", "compute", "loss")
COLUMNS = ("run", "params", "active_params", "tokens", "compute", "fraction", "loss", "step",
           "lr", "source", "row")
# a wide table's columns that are not metrics (its `loss` is one); a long table's keys are in
# its `metric` column
NOT_METRICS = frozenset(COLUMNS) - {"loss"} | {"metric"}
# the keys of every metrics.jsonl row (DESIGN.md) and W&B's own, which are not metrics either
RUN_NOT_METRICS = frozenset({"step", "tokens", "progress", "time", "_step", "_runtime",
                             "_timestamp"})


def load_points(sources, metric: str | None = None, *, include_incomplete: bool = True,
                include_target: bool = False, sizes: str | Path | None = None,
                wandb_api=None, keymap=None) -> pd.DataFrame:
    """One points table from several sources (CSV/Parquet files, runs directories,
    ``wandb://ENTITY/PROJECT/ID[,ID...]`` URIs, DataFrames). ``metric`` picks the runs' metric
    (default the dropless eval loss) and labels ``loss`` (a table may name its column after
    it). ``sizes`` (CSV or JSON: run, params, active_params): W&B runs without a rung;
    ``wandb_api`` replaces ``wandb.Api()``; ``keymap`` renames another trainer's keys (``--keys``).

    A ladder's target rung is the run the law forecasts: left out unless ``include_target``,
    named in ``df.attrs["left_out"]`` (``LADDER/RUNG``)."""
    if isinstance(sources, (str, Path, pd.DataFrame)):
        sources = [sources]
    requested, metric = metric, metric or DEFAULT_METRIC
    frames, dropped, left_out = [], [], []
    for src in sources:
        frame, notes, targets = None, [], []
        if isinstance(src, pd.DataFrame):  # a table built elsewhere may name its source
            src, targets = _without_targets(src, include_target)
            if len(src) or not targets:
                frame = _table(src.copy(), str(src.attrs.get("source", "<dataframe>")), metric,
                               requested)
        elif isinstance(src, str) and src.startswith("wandb://"):
            known = read_sizes(sizes)  # before the API is asked
            frame, notes = points_from_histories(
                read_api_runs(src, api=wandb_api, field="SOURCE"), metric, known, where=src,
                keymap=keymap)
            frame, targets = _without_targets(frame, include_target)
            frame = frame if len(frame) or not targets else None
        elif not Path(src).exists():
            raise InputError("no such file or directory", path=Path(src), exit_code=EX_NOINPUT)
        elif Path(src).is_dir():
            frame, notes, targets = _runs_dir(Path(src), metric, include_incomplete,
                                              include_target)
        else:
            table = read_table(Path(src))
            frame = _table(keymap.table(table) if keymap else table, str(Path(src)), metric,
                           requested)
        dropped += notes
        left_out += targets
        if frame is not None:
            frames.append(frame)
    if requested is None:  # long tables name their one metric; two different ones never mix
        named = list(dict.fromkeys(f.attrs["long_metric"] for f in frames
                                   if f.attrs.get("long_metric")))
        if len(named) > 1:
            raise InputError(f"the tables hold different metrics ({', '.join(named)}); choose "
                             "one with --metric KEY (or several: --metric KEY --metric KEY)",
                             path=str(sources[0]), field="metric", exit_code=EX_USAGE)
        if named:
            metric = named[0]
    if not frames and left_out:
        raise InputError(f"its only runs are the ladder's target ({', '.join(left_out)}); pass "
                         "--include-target to fit it", path=str(sources[0]))
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    df, bad = _clean(df)
    dropped += bad
    for line in dropped:
        warnings.warn(line, stacklevel=2)
    df.attrs["dropped"] = dropped
    df.attrs["metric"] = metric
    df.attrs["left_out"] = left_out
    return df


def _without_targets(df: pd.DataFrame, include_target: bool) -> tuple[pd.DataFrame, list[str]]:
    """A table without the runs its ``attrs["targets"]`` names: (the table, those runs)."""
    targets = [str(t) for t in df.attrs.get("targets") or []]
    if include_target or not targets or "run" not in df.columns:
        return df, []
    keep = ~df["run"].astype(str).isin(targets)
    out = df[keep].reset_index(drop=True)
    out.attrs = {k: v for k, v in df.attrs.items() if k != "targets"}
    return out, targets


def _table(df: pd.DataFrame, where: str, metric: str, requested: str | None = None
           ) -> pd.DataFrame:
    """One table's rows of ``metric`` in the points-table columns (``requested``: the metric the
    caller named, None: the default): a long table's rows of that key, or a wide one's column
    named after it, else its ``loss``."""
    df.columns = [str(c).strip() for c in df.columns]
    # row numbers as a person counts them in the file: data row 1 is line 2 of a CSV
    rows = np.arange(1, len(df) + 1)
    long_metric = None
    if "metric" in df.columns:
        df, rows, long_metric = _long_rows(df, rows, where, requested)
    elif requested is not None and requested != "loss" and requested in df.columns:
        df = df.drop(columns=["loss"], errors="ignore").rename(columns={requested: "loss"})
    if "loss" not in df.columns:
        if metric in df.columns:
            df = df.rename(columns={metric: "loss"})
        else:
            keys = [] if long_metric else _table_keys(df)
            hint = (f"; choose its metric column{'s' if len(keys) > 1 else ''} with --metric "
                    f"KEY (repeatable; globs allowed): {listed_keys(keys)}"
                    if requested is None and keys else "")
            raise InputError(f"no 'loss' column (nor '{metric}'); columns: "
                             f"{', '.join(df.columns)}{hint}", path=where, field="loss")
    out = pd.DataFrame(index=df.index)
    out["row"] = rows
    out["source"] = where
    out["run"] = (df["run"].astype(str) if "run" in df.columns
                  else [f"{where}#{i}" for i in rows])
    for col in NUMERIC:
        if col in df.columns:
            out[col] = pd.to_numeric(df[col], errors="coerce")
            nonnum = df[col].notna() & out[col].isna()
            if nonnum.all() and len(df):
                raise InputError("column is not numeric", path=where, field=col)
        else:
            out[col] = np.nan
    if "fraction" not in df.columns:
        out["fraction"] = 1.0  # DESIGN.md: fraction defaults to 1.0
    out.attrs["long_metric"] = long_metric
    return out


def _long_rows(df: pd.DataFrame, rows: np.ndarray, where: str, requested: str | None):
    """A long table's rows of one metric key: (rows, their row numbers, the key)."""
    names, keys = _metric_names(df["metric"])
    if requested is None:
        if len(keys) > 1:
            raise InputError(f"its 'metric' column holds {len(keys)} metrics "
                             f"({listed_keys(keys)}); choose with --metric KEY (repeatable; a glob "
                             "such as 'bpb/*' selects several)", path=where, field="metric",
                             exit_code=EX_USAGE)
        if not keys:
            raise InputError("its 'metric' column names no metric", path=where, field="metric")
        requested = keys[0]
    elif requested not in keys:
        raise InputError(f"no rows with metric {requested!r}; its 'metric' column holds "
                         f"{listed_keys(keys) or 'none'}", path=where, field="metric",
                         exit_code=EX_USAGE)
    pick = (names == requested).fillna(False).to_numpy(dtype=bool)
    return df.loc[pick].drop(columns=["metric"]), rows[pick], requested


def listed_keys(keys, most: int = 20) -> str:
    """Keys for a one-line message: the first ``most``, then how many in all."""
    keys = list(keys)
    return ", ".join(keys[:most]) + (f", ... ({len(keys)} in all)" if len(keys) > most else "")


def metric_keys(source, *, keymap=None) -> list[str]:
    """The metric keys a source holds, in order of first appearance: a long table's ``metric``
    values, a wide table's other columns (its ``loss`` included), a runs directory's logged
    keys. W&B runs are not listed: InputError (64)."""
    if isinstance(source, pd.DataFrame):
        return _table_keys(source)
    if str(source).startswith("wandb://") or is_wandb_offline_dir(source):
        raise InputError("a metric pattern is matched against the keys a points table or runs "
                         "directory holds; name W&B metrics exactly", path=str(source),
                         field="--metric", exit_code=EX_USAGE)
    path = Path(source)
    if not path.exists():
        raise InputError("no such file or directory", path=path, exit_code=EX_NOINPUT)
    if path.is_dir():
        keys: dict[str, None] = {}
        for run in read_runs(path):
            for row in run.rows:
                keys.update((k, None) for k in row if k not in RUN_NOT_METRICS)
        return list(keys)
    table = read_table(path)
    return _table_keys(keymap.table(table) if keymap else table)


def _table_keys(df: pd.DataFrame) -> list[str]:
    cols = [str(c).strip() for c in df.columns]
    if "metric" in cols:
        return _metric_names(df[df.columns[cols.index("metric")]])[1]
    return [c for c in cols if c not in NOT_METRICS]


def _metric_names(column: pd.Series) -> tuple[pd.Series, list[str]]:
    """A long table's ``metric`` column stripped, and its distinct non-blank keys."""
    names = column.astype("string").str.strip()
    return names, list(dict.fromkeys(k for k in names.dropna() if k))


def expand_metrics(patterns, sources, *, keymap=None) -> list[str | None]:
    """``--metric`` keys in order, each glob (``bpb/*``) expanded over the keys the sources hold
    (:func:`metric_keys`, in order of first appearance), duplicates dropped; no patterns:
    ``[None]`` (the source's one metric). With several keys, a points table must hold each one
    (a wide table's ``loss`` column is never read as some other key's)."""
    if isinstance(patterns, str):
        patterns = [patterns]
    if isinstance(sources, (str, Path, pd.DataFrame)):
        sources = [sources]
    patterns = [str(p) for p in patterns or []]
    if not patterns:
        return [None]

    @functools.cache
    def keys_held():
        return list(dict.fromkeys(k for s in sources for k in metric_keys(s, keymap=keymap)))

    out: list[str] = []
    for k in patterns:
        if not any(ch in k for ch in "*?["):  # a key, not a glob
            out.append(k)
            continue
        hit = [c for c in keys_held() if fnmatch.fnmatchcase(c, k)]
        if not hit:
            raise InputError(f"no metric key matches {k!r}; the source holds "
                             f"{listed_keys(keys_held()) or 'none'}", path=str(sources[0]),
                             field="--metric", exit_code=EX_USAGE)
        out += hit
    out = list(dict.fromkeys(out))
    if len(out) > 1:
        for s in sources:
            is_table = isinstance(s, pd.DataFrame) or (
                not str(s).startswith("wandb://") and Path(s).is_file())
            if not is_table:
                continue  # runs: a key no run logs is refused by load_points
            have = metric_keys(s, keymap=keymap)
            missing = [k for k in out if k not in have]
            if missing:
                where = (str(s.attrs.get("source", "<dataframe>"))
                         if isinstance(s, pd.DataFrame) else str(s))
                raise InputError(f"holds no metric named {listed_keys(missing)}; it holds "
                                 f"{listed_keys(have) or 'none'}", path=where, field="--metric",
                                 exit_code=EX_USAGE)
    return out


def _runs_dir(root: Path, metric: str, include_incomplete: bool,
              include_target: bool = False):
    """Every run directory at or below ``root`` with a metrics.jsonl (``sources.runs``), to
    points: (table or None when every run is a target, notes, the targets left out)."""
    runs = [r for r in read_runs(root) if r.metrics_path.is_file()]
    if not runs:
        raise InputError("no runs found (no */metrics.jsonl below it)", path=root,
                         exit_code=EX_NOINPUT)
    targets = [] if include_target else [r for r in runs if r.is_target]
    runs = [r for r in runs if include_target or not r.is_target]
    if not runs:
        return None, [], [t.key for t in targets]
    batches, notes = [], []
    for run in runs:
        rd = run.path
        if run.status in EXCLUDED:
            notes.append(f"{rd}: run {run.status}; its points are excluded")
            continue
        if run.status == "running" and not include_incomplete:
            notes.append(f"{rd}: run still running; its points are excluded")
            continue
        if run.config and "rung" not in run.config:
            raise InputError("missing", path=rd / "config.json", field="rung")
        if run.rung is None and not run.summary:
            raise InputError("needs config.json or summary.json beside metrics.jsonl",
                             path=rd)
        batches.append((str(run.metrics_path), point_rows(
            run.rows, metric, run=run.key, source=str(run.metrics_path), params=run.params,
            active_params=run.active_params, compute_of=lambda row, tokens, run=run: (
                None if tokens is None else run.compute_at(tokens)))))
    frame, notes = _concat(batches, notes, metric, where=root)
    return frame, notes, [t.key for t in targets]


def _concat(batches: list[tuple[str, list[dict]]], notes: list[str], metric: str, *, where):
    """One table of the runs' point rows (a note for each run without any)."""
    frames = []
    for src, rows in batches:
        if rows:
            frames.append(pd.DataFrame(rows))
        else:
            notes.append(f"{src}: no rows with '{metric}'")
    if not frames:
        raise InputError(f"no points with metric '{metric}' in any run", path=where,
                         field=metric)
    return pd.concat(frames, ignore_index=True), notes


def point_rows(rows: Iterable[dict], metric: str, *, run: str, source: str,
               params: float | None, active_params: float | None, compute_of) -> list[dict]:
    """The points-table rows of one run's metrics rows, one per row that logs ``metric``;
    ``compute_of(row, tokens)``: the compute so far (None: unknown)."""
    out = []
    for i, row in enumerate(rows, start=1):
        if row.get(metric) is None:
            continue
        tokens = as_float(row.get("tokens"))
        compute = compute_of(row, tokens)
        out.append({"row": i, "source": source, "run": run,
                    "params": math.nan if params is None else float(params),
                    "active_params": math.nan if active_params is None else float(active_params),
                    "tokens": tokens, "compute": math.nan if compute is None else compute,
                    "fraction": as_float(row.get("progress")),
                    "loss": as_float(row.get(metric)),
                    "step": as_float(row.get("step", row.get("_step"))),
                    "lr": as_float(row.get("optim/lr"))})
    return out


def read_sizes(path) -> dict[str, dict]:
    """``--sizes FILE``: run -> {params, active_params}, from a CSV or a JSON list/object."""
    if path is None:
        return {}
    path = Path(path)
    if not path.is_file():
        raise InputError("no such file", path=path, field="--sizes", exit_code=EX_NOINPUT)
    if path.suffix.lower() == ".json":
        obj = read_json(path)
        rows = obj if isinstance(obj, list) else [dict(v, run=k) for k, v in obj.items()
                                                  if isinstance(v, dict)]
    else:
        rows = read_table(path).to_dict("records")
    out = {}
    for i, r in enumerate(rows, start=1):
        for key in ("run", "params", "active_params"):
            if key not in r or (key != "run" and as_float(r[key]) is None):
                raise InputError(f"row {i}: missing or not a number", path=path, field=key)
        out[str(r["run"])] = {"params": float(r["params"]),
                              "active_params": float(r["active_params"])}
    return out


def points_from_histories(runs: Iterable[WandbHistory], metric: str, sizes: dict | None = None,
                          *, where: str = "W&B", keymap=None) -> tuple[pd.DataFrame, list[str]]:
    """The points table of W&B runs and notes on runs without points. A run's sizes and FLOPs
    come from the rung in its config; else ``sizes`` names the run (id or name) or ``keymap``
    finds its ``params`` in its summary or config, and its rows log ``flops``.
    ``attrs["targets"]`` names the target rung's runs."""
    from ladder.specs import Rung  # plain Python; no JAX

    sizes = sizes or {}
    batches, notes, targets = [], [], []
    for h in runs:
        cfg, name = h.config, h.name
        rung = None
        if isinstance(cfg.get("rung"), dict):
            try:
                rung = Rung.from_dict(cfg["rung"])
            except (ValueError, TypeError, KeyError) as e:
                raise InputError(str(e), path=h.where, field="config.rung") from None
            params, active = float(rung.params.total), float(rung.params.active)
            name = f"{rung.ladder}/{rung.name}"
            if rung.is_target:
                targets.append(name)
        elif h.run_id in sizes or name in sizes:
            sz = sizes.get(h.run_id) or sizes[name]
            params, active = sz["params"], sz["active_params"]
        elif keymap is not None and as_float(keymap.value("params", h.summary, h.config)):
            # another trainer's parameter count; active ones only where the map names them
            params = as_float(keymap.value("params", h.summary, h.config))
            active = as_float(keymap.value("active_params", h.summary, h.config)) or math.nan
        else:
            raise _no_sizes(h, name, keymap)
        rows = h.rows if keymap is None else (keymap.row(r) for r in h.rows)
        batches.append((h.where, point_rows(
            rows, metric, run=name, source=h.where, params=params, active_params=active,
            compute_of=lambda row, tokens, rung=rung: (
                rung.compute(tokens) if rung is not None and tokens is not None
                else as_float(row.get("flops"))))))
    frame, notes = _concat(batches, notes, metric, where=where)
    frame.attrs["targets"] = targets
    return frame, notes


def _no_sizes(h: WandbHistory, name: str, keymap) -> InputError:
    """The error of a W&B run without sizes: ``--keys NAME`` where its keys are a built-in
    map's, else ``--sizes``."""
    from ladder.sources.keymap import recognise
    if keymap is None:
        rows = iter(h.rows)
        first = [r for _, r in zip(range(5), rows)]  # the run is refused: reading it is fine
        keys = set(h.config) | set(h.summary) | {k for r in first for k in r}
        found = recognise(keys)
        if found:
            maps, hit = found
            also = f" (or {', '.join(maps[1:])})" if len(maps) > 1 else ""
            return InputError(f"run {name!r}: no rung in its config, and it logs {maps[0]}'s "
                              f"keys ({', '.join(hit)}); read it with --keys {maps[0]}{also}",
                              path=h.where, field="--keys")
    return InputError(f"run {name!r}: no rung in its config; give its sizes with --sizes "
                      f"FILE (run, params, active_params)", path=h.where, field="--sizes")


def _clean(df: pd.DataFrame):
    """Drop and report bad rows: NaN/non-positive required numbers, bad fractions, duplicates."""
    notes = []
    bad = np.zeros(len(df), dtype=bool)
    reasons = [[] for _ in range(len(df))]
    for col in POSITIVE:
        v = df[col].to_numpy(dtype=float)
        present = df[col].notna().any()
        if not present and col != "loss":  # the loss is needed by every law: NaN is dropped
            continue
        with np.errstate(invalid="ignore"):
            b = ~np.isfinite(v) | (v <= 0)
        for i in np.flatnonzero(b):
            reasons[i].append(f"{col}={v[i]!r} (must be a finite positive number)")
        bad |= b
    fr = df["fraction"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        b = ~np.isfinite(fr) | (fr <= 0) | (fr > 1 + 1e-9)
    for i in np.flatnonzero(b):
        reasons[i].append(f"fraction={fr[i]!r} (must be in (0, 1])")
    bad |= b
    key = [c for c in ("run", "fraction", "step", "params", "active_params", "tokens", "compute")
           if df[c].notna().any()]
    dup = df.duplicated(subset=key, keep="first").to_numpy() & ~bad
    for i in np.flatnonzero(dup):
        reasons[i].append("duplicate of an earlier row (same run and point)")
    bad |= dup
    for i in np.flatnonzero(bad):
        notes.append(f"{df['source'].iat[i]}: row {int(df['row'].iat[i])}: dropped: "
                     + "; ".join(reasons[i]))
    return df.loc[~bad].reset_index(drop=True), notes


def offline_run_points(path: str, metric: str | None, sizes, *, keymap=None):
    """The points of a W&B offline run directory (ladder.sources.read_offline_run), as of a
    wandb:// run; with a ``keymap``, its summary too (levanter's parameter count)."""
    df, notes = points_from_histories(
        [read_offline_run(path, summary=keymap is not None)], metric or DEFAULT_METRIC,
        read_sizes(sizes), where=str(path), keymap=keymap)
    for n in notes:
        warnings.warn(n, stacklevel=2)
    df.attrs["source"] = str(path)
    return df
