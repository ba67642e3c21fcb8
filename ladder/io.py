"""File I/O shared by every part: atomic writes, validated JSON reads, tolerant JSONL reads.

Every JSON artifact carries ``"schema": "<kind>/<version>"`` and is written atomically (temp file
in the same directory, fsync, rename), so a crash never leaves a half-written artifact. Reads
validate and fail with :class:`InputError`, whose one-line message names the file and the field.
No JAX here: ``fit`` and ``predict`` import this module.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

# Exit statuses for bad input follow BSD sysexits(3): 64 usage, 65 data, 66 no input,
# 73 can't create.
EX_USAGE, EX_DATAERR, EX_NOINPUT, EX_CANTCREAT = 64, 65, 66, 73


class InputError(Exception):
    """Bad input (a file, a config, an argument). ``str()`` is one line naming file and field."""

    def __init__(self, message: str, *, path: str | os.PathLike | None = None,
                 field: str | None = None, exit_code: int = EX_DATAERR):
        self.path = None if path is None else str(path)
        self.field = field
        self.exit_code = exit_code
        where = ""
        if self.path:
            where = self.path + (f": field '{field}'" if field else "")
        elif field:
            where = f"field '{field}'"
        super().__init__(f"{where}: {message}" if where else message)


# ----------------------------------------------------------------------------- writing


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, mode: int | None = None,
                       exclusive: bool = False) -> Path:
    """Write ``data`` to ``path`` via a temp file in the same directory, fsync, and rename.

    ``exclusive``: never replace an existing file; publish with a hard link, which fails if the
    name exists even under a race (raises FileExistsError). File systems without hard links get
    a best-effort check-then-rename.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates 0600; an artifact is for the team (law.json, the report): 0644 unless
        # the caller asks otherwise (the pre-registration: 0444)
        os.chmod(tmp, 0o644 if mode is None else mode)
        if not exclusive:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise
            except OSError:
                if path.exists():
                    raise FileExistsError(str(path)) from None
                os.rename(tmp, path)
    finally:
        try:
            os.unlink(tmp)  # the temp name (after a link, or after a failure)
        except FileNotFoundError:
            pass
    _fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike, text: str, **kw) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), **kw)


def atomic_write_json(path: str | os.PathLike, obj: Any, **kw) -> Path:
    text = json.dumps(to_jsonable(obj), indent=2, allow_nan=False) + "\n"
    return atomic_write_text(path, text, **kw)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def to_jsonable(obj: Any) -> Any:
    """Plain JSON types; non-finite floats become the strings "NaN", "Infinity", "-Infinity"."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):  # numpy scalars and arrays
        return to_jsonable(obj.tolist())
    if isinstance(obj, float):
        if math.isnan(obj):
            return "NaN"
        if math.isinf(obj):
            return "Infinity" if obj > 0 else "-Infinity"
        return obj
    if isinstance(obj, Path):
        return str(obj)
    return obj


def canonical_json(obj: Any) -> bytes:
    """The canonical form that hashes are taken over: sorted keys, no whitespace, UTF-8."""
    return json.dumps(to_jsonable(obj), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False).encode("utf-8")


def sha256_of(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj)).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------- reading


def read_json(path: str | os.PathLike, *, schema: str | None = None) -> dict:
    """Read a JSON artifact; check that ``schema`` starts with the given kind (e.g. ``"law/"``)."""
    path = Path(path)
    if not path.exists():
        raise InputError("no such file", path=path, exit_code=EX_NOINPUT)
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"not valid JSON ({e})", path=path) from None
    if not isinstance(obj, dict):
        raise InputError("expected a JSON object at the top level", path=path)
    if schema is not None:
        kind = obj.get("schema")
        if not isinstance(kind, str) or not kind.startswith(schema.rstrip("/") + "/"):
            raise InputError(f"expected schema '{schema.rstrip('/')}/<version>', got {kind!r}",
                             path=path, field="schema")
    return obj


def require(obj: dict, key: str, types: type | tuple[type, ...], *, path=None, prefix: str = ""):
    """``obj[key]``, checked against ``types``; InputError naming the field otherwise."""
    name = f"{prefix}{key}"
    if key not in obj:
        raise InputError("missing", path=path, field=name)
    value = obj[key]
    if types in (float, (int, float)) and isinstance(value, int) and not isinstance(value, bool):
        return float(value) if types is float else value
    if not isinstance(value, types) or isinstance(value, bool) and bool not in _as_tuple(types):
        raise InputError(f"expected {_type_names(types)}, got {type(value).__name__}",
                         path=path, field=name)
    return value


def _as_tuple(t):
    return t if isinstance(t, tuple) else (t,)


def _type_names(t) -> str:
    return " or ".join(x.__name__ for x in _as_tuple(t))


_NONFINITE = {"nan": math.nan, "NaN": math.nan, "Infinity": math.inf, "inf": math.inf,
              "-Infinity": -math.inf, "-inf": -math.inf}


def as_float(value: Any) -> float | None:
    """A metric value as float: numbers, numeric strings and "NaN"/"Infinity"; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        if value in _NONFINITE:
            return _NONFINITE[value]
        try:
            return float(value)
        except ValueError:
            return None
    return None


def iter_jsonl(path: str | os.PathLike, *, start: int = 0) -> Iterator[tuple[int, dict]]:
    """Yield ``(end_offset, row)`` for each complete JSON object line from byte ``start`` on.

    A partial last line (no newline yet) is not yielded, so a tailing reader can resume from the
    last ``end_offset``; a corrupt complete line is skipped. NaN/Infinity are accepted as bare
    tokens (Python's json) and as strings (see :func:`as_float`).
    """
    with open(path, "rb") as f:
        f.seek(start)
        offset = start
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            offset += len(raw)
            line = raw.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(row, dict):
                yield offset, row


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All rows of a metrics.jsonl, one per step; a repeated step replaces the earlier row.

    Rows without an integer ``step`` are dropped. Returned in step order.
    """
    by_step: dict[int, dict] = {}
    for _, row in iter_jsonl(path):
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, (int, float)) or step != step:
            continue
        by_step[int(step)] = row
    return [by_step[s] for s in sorted(by_step)]
