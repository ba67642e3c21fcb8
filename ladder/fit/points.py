"""The points table: load it from CSV/Parquet files and/or runs directories, drop bad rows.

Columns (shared/DESIGN.md): ``run, params, active_params, tokens, compute, fraction, loss`` (+
``step, lr`` for schedule-aware curve laws). ``compute`` and ``tokens`` are *so far* at the point;
``compute`` is flops-v1 training FLOPs without the LM head. A runs directory (``RUNS/<ladder>/
<rung>/`` with config.json, summary.json, metrics.jsonl; found and read by ``sources.runs``, the
reader the forecaster and the report use) is converted to the same table: every
eval row of every rung becomes a point with its progress fraction, compute counted by the one
counter (``Rung.compute(tokens_so_far)``).

Several metrics in one table (DESIGN.md): long form, a ``metric`` column naming each row's key
beside its ``loss``; or wide form, one loss column per key. ``load_points`` reads one metric:
the rows of a long table whose ``metric`` is that key (a long table holding several keys is
refused without one, never read as one law), or a wide table's column of that name.
:func:`metric_keys` lists the keys a source holds and :func:`expand_metrics` expands ``--metric``
globs over them.

Bad rows (NaN or non-positive numbers, fractions outside (0, 1], duplicates) are dropped and
reported with their row numbers in ``df.attrs["dropped"]`` (a list of one-line strings) and by
``warnings.warn``.
"""

from __future__ import annotations

import fnmatch
import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ladder.io import EX_NOINPUT, EX_USAGE, InputError, as_float, read_json, read_table
from ladder.sources.runs import EXCLUDED, read_runs

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
    """One points table from several sources (paths to CSV/Parquet files or runs directories,
    ``wandb://ENTITY/PROJECT/ID[,ID...]`` URIs, or DataFrames). ``metric`` picks the metric of runs
    (default the dropless eval loss) and labels the table's ``loss`` column (a table without
    ``loss`` may carry a column named after the metric instead). ``sizes`` (CSV or JSON: run,
    params, active_params) gives the sizes of W&B runs whose configs lack a rung; ``wandb_api``
    replaces ``wandb.Api()`` (tests). ``keymap`` (a ``sources.keymap.KeyMap``) renames another
    trainer's keys in W&B histories and table columns to ours (``--keys``).

    A run of a ladder's target rung (its rung's ``is_target``: ``ladder run`` trains it beside
    the rungs; a run directory's config.json, or a W&B run's config, whose points table names it
    in ``attrs["targets"]``) is the run the law forecasts, not a point to fit: it is left out
    unless ``include_target``, and ``df.attrs["left_out"]`` names it (``LADDER/RUNG``)."""
    if isinstance(sources, (str, Path, pd.DataFrame)):
        sources = [sources]
    requested, metric = metric, metric or DEFAULT_METRIC
    frames, dropped, left_out = [], [], []
    for src in sources:
        if isinstance(src, pd.DataFrame):  # a table built elsewhere may name its source
            src, targets = _without_targets(src, include_target)
            left_out += targets
            if len(src) or not targets:
                frames.append(_table(src.copy(), str(src.attrs.get("source", "<dataframe>")),
                                     metric, requested))
            continue
        if isinstance(src, str) and src.startswith("wandb://"):
            frame, notes = _wandb_runs(src, metric, read_sizes(sizes), wandb_api, keymap)
            frame, targets = _without_targets(frame, include_target)
            dropped += notes
            left_out += targets
            if len(frame) or not targets:
                frames.append(frame)
            continue
        path = Path(src)
        if not path.exists():
            raise InputError("no such file or directory", path=path, exit_code=EX_NOINPUT)
        if path.is_dir():
            frame, notes, targets = _runs_dir(path, metric, include_incomplete,
                                              include_target)
            dropped += notes
            left_out += targets
            if frame is not None:
                frames.append(frame)
        else:
            table = _read_table(path)
            frames.append(_table(keymap.table(table) if keymap else table, str(path), metric,
                                 requested))
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
    """W&B runs' points (:func:`points_from_histories`) without the target rung's run, as a
    runs directory leaves it out: (the table, the runs left out)."""
    targets = [str(t) for t in df.attrs.get("targets") or []]
    if include_target or not targets or "run" not in df.columns:
        return df, []
    keep = ~df["run"].astype(str).isin(targets)
    out = df[keep].reset_index(drop=True)
    out.attrs = {k: v for k, v in df.attrs.items() if k != "targets"}
    return out, targets


