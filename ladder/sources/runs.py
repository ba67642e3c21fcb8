"""The run-directory reader: the one place that finds run directories and reads them.

A run directory (shared/DESIGN.md §3) holds ``config.json`` (run-config: the resolved rung
under ``rung``, the training arguments under ``train``), ``summary.json`` (run-summary: status,
sizes, final metrics) and ``metrics.jsonl``; any of the three makes it a run. The fitter, the
forecaster, the watcher, the report and the curve laws' LR tables all read runs here, so they
agree on which runs there are, what each is called, planned and in what state.

- Discovery: ``root`` itself when it is a run, else the runs up to :data:`MAX_DEPTH` levels
  below it, not descending into a run, ``checkpoints/`` or hidden directories.
- Status: the summary's (:data:`STATUSES`); without one, ``running`` when there are metrics,
  else ``no metrics``. A run does not leave the :data:`ENDED` statuses.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ladder.io import EX_NOINPUT, InputError, as_float, known_schema, read_json, read_metrics

if TYPE_CHECKING:
    import numpy as np

RUN_FILES = ("metrics.jsonl", "summary.json", "config.json")
STATUSES = ("complete", "running", "diverged", "failed")   # what the trainer writes
ENDED = ("complete", "diverged", "failed")
EXCLUDED = ("diverged", "failed")   # a fit, a forecast's references: never from these runs
MAX_DEPTH = 3
# The versions of summary.json and config.json this reader knows (ladder.trainer.rundir writes
# them); a later one is refused by name
SUMMARY_SCHEMAS = ("run-summary/1",)
CONFIG_SCHEMAS = ("run-config/1",)


def is_run_dir(path: str | os.PathLike) -> bool:
    d = Path(path)
    return any(_there(d / f) and not (d / f).is_dir() for f in RUN_FILES)


def find_run_dirs(root: str | os.PathLike, *, max_depth: int = MAX_DEPTH) -> list[Path]:
    """Run directories at or below ``root`` (see the module doc), sorted by path."""
    root = Path(root)
    if is_run_dir(root):
        return [root]
    found = []
    for dirpath, dirnames, _ in os.walk(root):
        d = Path(dirpath)
        depth = len(d.relative_to(root).parts)
        dirnames[:] = sorted(n for n in dirnames if n != "checkpoints" and not n.startswith("."))
        if depth and is_run_dir(d):
            found.append(d)
            dirnames[:] = []
        elif depth >= max_depth:
            dirnames[:] = []
    return sorted(found)


def _plan(key: str, doc: str | None = None) -> property:
    """A planned quantity of a run (float or None), read by :meth:`RunDir._planned`."""
    return property(lambda self: self._planned(key), doc=doc)


@dataclass
class RunDir:
    """One run directory as read: its three files and the rung rebuilt from ``config.json``."""

    path: Path
    config: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
    rung: Any = None            # ladder.specs.Rung when config.json has one
    rows: list[dict] = field(default_factory=list)   # metrics.jsonl, one row per step

    # -- identity ---------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The rung's name: config.json's rung, else the summary's, else the directory's."""
        return str((self.rung.name if self.rung is not None else "")
                   or self.summary.get("rung") or self.path.name)

    @property
    def ladder(self) -> str:
        return str((self.rung.ladder if self.rung is not None else "")
                   or self.summary.get("ladder") or self.path.parent.name)

    @property
    def key(self) -> str:
        """``LADDER/RUNG``: how the points table and the LR tables name the run."""
        return f"{self.ladder}/{self.name}"

    @property
    def is_target(self) -> bool:
        rung = self.config.get("rung") if isinstance(self.config.get("rung"), dict) else {}
        return bool(rung.get("is_target", False) or self.summary.get("is_target") is True)

    @property
    def train(self) -> dict:
        """The ``train`` section of config.json (the trainer's arguments; {} when absent)."""
        t = self.config.get("train")
        return t if isinstance(t, dict) else {}

    # -- status -----------------------------------------------------------------------------------
    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def status(self) -> str:
        s = self.summary.get("status")
        if s in STATUSES:
            return str(s)
        return "running" if self.rows or self.metrics_path.is_file() else "no metrics"

    # -- plan (the summary first, then the rung spec) --------------------------------------------
    def _planned(self, key: str) -> float | None:
        """``key`` from the summary, else the rung's summary; None when neither says."""
        v = as_float(self.summary.get(key))
        if v is not None and math.isfinite(v):
            return v
        if self.rung is not None:
            s = self.rung.summary()
            return as_float(s.get("compute_no_lm_head" if key == "compute" else key))
        return None

    params = _plan("params")
    active_params = _plan("active_params")
    planned_tokens = _plan("tokens")
    compute = _plan("compute", "Planned training FLOPs without the LM head (flops-v1).")
    steps = _plan("steps")

    def planned_steps(self) -> int | None:
        """Planned steps; without a summary or rung, inferred from the last row's progress (else
        the last logged step). None for a run without metrics."""
        s = self.steps
        if s is None:
            prog = [(r["step"], as_float(r.get("progress"))) for r in self.rows]
            prog = [(st, p) for st, p in prog if p]
            if prog:
                s = prog[-1][0] / prog[-1][1]
            elif self.rows:
                s = self.rows[-1]["step"]
        return None if s is None else int(round(s))

    def compute_at(self, tokens):
        """Compute so far at ``tokens`` seen: the one counter when the rung is known, else the
        planned compute scaled by tokens (training FLOPs are linear in tokens, flops-v1); NaN
        when neither is known. A scalar for a scalar."""
        import numpy as np  # not at module level: `ladder list` and `ladder run` import this

        t = np.asarray(tokens, dtype=float)
        if self.rung is not None:
            out = np.array([self.rung.compute(float(x)) for x in t.ravel()]).reshape(t.shape)
        else:
            c, d = self.compute, self.planned_tokens
            out = c * t / d if c is not None and d else np.full(t.shape, np.nan)
        return float(out) if out.ndim == 0 else out

    def lr_table(self) -> np.ndarray | None:
        """The LR of every update as the trainer built it (:mod:`ladder.lrtable`); None without
        a rung."""
        if self.rung is None:
            return None
        from ladder.lrtable import run_lr_table

        return run_lr_table(self.rung, self.train)


