"""Rows of a metrics source as columns (:class:`Batch`): ``step`` plus float columns, NaN where a
key is missing, and masks of values *written* non-finite.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ladder.io import as_float


@dataclass
class Batch:
    """Rows of a metrics source as columns. ``cols[key]`` is float64 with NaN where the row lacks
    the key or its value is non-finite; ``nonfinite[key]`` marks values *written* as NaN/Inf.
    ``configs`` are run configurations seen in the source (checked for applicability); ``notes``
    are human-readable remarks on the input (skipped lines, non-numeric values)."""

    step: np.ndarray
    cols: dict[str, np.ndarray]
    nonfinite: dict[str, np.ndarray] = field(default_factory=dict)
    configs: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.step)

    def col(self, key: str) -> np.ndarray:
        c = self.cols.get(key)
        return c if c is not None else np.full(len(self.step), np.nan)

    @classmethod
    def empty(cls) -> Batch:
        return cls(step=np.zeros(0, dtype=np.int64), cols={})

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping], *, keys: Iterable[str] | None = None,
                  keep=None, nan_tokens: bool = True) -> Batch:
        """Columns from row dicts (as read from JSONL/CSV/W&B). A row with a ``config`` dict is a
        configuration; rows without a numeric ``step`` are skipped with a note. Within the batch
        a repeated step keeps its last row (a resumed run re-logs steps: last one wins).

        ``nan_tokens=False`` is the caller's guarantee that no value was *written* as NaN (the
        source text has no ``NaN`` token or string): then a NaN in a numeric column can only be a
        missing key, and large batches take a columnar path (pandas builds the columns in C;
        about twice as fast as per-key Python loops)."""
        rows_l = rows if isinstance(rows, list) else list(rows)
        if not nan_tokens and len(rows_l) >= 2000:
            b = cls._columns_fast(rows_l, keys, keep)
            if b is not None:
                return b
        configs = [r["config"] for r in rows_l if "config" in r and isinstance(r["config"], dict)]
        notes: list[str] = []
        steps_raw = [r.get("step") for r in rows_l]
        arr, _, _ = _to_float(steps_raw, nonfinite=False)
        ok = np.isfinite(arr)
        if not ok.all():
            is_cfg = np.array(["config" in r and "step" not in r for r in rows_l], dtype=bool)
            no_step = int((~ok & ~is_cfg).sum())
            if no_step:
                notes.append(f"{no_step} row(s) without a numeric 'step' skipped")
            rows_l = [r for r, k in zip(rows_l, ok, strict=True) if k]
        return cls._columns(rows_l, keys, configs, notes, keep)

    @classmethod
    def _columns(cls, rows: list[Mapping], keys, configs, notes, keep=None) -> Batch:
        n = len(rows)
        step = _to_float([r["step"] for r in rows], nonfinite=False)[0].astype(np.int64) if n \
            else np.zeros(0, dtype=np.int64)
        ks = cls._keys(rows, keys, keep) - {"step", "config"}
        cols: dict[str, np.ndarray] = {}
        nonfinite: dict[str, np.ndarray] = {}
        for k in ks:
            _column(k, [r.get(k) for r in rows], cols, nonfinite, notes)
        b = cls(step=step, cols=cols, nonfinite=nonfinite, configs=configs, notes=notes)
        return b.last_wins()

    @classmethod
    def from_columns(cls, c, *, keys: Iterable[str] | None = None, keep=None) -> Batch:
        """:meth:`from_rows` of rows already read as columns (``predict.jsonl_columns.Columns``):
        the same steps, columns, non-finite masks, configurations and notes, except that the keys
        are found in every row rather than in a sample of a large batch."""
        n = c.n
        notes: list[str] = []
        nothing = [None] * n
        arr, _, _ = _to_float(c.values.get("step", nothing), nonfinite=False)
        ok = np.isfinite(arr)
        sel = None
        if not ok.all():
            absent = np.zeros(n, dtype=bool)
            is_cfg = c.present.get("config", absent) & ~c.present.get("step", absent)
            no_step = int((~ok & ~is_cfg).sum())
            if no_step:
                notes.append(f"{no_step} row(s) without a numeric 'step' skipped")
            sel = np.flatnonzero(ok)
        step = arr[ok].astype(np.int64)
        ks: set[str] = set(keys or ())
        if keys is None or keep is not None:
            found = {k for k, p in c.present.items() if (p if sel is None else p[sel]).any()}
            ks |= {k for k in found if keep is None or keep(k)}
        cols: dict[str, np.ndarray] = {}
        nonfinite: dict[str, np.ndarray] = {}
        for k in ks - {"step", "config"}:
            vals = c.values.get(k, nothing)
            if sel is not None:
                vals = [vals[i] for i in sel.tolist()]
            _column(k, vals, cols, nonfinite, notes)
        b = cls(step=step, cols=cols, nonfinite=nonfinite, configs=list(c.configs), notes=notes)
        return b.last_wins()

    @classmethod
    def _columns_fast(cls, rows: list[Mapping], keys, keep) -> Batch | None:
        """The columnar path of :meth:`from_rows` (no written NaN in ``rows``); None when the rows
        need the general path (configuration rows, a non-numeric ``step``)."""
        import pandas as pd
        if any("config" in r for r in rows):
            return None
        ks = cls._keys(rows, keys, keep)
        names = ["step"] + sorted(ks - {"step", "config"})
        df = pd.DataFrame.from_records(rows, columns=names)
        st = df["step"]
        if st.dtype.kind not in "iuf":
            return None
        stepf = st.to_numpy(dtype=float)
        ok = np.isfinite(stepf)
        notes: list[str] = []
        if not ok.all():  # rare: the general path, on the rows with a step
            notes.append(f"{int((~ok).sum())} row(s) without a numeric 'step' skipped")
            kept = [r for r, k in zip(rows, ok, strict=True) if k]
            b = cls._columns_fast(kept, keys, keep) if kept else None
            if b is None:
                return None
            b.notes = notes + b.notes
            return b
        cols: dict[str, np.ndarray] = {}
        nonfinite: dict[str, np.ndarray] = {}
        for k in names[1:]:
            c = df[k]
            if c.dtype.kind in "iufb":
                arr = c.to_numpy(dtype=float)  # NaN here = key missing (no NaN was written)
                nf = np.isinf(arr)             # 1e999 parses to inf: written non-finite
            else:  # mixed types: the general conversion, with missing keys as None
                vals = [None if isinstance(v, float) and v != v else v for v in c.tolist()]
                arr, bad, nf = _to_float(vals)
                if bad:
                    notes.append(f"{bad} non-numeric value(s) of '{k}' ignored")
            if nf.any():
                nonfinite[k] = nf
                arr = np.where(np.isfinite(arr), arr, np.nan)
            cols[k] = arr
        return cls(step=stepf.astype(np.int64), cols=cols, nonfinite=nonfinite, configs=[],
                   notes=notes).last_wins()

    @staticmethod
    def _keys(rows: list[Mapping], keys, keep) -> set[str]:
        n = len(rows)
        ks: set[str] = set(keys or ())
        if keys is None or keep is not None:
            # discover keys: all rows when few, else a sample (key sets of a run barely change)
            sample = rows if n <= 5000 else rows[:1000] + rows[1000::97] + rows[-1000:]
            for r in sample:
                ks.update(r.keys())
            if keep is not None:
                ks = {k for k in ks if keep(k)} | set(keys or ())
        return ks

    def last_wins(self) -> Batch:
        """Keep the last row of each repeated step; rows in step order."""
        n = len(self.step)
        if n < 2 or (np.diff(self.step) > 0).all():
            return self
        # index of the last occurrence of each step
        rev = self.step[::-1]
        _, first_in_rev = np.unique(rev, return_index=True)
        keep = n - 1 - first_in_rev  # np.unique sorts by step
        return self.take(keep)

    def take(self, idx: np.ndarray) -> Batch:
        return Batch(step=self.step[idx], cols={k: v[idx] for k, v in self.cols.items()},
                     nonfinite={k: v[idx] for k, v in self.nonfinite.items()},
                     configs=self.configs, notes=self.notes)


@dataclass(frozen=True)
class KeyFilter:
    """Which row keys the rules read (picklable, for parallel parsing)."""

    fixed: frozenset
    prefixes: tuple = ("params/norm/",)

    def __call__(self, k: str) -> bool:
        return k in self.fixed or k.startswith(self.prefixes)


def concat_batches(batches: list[Batch]) -> Batch:
    """One batch from consecutive ones (missing columns NaN, missing masks False)."""
    batches = [b for b in batches if b is not None]
    if not batches:
        return Batch.empty()
    keys = sorted({k for b in batches for k in b.cols})
    nf_keys = sorted({k for b in batches for k in b.nonfinite})
    step = np.concatenate([b.step for b in batches])
    cols = {k: np.concatenate([b.cols.get(k, np.full(len(b), np.nan)) for b in batches])
            for k in keys}
    nonfinite = {k: np.concatenate([b.nonfinite.get(k, np.zeros(len(b), bool)) for b in batches])
                 for k in nf_keys}
    out = Batch(step=step, cols=cols, nonfinite=nonfinite,
                configs=[c for b in batches for c in b.configs],
                notes=[n for b in batches for n in b.notes])
    return out.last_wins()


def _column(k: str, vals: list, cols: dict, nonfinite: dict, notes: list) -> None:
    """Column ``k`` of a batch from its row values (None: missing), with its non-finite mask and
    a note on the values that are not numbers."""
    arr, bad, nf = _to_float(vals)
    if bad:
        notes.append(f"{bad} non-numeric value(s) of '{k}' ignored")
    if not np.isfinite(arr).all() or nf.any():
        arr = np.where(np.isfinite(arr), arr, np.nan)
    cols[k] = arr
    if nf.any():
        nonfinite[k] = nf


def _to_float(vals: list, *, nonfinite: bool = True) -> tuple[np.ndarray, int, np.ndarray]:
    """Float array (NaN: missing/invalid), count of non-numeric values, written-non-finite mask."""
    n = len(vals)
    try:
        arr = np.array(vals, dtype=np.float64)  # None -> NaN, "NaN"/"Infinity" strings parse
        bad = 0
    except (TypeError, ValueError):
        out = np.empty(n, dtype=np.float64)
        bad = 0
        for i, v in enumerate(vals):
            f = as_float(v)
            if f is None:
                out[i] = np.nan
                if v is not None:
                    bad += 1
            else:
                out[i] = f
        arr = out
    nf = ~np.isfinite(arr)
    if not nonfinite:
        return arr, bad, nf
    if nf.any():
        # written non-finite: not missing (None) and parsed to NaN/Inf
        idx = np.flatnonzero(nf)
        for i in idx:
            v = vals[i]
            if v is None or as_float(v) is None:
                nf[i] = False
    return arr, bad, nf