def _read_table(path: Path) -> pd.DataFrame:
    return read_table(path)


def _table(df: pd.DataFrame, where: str, metric: str, requested: str | None = None
           ) -> pd.DataFrame:
    """One table's rows of ``metric`` in the points-table columns. ``requested``: the metric the
    caller named (None: the default, ``metric``). A long table (a ``metric`` column) gives the
    rows of that key, with their row numbers in the file; a wide one the column named after the
    requested metric, else its ``loss`` column (the metric a label)."""
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
            keys = [] if long_metric else _table_keys(df, where)
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
    """A long table's rows of one metric key: (rows, their row numbers, the key). Without a
    requested key the table must hold one; several are refused (exit 64), never fitted as one."""
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


def _is_pattern(key: str) -> bool:
    return any(ch in key for ch in "*?[")


def metric_keys(source, *, keymap=None) -> list[str]:
    """The metric keys a source holds, in order of first appearance: a long table's ``metric``
    values, a wide table's columns but the points table's own (its ``loss`` included), the keys
    logged in a runs directory's metrics.jsonl files but step, tokens, progress and time.
    ``keymap`` renames a table's columns as :func:`load_points` does. W&B runs are not listed
    (their keys live behind the API, or in a record log read above fit): InputError (64)."""
    if isinstance(source, pd.DataFrame):
        return _table_keys(source, str(source.attrs.get("source", "<dataframe>")))
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
    table = _read_table(path)
    return _table_keys(keymap.table(table) if keymap else table, str(path))


def _table_keys(df: pd.DataFrame, where: str) -> list[str]:
    cols = [str(c).strip() for c in df.columns]
    if "metric" in cols:
        return _metric_names(df[df.columns[cols.index("metric")]])[1]
    return [c for c in cols if c not in NOT_METRICS]


def _metric_names(column: pd.Series) -> tuple[pd.Series, list[str]]:
    """A long table's ``metric`` column stripped, and its distinct keys in order of first
    appearance (blanks left out)."""
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
    held = None

    def keys_held():
        nonlocal held
        if held is None:
            held = list(dict.fromkeys(k for s in sources
                                      for k in metric_keys(s, keymap=keymap)))
        return held

    out: list[str] = []
    for k in patterns:
        if not _is_pattern(k):
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
    """Every run directory at or below ``root`` that has a metrics.jsonl (``sources.runs``: the
    discovery and status rules the forecaster and the report use too), to points: (table or
    None when every run is a target left out, notes, the targets left out)."""
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
    """One table of the runs' point rows (a note for each run without any); InputError when no
    run has a point."""
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
    """The points-table rows of one run's metrics rows (a run directory's metrics.jsonl or a W&B
    history): one per row that logs ``metric``, with its line number, progress, step (W&B's
    ``_step`` when no ``step`` is logged) and LR. ``compute_of(row, tokens)`` gives the compute
    so far (None: unknown)."""
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
        rows = _read_table(path).to_dict("records")
    out = {}
    for i, r in enumerate(rows, start=1):
        for key in ("run", "params", "active_params"):
            if key not in r or (key != "run" and as_float(r[key]) is None):
                raise InputError(f"row {i}: missing or not a number", path=path, field=key)
        out[str(r["run"])] = {"params": float(r["params"]),
                              "active_params": float(r["active_params"])}
    return out


def _wandb_runs(uri: str, metric: str, sizes: dict, api, keymap=None):
    """Points of W&B runs (``wandb://ENTITY/PROJECT/ID,ID...``) from their histories through the
    public API (:func:`points_from_histories` turns them into the table)."""
    body = uri[len("wandb://"):].strip("/").split("/")
    if len(body) != 3 or not all(body):
        raise InputError(f"expected wandb://ENTITY/PROJECT/ID[,ID...], got {uri!r}",
                         field="SOURCE", exit_code=64)
    entity, project, ids = body[0], body[1], [i for i in body[2].split(",") if i.strip()]
    if api is None:
        try:
            import wandb
            api = wandb.Api(timeout=30)
        except Exception as e:  # noqa: BLE001 - no network, no login, no wandb: one clear line
            raise InputError(f"cannot reach the W&B API ({type(e).__name__}: {e})", path=uri,
                             exit_code=69) from None
    runs = []
    for rid in ids:
        where = f"wandb://{entity}/{project}/{rid}"
        try:
            run = api.run(f"{entity}/{project}/{rid}")
        except Exception as e:  # noqa: BLE001
            raise InputError(f"W&B run not readable ({type(e).__name__}: {e})", path=where,
                             exit_code=69) from None
        runs.append(WandbHistory(where=where, run_id=rid,
                                 name=str(getattr(run, "name", None) or rid),
                                 config=dict(getattr(run, "config", {}) or {}),
                                 rows=run.scan_history(page_size=1000),
                                 summary=_summary(run)))
    return points_from_histories(runs, metric, sizes, where=uri, keymap=keymap)


