"""Every metrics reader: run directories (``runs.py``) and the watcher's live sources, each the
shape of :class:`Source` (``base.py``): ``poll()`` gives the rows that arrived since the last
poll, ``position()``/``restore()`` a read position a restarted watcher continues at.

- :class:`JsonlSource` (``jsonl.py``): a metrics.jsonl, tailed by byte offset.
- :class:`CsvSource` (``csv.py``): a CSV, incl. W&B exports.
- :class:`WandbOfflineSource` and :class:`WandbApiSource` (``wandb.py``): a W&B offline run
  directory or ``.wandb`` file, and ``wandb://ENTITY/PROJECT/ID[,ID...]`` through the public API;
  :func:`read_offline_run` and :func:`read_api_runs`: those runs read whole.
- :class:`KeyMappedSource` (``keyed.py``): any of them under another trainer's metric names
  (``keymap.py``); ``batch.py``: rows as columns.

:func:`open_source` picks the source a ``--source`` argument names.
"""

from __future__ import annotations

from pathlib import Path

from ladder.io import EX_NOINPUT, InputError
from ladder.sources.base import Poll, Source, SourceWrapper, check_regular
from ladder.sources.csv import CsvSource
from ladder.sources.jsonl import JsonlSource, parse_lines
from ladder.sources.keyed import KeyMappedSource
from ladder.sources.wandb import (WandbApiSource, WandbHistory, WandbOfflineSource, WandbUri,
                                  is_wandb_offline_dir, read_api_runs, read_offline_run,
                                  read_wandb_records)


def open_source(src: str, *, follow: bool = False, **kw) -> Source:
    """The source for a ``--source`` argument. With ``follow``, a path not there yet is waited
    for, its suffix saying what it will be (``.csv``/``.tsv``, ``.wandb``, else a metrics JSONL;
    no suffix: a run directory, whose ``metrics.jsonl`` is awaited)."""
    if src.startswith("wandb://"):
        return WandbApiSource(src, **kw)
    p = Path(src)
    if not p.exists() and follow:
        suffix = p.suffix.lower()
        if suffix in (".csv", ".tsv"):
            return CsvSource(p)
        if suffix == ".wandb":
            return WandbOfflineSource(p)
        return JsonlSource(p if suffix else p / "metrics.jsonl")
    if not p.exists():
        raise InputError("no such file or directory", path=src, field="--source",
                         exit_code=EX_NOINPUT)
    if p.is_dir():
        if (p / "metrics.jsonl").exists():
            return JsonlSource(p / "metrics.jsonl")
        if is_wandb_offline_dir(p) or (p / "latest-run").exists():
            return WandbOfflineSource(p)
        raise InputError("a directory without metrics.jsonl or a .wandb file", path=src,
                         field="--source")
    check_regular(p)
    if p.suffix == ".wandb":
        return WandbOfflineSource(p)
    if p.suffix.lower() in (".csv", ".tsv"):
        return CsvSource(p)
    return JsonlSource(p)


__all__ = ["CsvSource", "JsonlSource", "KeyMappedSource", "Poll", "Source", "SourceWrapper",
           "WandbApiSource", "WandbHistory", "WandbOfflineSource", "WandbUri",
           "is_wandb_offline_dir", "open_source", "parse_lines", "read_api_runs",
           "read_offline_run", "read_wandb_records"]
