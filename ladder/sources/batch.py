"""Rows of a metrics source as columns (:class:`Batch`): ``step`` plus float columns, NaN where a
key is missing, and masks of values *written* non-finite.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ladder.io import MAX_STEP, as_float


def _is_step(a: np.ndarray) -> np.ndarray:
    """Where ``a`` holds a step as :func:`ladder.io.step_of` reads one: an integral number in
    ``[0, MAX_STEP]`` (2.5, -1 or 1e20 is none; cast to int64 they would be another step)."""
    with np.errstate(invalid="ignore"):
        return np.isfinite(a) & (a >= 0) & (a <= MAX_STEP) & (a == np.floor(a))


@dataclass
class Batch:
    """``cols[key]``: float64, NaN where the row lacks the key or its value is non-finite;
    ``nonfinite[key]`` marks values *written* as NaN/Inf. ``configs``: run configurations seen;
    ``notes``: remarks on the input (skipped rows, non-numeric values)."""

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
                  keep=None) -> Batch:
        """Columns from row dicts. A row with a ``config`` dict is a configuration; rows without
        a numeric ``step`` are skipped with a note; a repeated step keeps its last row (a resumed
        run re-logs steps). Rows in runs of one shape go the fast way (:meth:`_columns_fast`),
        to the same numbers, masks and notes as the general one."""
        rows_l = rows if isinstance(rows, list) else list(rows)
        if len(rows_l) >= 64:
            b = cls._columns_fast(rows_l, keys, keep)
            if b is not None:
                return b
        return cls._from_rows_general(rows_l, keys, keep)

    @classmethod
    def _from_rows_general(cls, rows_l: list[Mapping], keys, keep) -> Batch:
        """:meth:`from_rows`, one value at a time (any mix of keys and value types)."""
        configs = [r["config"] for r in rows_l if "config" in r and isinstance(r["config"], dict)]
        notes: list[str] = []
        arr, _, _ = _to_float([r.get("step") for r in rows_l], nonfinite=False)
        ok = _is_step(arr)
        if not ok.all():
            is_cfg = np.array(["config" in r and "step" not in r for r in rows_l], dtype=bool)
            no_step = int((~ok & ~is_cfg).sum())
            if no_step:
                notes.append(f"{no_step} row(s) without a step (an integer 0..2**53) skipped")
            rows_l = [r for r, k in zip(rows_l, ok, strict=True) if k]
        cols: dict[str, np.ndarray] = {}
        nonfinite: dict[str, np.ndarray] = {}
        for k in cls._keys(rows_l, keys, keep) - {"step", "config"}:
            _column(k, [r.get(k) for r in rows_l], cols, nonfinite, notes)
        return cls(step=arr[ok].astype(np.int64), cols=cols, nonfinite=nonfinite,
                   configs=configs, notes=notes).last_wins()

    @classmethod
    def _columns_fast(cls, rows: list[Mapping], keys, keep) -> Batch | None:
        """:meth:`from_rows` for rows in runs of one shape (a trainer writes the same keys in the
        same order on every line): per run, every wanted value in one pass in C (``itemgetter``,
        ``np.fromiter``), ~2.5x a pass per key (bench/watch_follow_speed.py). Within a run every
        row has every key, so a non-finite value was written so. None (the general path) for
        configuration rows, many short runs, or a value that is not a number."""
        from itertools import chain, compress
        from operator import itemgetter, ne
        n = len(rows)
        # runs of rows with one key set: where a row's keys differ from the row before (key
        # views compare in C; orjson shares the key strings)
        try:
            ks_of = list(map(dict.keys, rows))
        except TypeError:  # a row that is not a dict (a Mapping of another kind)
            return None
        starts = [0] + list(compress(range(1, n), map(ne, ks_of[1:], ks_of[:-1])))
        del ks_of
        if len(starts) > max(8, n // 64):
            return None
        every = set().union(*(rows[a].keys() for a in starts))
        if "config" in every:
            return None
        found = set().union(*(rows[a].keys() for a in starts if "step" in rows[a]))
        ks = set(keys or ())
        if keys is None or keep is not None:
            ks |= {k for k in found if keep is None or keep(k)}
        ks = (ks - {"config"}) | {"step"}
        cols = {k: np.full(n, np.nan) for k in ks}
        written = {}  # key -> mask of values written non-finite
        ends = starts[1:] + [n]
        try:
            for a, e in zip(starts, ends):
                present = [k for k in rows[a] if k in cols]
                if not present:
                    continue
                run = rows[a:e]
                get = itemgetter(*present)
                vals = chain.from_iterable(map(get, run)) if len(present) > 1 else map(get, run)
                m = np.fromiter(vals, float, (e - a) * len(present)).reshape(e - a,
                                                                            len(present))
                for c, k in enumerate(present):
                    col = m[:, c]
                    cols[k][a:e] = col
                    bad = ~np.isfinite(col)
                    if bad.any() and k != "step":
                        written.setdefault(k, np.zeros(n, bool))[a:e] = bad
        except (TypeError, ValueError, OverflowError):  # a string, a null...: the general path
            return None
        stepf = cols.pop("step")
        ok = _is_step(stepf)
        notes: list[str] = []
        for k, nf in written.items():
            cols[k][nf] = np.nan
        if not ok.all():
            notes.append(f"{int((~ok).sum())} row(s) without a step (an integer 0..2**53) skipped")
            stepf = stepf[ok]
            cols = {k: v[ok] for k, v in cols.items()}
            written = {k: nf[ok] for k, nf in written.items()}
        nonfinite = {k: nf for k, nf in written.items() if nf.any()}
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
    """Which row keys the rules read."""

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
    """Column ``k`` from its row values (None: missing), its non-finite mask, and a note on the
    values that are not numbers."""
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
    bad = 0
    try:
        arr = np.array(vals, dtype=np.float64)  # None -> NaN, "NaN"/"Infinity" strings parse
        if arr.ndim != 1:  # lists of one length, one a row: not numbers (a 2-D column had
            raise ValueError("not one number a row")  # crashed concat_batches)
    except (TypeError, ValueError):
        fs = [as_float(v) for v in vals]
        bad = sum(f is None and v is not None for f, v in zip(fs, vals, strict=True))
        arr = np.array(fs, dtype=np.float64)  # None -> NaN
    nf = ~np.isfinite(arr)
    if not nonfinite:
        return arr, bad, nf
    for i in np.flatnonzero(nf):  # written non-finite: not missing (None) and parsed to NaN/Inf
        if vals[i] is None or as_float(vals[i]) is None:
            nf[i] = False
    return arr, bad, nf