def _summary(run) -> dict:
    """A W&B run's summary as a dict ({} when the API object has none)."""
    try:
        return dict(getattr(run, "summary", None) or {})
    except (TypeError, ValueError):
        return {}


@dataclass
class WandbHistory:
    """One W&B run as the points builder needs it: where it came from, its id and name, its
    config and its history rows (dicts with ``_step`` and the logged keys)."""

    where: str
    run_id: str
    name: str
    config: dict
    rows: Iterable
    summary: dict = field(default_factory=dict)  # W&B summary values (e.g. parameter_count)


def points_from_histories(runs: Iterable[WandbHistory], metric: str, sizes: dict | None = None,
                          *, where: str = "W&B", keymap=None) -> tuple[pd.DataFrame, list[str]]:
    """The points table of W&B runs: the rung in a run's config (a `ladder run --wandb` run) gives
    its sizes and FLOPs (the one counter); otherwise ``sizes`` must name the run (by id or name),
    or a ``keymap`` find its ``params`` in the run's summary or config (levanter's
    ``parameter_count``), and its rows must log ``flops``. ``keymap`` renames the rows' keys to
    ours. Returns the table and notes on runs without points; ``attrs["targets"]`` names the runs
    of a target rung (:func:`load_points` leaves them out unless asked)."""
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
            # another trainer's run: its own parameter count (every parameter: `params`);
            # active parameters only when the map names them (a dense run: unknown, NaN)
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
    """The error of a W&B run without sizes: another trainer's run (its keys are a built-in key
    map's) is told to pass ``--keys NAME``; any other run to give ``--sizes``."""
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


def is_wandb_offline_dir(path) -> bool:
    """A W&B offline run directory (or the ``wandb/`` folder above runs): a ``.wandb`` record file
    in it, in ``latest-run/`` or one level down, and no metrics.jsonl (a run directory wins)."""
    p = Path(path)
    if not p.is_dir() or (p / "metrics.jsonl").exists():
        return False
    return bool(list(p.glob("*.wandb")) or list(p.glob("*/*.wandb")))


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
    """The points of a W&B offline run directory: the record log read by ladder.sources, the
    table built like that of a wandb:// run. With a ``keymap`` (another trainer's
    names), the run's summary records are read too: levanter logs its parameter count there."""
    import warnings

    from ladder.sources import WandbOfflineSource

    src = WandbOfflineSource(path)
    run_id = src.record_file().stem.removeprefix("run-")
    rows, configs = [], []
    while True:  # the log is decoded in slices (ladder.sources.wandb.POLL_BYTES a poll)
        got = src.poll()
        rows += got.rows
        configs += got.configs
        if not got.more:
            break
    config = configs[0] if configs else {}
    summary = _offline_summary(src) if keymap is not None else {}
    df, notes = points_from_histories(
        [WandbHistory(where=str(path), run_id=run_id, name=run_id, config=config,
                      rows=rows, summary=summary)], metric or DEFAULT_METRIC,
        read_sizes(sizes), where=str(path), keymap=keymap)
    for n in notes:
        warnings.warn(n, stacklevel=2)
    df.attrs["source"] = str(path)
    return df


def _offline_summary(src) -> dict:
    """The summary values of a W&B offline run (its ``summary`` records, later ones win)."""
    import json

    from ladder.sources import read_wandb_records

    out: dict = {}
    for _, f in src.segments():
        for rec in read_wandb_records(f, full=True):
            if rec.get("type") != "summary":
                continue
            for item in (rec.get("summary") or {}).get("update") or []:
                key = item.get("key") or "/".join(item.get("nested_key") or [])
                try:
                    out[key] = json.loads(item.get("value_json", "null"))
                except ValueError:
                    continue
    return out
