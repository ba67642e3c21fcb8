"""Another trainer's metric names mapped to this project's (`ladder fit|watch --keys ...`).

The fitter and the watcher read the keys of shared/DESIGN.md section 3 (``tokens``, ``flops``,
the metric...); another trainer logs them under its own names, a key map says which and by what
factor (levanter logs GFLOPs). Built-in maps are data (``sources/keymaps/levanter.toml``,
``marin.toml``, each citing its trainer); ``--keys FILE.toml`` takes a team's own::

    schema = "keymap/1"
    name = "mytrainer"
    [keys]
    tokens = "tokens_seen"                       # ours = theirs
    flops = { from = "total_gflops", scale = 1e9 }

A mapped key takes the trainer's key's value (scaled) wherever it is in a row; every other key
passes unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from ladder.io import EX_USAGE, InputError, as_float

SCHEMA = "keymap/1"
BUILTIN_DIR = "keymaps"
BUILTIN = ("levanter", "marin")
# what a points table (fit's input) calls the quantities a metrics row calls otherwise
TABLE_NAMES = {"flops": "compute", "progress": "fraction"}
# a scale is a unit's factor: SI prefixes atto (1e-18) to exa (1e18) hold every unit a trainer
# logs a count in (levanter's GFLOPs: 1e9)
SCALE_RANGE = (1e-18, 1e18)
MAX_BYTES = 1 << 20  # a key map is a few lines; a larger file is not one


@dataclass(frozen=True)
class KeyMap:
    """``entries``: (our key, the trainer's key, scale) triples."""

    name: str
    entries: tuple[tuple[str, str, float], ...]

    def __post_init__(self):
        ours = [o for o, _, _ in self.entries]
        theirs = [t for _, t, _ in self.entries]
        for what, keys in (("our key", ours), ("trainer key", theirs)):
            dup = {k for k in keys if keys.count(k) > 1}
            if dup:
                raise ValueError(f"keys: {what} {sorted(dup)[0]!r} mapped twice")

    @property
    def theirs(self) -> dict[str, tuple[str, float]]:
        """our key -> (the trainer's key, scale)."""
        return {o: (t, s) for o, t, s in self.entries}

    def to_dict(self) -> dict:
        return {"name": self.name,
                "keys": {o: ({"from": t, "scale": s} if s != 1 else t)
                         for o, t, s in self.entries}}

    def describe(self) -> str:
        return f"{self.name} (" + ", ".join(
            f"{o} <- {t}" + (f" x {s:g}" if s != 1 else "") for o, t, s in self.entries) + ")"

    # ---------------------------------------------------------------------- rows and columns
    def row(self, row: dict) -> dict:
        """A metrics row with our keys (the trainer's keys stay beside them)."""
        out = dict(row)
        for o, t, s in self.entries:
            if t in row:
                out[o] = scaled(row[t], s)
        return out

    def value(self, key: str, *where: dict) -> Any:
        """Our ``key`` in the first of ``where`` that has it, by our name, else the trainer's
        (scaled); None when absent."""
        t, s = self.theirs.get(key, (key, 1.0))
        for d in where:
            if isinstance(d, dict):
                if key in d:
                    return d[key]
                if t in d:
                    return scaled(d[t], s)
        return None

    def source_keys(self, keys) -> list[str]:
        """The trainer's names of ``keys`` (ours): what a source must read for them."""
        th = self.theirs
        return [th[k][0] if k in th else k for k in keys]

    def batch(self, b):
        """A ``ladder.predict.watch.Batch`` read under the trainer's names, with ours (scaled)."""
        cols, nonfinite = dict(b.cols), dict(b.nonfinite)
        for o, t, s in self.entries:
            if t in b.cols:
                cols[o] = b.cols[t] * s if s != 1 else b.cols[t]
            if t in b.nonfinite:
                nonfinite[o] = b.nonfinite[t]
        b.cols, b.nonfinite = cols, nonfinite
        return b

    def table(self, df):
        """A points table (pandas) whose columns carry the trainer's names, renamed to ours
        (``flops`` is a table's ``compute``, ``progress`` its ``fraction``), values scaled."""
        df = df.copy()
        for o, t, s in self.entries:
            if t in df.columns:
                name = TABLE_NAMES.get(o, o)
                col = df[t]
                if s != 1:
                    import pandas as pd
                    col = pd.to_numeric(col, errors="coerce") * s
                df[name] = col
        return df


def recognise(keys) -> tuple[list[str], list[str]] | None:
    """The built-in key maps whose trainer keys ``keys`` (a run's keys) hold the most of (all
    that tie), with those keys; None when they hold none."""
    keys = set(keys)
    found: dict[str, list[str]] = {}
    for name in BUILTIN:
        km = load_keymap(name)
        found[name] = sorted(t for _, t, _ in km.entries if t in keys and t not in km.theirs)
    most = max(len(v) for v in found.values())
    if not most:
        return None
    names = [n for n, v in found.items() if len(v) == most]
    return names, found[names[0]]


def scaled(v: Any, s: float) -> Any:
    """``v`` times ``s`` when it is a number (a NaN string stays what it is)."""
    if s == 1 or isinstance(v, bool):
        return v
    x = as_float(v)
    return v if x is None or not math.isfinite(x) else x * s


def load_keymap(spec: str | None) -> KeyMap | None:
    """``--keys``: None (no map), a built-in name (``levanter``, ``marin``) or a TOML file."""
    if spec is None or spec == "":
        return None
    if spec in BUILTIN:
        from importlib.resources import files
        return _read(Path(str(files("ladder.sources") / BUILTIN_DIR / f"{spec}.toml")))
    path = Path(spec)
    if not path.suffix and not path.exists():
        raise InputError(f"unknown key map {spec!r}; built-in: {', '.join(BUILTIN)}, or a "
                         f"FILE.toml", field="--keys", exit_code=EX_USAGE)
    return _read(path)


def _read(path: Path) -> KeyMap:
    from ladder.io import read_bytes
    raw = read_bytes(path, field="--keys", limit=MAX_BYTES)
    try:
        obj = tomllib.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"not valid TOML: {e}", path=path) from None
    except RecursionError:  # tomllib parses nested arrays/tables recursively
        raise InputError("not a key map: nested too deeply", path=path) from None
    try:
        return parse_keymap(obj, default_name=path.stem)
    except ValueError as e:
        field, _, message = str(e).partition(": ")
        raise InputError(message, path=path, field=field) from None