def read_run(path: str | os.PathLike, *, metrics: bool = True) -> RunDir:
    """Read one run directory (``metrics=False``: not its rows). A file that is not what it
    claims, or a rung that cannot be rebuilt, is an InputError."""
    path = Path(path)
    if not path.is_dir():
        raise InputError("no such run directory", path=path, exit_code=EX_NOINPUT)
    # a name that is there but not a regular file is read, so refused with one line
    summary = _versioned(path / "summary.json", "run-summary", SUMMARY_SCHEMAS) \
        if _there(path / "summary.json") else {}
    config = _versioned(path / "config.json", "run-config", CONFIG_SCHEMAS) \
        if _there(path / "config.json") else {}
    rung = None
    if isinstance(config.get("rung"), dict):
        from ladder.specs import Rung
        try:
            rung = Rung.from_dict(config["rung"])
        except (ValueError, TypeError, KeyError) as e:
            raise InputError(f"cannot rebuild the rung ({e})", path=path / "config.json",
                             field="rung") from None
    rows = read_metrics(path / "metrics.jsonl") \
        if metrics and _there(path / "metrics.jsonl") else []
    return RunDir(path=path, config=config, summary=summary, rung=rung, rows=rows)


def _versioned(path: Path, kind: str, known: tuple[str, ...]) -> dict:
    """The JSON object of ``path`` when its schema is one of ``known`` (of kind ``kind``)."""
    obj = read_json(path, schema=kind)
    known_schema(obj, known, path=path)
    return obj


def _there(p: Path) -> bool:
    return p.exists() or p.is_symlink()


def read_runs(root: str | os.PathLike, *, metrics: bool = True) -> list[RunDir]:
    """Every run directory at or below ``root`` (:func:`find_run_dirs`), read."""
    root = Path(root)
    if not root.exists():
        raise InputError("no such file or directory", path=root, exit_code=EX_NOINPUT)
    return [read_run(d, metrics=metrics) for d in find_run_dirs(root)]


def read_summary(run_dir: str | os.PathLike) -> dict | None:
    """``summary.json`` of a run being written: None when absent, being replaced, or not a run
    summary (for pollers; :func:`read_run` raises instead). A run summary of a version this
    reader does not know is an InputError (never read as version 1)."""
    f = Path(run_dir) / "summary.json"
    if not f.is_file():
        return None
    try:
        summary = read_json(f, schema="run-summary")
    except InputError:
        return None
    known_schema(summary, SUMMARY_SCHEMAS, path=f)
    return summary


def ended_status(run_dir: str | os.PathLike) -> str | None:
    """The status of a run that has ended (:data:`ENDED`), else None (also when the summary
    cannot be read: not ended as far as we know)."""
    status = (read_summary(run_dir) or {}).get("status")
    return status if status in ENDED else None