def parse_keymap(obj: Any, *, default_name: str = "keymap") -> KeyMap:
    """A key map from its TOML/JSON object; ValueError 'field: message' when malformed."""
    if not isinstance(obj, dict):
        raise ValueError("keys: expected a table")
    schema = obj.get("schema", SCHEMA)
    if schema != SCHEMA:
        raise ValueError(f"schema: expected {SCHEMA!r}, got {schema!r}")
    unknown = set(obj) - {"schema", "name", "keys"}
    if unknown:
        raise ValueError(f"{sorted(unknown)[0]}: unknown field (expected schema, name, keys)")
    name = obj.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise ValueError("name: expected a non-empty string")
    keys = obj.get("keys")
    if not isinstance(keys, dict) or not keys:
        raise ValueError("keys: expected a table of our key = the trainer's key")
    entries = []
    for ours, v in keys.items():
        where = f"keys.{ours}"
        if isinstance(v, str):
            theirs, scale = v, 1.0
        elif isinstance(v, dict):
            extra = set(v) - {"from", "scale"}
            if extra:
                raise ValueError(f"{where}.{sorted(extra)[0]}: unknown field (expected from, "
                                 f"scale)")
            theirs, scale = v.get("from"), v.get("scale", 1.0)
        else:
            raise ValueError(f"{where}: expected a key name or {{from, scale}}")
        if not isinstance(theirs, str) or not theirs:
            raise ValueError(f"{where}: expected a non-empty key name")
        lo, hi = SCALE_RANGE
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or \
                not (math.isfinite(scale) and lo <= scale <= hi):
            raise ValueError(f"{where}.scale: expected a number in [{lo:g}, {hi:g}] (a unit's "
                             f"factor), got {str(scale)[:40]!r}")
        if not ours or ours == "step":
            raise ValueError(f"{where}: cannot be mapped (the step is the source's own)")
        entries.append((str(ours), theirs, float(scale)))
    return KeyMap(name=name, entries=tuple(entries))


__all__ = ["KeyMap", "load_keymap", "parse_keymap", "recognise", "BUILTIN", "SCHEMA"]
