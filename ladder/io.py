"""File I/O shared by every part: atomic writes, validated JSON reads, tolerant JSONL reads.

Every JSON artifact carries ``"schema": "<kind>/<version>"`` and is written atomically (temp file
in the same directory, fsync, rename), so a crash never leaves a half-written artifact; artifacts
are 0644 (a teammate reads them), a pre-registration 0444. Write-once is enforced here, at the one
place that writes: no write replaces a read-only file (exit 73), whoever asks.

This is also the input layer every command reads through: :func:`read_bytes`, :func:`read_json`,
:func:`iter_jsonl`/:func:`read_metrics` and :func:`read_table` turn every OS error (missing,
a directory, unreadable), parse error (bad UTF-8, bad JSON, integers too long to convert, nesting
too deep) into the one-line :class:`InputError` naming the file (and the field), and
:func:`number` checks every number a user or a file gives (finite, in range, integral).
No JAX here: ``fit`` and ``predict`` import this module.
"""

from __future__ import annotations

import hashlib
import json
import math
import contextlib
import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

# Exit statuses for bad input follow BSD sysexits(3): 64 usage, 65 data, 66 no input,
# 73 can't create.
EX_USAGE, EX_DATAERR, EX_NOINPUT, EX_CANTCREAT, EX_IOERR = 64, 65, 66, 73, 74

ARTIFACT_MODE = 0o644  # readable by the team (issue 14); the pre-registration is 0o444
PREREG_MODE = 0o444


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


def check_replaceable(path: str | os.PathLike) -> None:
    """InputError (73) when ``path`` is a file that must not be replaced: read-only (a
    pre-registration, or anything its owner froze) or not a regular file (a directory).
    Checked on the mode bits, not ``os.access``, so that root is refused too."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise InputError(f"cannot be written ({_os_reason(e)})", path=path,
                         exit_code=EX_CANTCREAT) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError("is a directory; expected a file path", path=path,
                         exit_code=EX_CANTCREAT)
    if not st.st_mode & 0o222:
        raise InputError("is read-only (write-once, e.g. a pre-registration); not replaced",
                         path=path, exit_code=EX_CANTCREAT)


def check_writable(path: str | os.PathLike, *, field: str | None = None,
                   directory: bool = False) -> Path:
    """Fail early (InputError, 73) when ``path`` could not be written later: it is read-only
    or a directory (a file expected; with ``directory`` a directory is expected and a file is
    refused), or its nearest existing ancestor is a file or not writable. Called before the work
    so that a long fit or forecast is not lost to a bad ``--out``."""
    path = Path(path)
    if directory:
        if path.exists() and not path.is_dir():
            raise InputError("exists and is not a directory", path=path, field=field,
                             exit_code=EX_CANTCREAT)
    else:
        check_replaceable(path)
    parent = path if directory and path.is_dir() else path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"cannot be created: {parent} is not a directory", path=path,
                         field=field, exit_code=EX_CANTCREAT)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"cannot be created: {parent} is not writable", path=path,
                         field=field, exit_code=EX_CANTCREAT)
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, mode: int | None = None,
                       exclusive: bool = False) -> Path:
    """Write ``data`` to ``path`` via a temp file in the same directory, fsync, and rename.

    ``mode``: the file's permission bits (default :data:`ARTIFACT_MODE`, 0644). A read-only file
    at ``path`` is never replaced (InputError, exit 73). ``exclusive``: never replace an existing
    file at all; publish with a hard link, which fails if the name exists even under a race
    (raises FileExistsError). File systems without hard links get a best-effort
    check-then-rename. Any other OS error (a directory that cannot be created or written) is an
    InputError naming the path (exit 73). The temp name carries the writer's pid, so temp files
    of killed writers are removed by the next write into the same directory.
    """
    path = Path(path)
    check_replaceable(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp",
                                   dir=path.parent)
    except OSError as e:
        raise InputError(f"cannot be written ({_os_reason(e)})", path=path,
                         exit_code=EX_CANTCREAT) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, ARTIFACT_MODE if mode is None else mode)
        if not exclusive:
            check_replaceable(path)  # again, just before the rename (narrows the race)
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
    except (FileExistsError, InputError):
        raise
    except OSError as e:
        raise InputError(f"cannot be written ({_os_reason(e)})", path=path,
                         exit_code=EX_CANTCREAT) from None
    finally:
        try:
            os.unlink(tmp)  # the temp name (after a link, or after a failure)
        except FileNotFoundError:
            pass
    _fsync_dir(path.parent)
    return path


def _remove_stale_temps(path: Path) -> None:
    """Delete ``.NAME.<pid>.*.tmp`` left by writers of ``path`` that were killed (their pid is
    gone). Temp files of live writers (a concurrent write) are left alone."""
    try:
        names = [q for q in path.parent.iterdir()
                 if q.name.startswith(f".{path.name}.") and q.name.endswith((".tmp", ".old"))]
    except OSError:
        return
    for q in names:
        pid = q.name[len(path.name) + 2:].split(".", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            if q.is_dir() and not q.is_symlink():
                shutil.rmtree(q)
            else:
                q.unlink()
        except OSError:
            pass


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def append_text(path: str | os.PathLike, text: str, *, fsync: bool = True) -> None:
    """Append ``text`` to ``path`` (created 0644), flushed and fsynced; OS errors are an
    InputError naming the path (73). For JSONL logs, where a reader tolerates a partial line."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:  # created here: 0644 whatever the umask, as the atomic writes
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, ARTIFACT_MODE)
            os.fchmod(fd, ARTIFACT_MODE)
        except FileExistsError:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
    except OSError as e:
        raise InputError(f"cannot be appended to ({_os_reason(e)})", path=path,
                         exit_code=EX_CANTCREAT) from None


def _os_reason(e: OSError) -> str:
    """An OSError as a few words ("is a directory", "permission denied"), without the path."""
    return (e.strerror or type(e).__name__).lower() if isinstance(e, OSError) else str(e)


def atomic_write_text(path: str | os.PathLike, text: str, **kw) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), **kw)


def atomic_write_json(path: str | os.PathLike, obj: Any, **kw) -> Path:
    text = json.dumps(to_jsonable(obj), indent=2, allow_nan=False) + "\n"
    return atomic_write_text(path, text, **kw)


@contextlib.contextmanager
def staged_dir(out: str | os.PathLike, *, own: Iterable[str] = ("*.png", "*.md", "*.html")):
    """Build a directory of artifacts in a hidden temp directory beside ``out``, then swap it in
    (two renames): a crash midway leaves ``out`` as it was, never half old and half new. Files
    of an existing ``out`` that the new one does not write and that do not match ``own`` (the
    kinds this writer owns; a stale figure must not pass for the new report) are carried over."""
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(out)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.{os.getpid()}.", suffix=".tmp",
                                    dir=out.parent))
    except OSError as e:
        raise InputError(f"cannot be written ({_os_reason(e)})", path=out,
                         exit_code=EX_CANTCREAT) from None
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        old = None
        if out.exists():
            for q in out.iterdir():
                if not (tmp / q.name).exists() and not any(q.match(g) for g in own):
                    os.replace(q, tmp / q.name)
            old = out.with_name(f".{out.name}.{os.getpid()}.old")
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        _fsync_dir(out.parent)
    except OSError as e:
        raise InputError(f"cannot be written ({_os_reason(e)})", path=out,
                         exit_code=EX_CANTCREAT) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


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


def open_input(path: str | os.PathLike, *, field: str | None = None):
    """``open(path, "rb")``, every OS error an InputError naming the path (66 when missing)."""
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory")
        return open(path, "rb")  # noqa: SIM115 - the caller closes it
    except FileNotFoundError:
        raise InputError("no such file", path=path, field=field, exit_code=EX_NOINPUT) from None
    except IsADirectoryError:
        raise InputError("is a directory; expected a file", path=path, field=field,
                         exit_code=EX_NOINPUT) from None
    except OSError as e:
        raise InputError(f"cannot be read ({_os_reason(e)})", path=path, field=field,
                         exit_code=EX_NOINPUT) from None


def read_bytes(path: str | os.PathLike, *, field: str | None = None) -> bytes:
    with open_input(path, field=field) as f:
        try:
            return f.read()
        except OSError as e:
            raise InputError(f"cannot be read ({_os_reason(e)})", path=path, field=field,
                             exit_code=EX_NOINPUT) from None


def loads(data: bytes | str, *, path=None, field: str | None = None) -> Any:
    """``json.loads`` with every failure an InputError: bad syntax, bad UTF-8, an integer too
    long to convert (Python's 4300-digit limit), nesting too deep for the parser."""
    try:
        # UTF-8 as RFC 8259 requires (json.loads on bytes would guess UTF-16 from a \xff\xfe)
        return json.loads(data.decode("utf-8") if isinstance(data, bytes) else data)
    except UnicodeDecodeError:
        raise InputError("not UTF-8 text", path=path, field=field) from None
    except json.JSONDecodeError as e:
        raise InputError(f"not valid JSON ({e})", path=path, field=field) from None
    except RecursionError:
        raise InputError("JSON nested too deeply", path=path, field=field) from None
    except ValueError as e:  # e.g. "Exceeds the limit (4300 digits) for integer string ..."
        raise InputError(f"not valid JSON ({str(e).splitlines()[0][:120]})", path=path,
                         field=field) from None


def read_json(path: str | os.PathLike, *, schema: str | None = None,
              field: str | None = None) -> dict:
    """Read a JSON artifact; check that ``schema`` starts with the given kind (e.g. ``"law/"``).

    A schema of the right kind but a newer version than this tool knows is not rejected here;
    callers that care compare the version (see :func:`schema_version`)."""
    obj = loads(read_bytes(path, field=field), path=path, field=field)
    if not isinstance(obj, dict):
        raise InputError("expected a JSON object at the top level", path=path, field=field)
    if schema is not None:
        kind = obj.get("schema")
        if not isinstance(kind, str) or not kind.startswith(schema.rstrip("/") + "/"):
            raise InputError(f"expected schema '{schema.rstrip('/')}/<version>', got "
                             f"{_short(kind)}", path=path, field="schema")
    return obj


def schema_version(obj: dict) -> int | None:
    """The integer version of ``obj["schema"]`` ("prereg/2" -> 2), None if it has none."""
    kind = obj.get("schema")
    if not isinstance(kind, str) or "/" not in kind:
        return None
    v = kind.rsplit("/", 1)[1]
    return int(v) if v.isdigit() and len(v) < 6 else None


def _short(value: Any, n: int = 60) -> str:
    r = repr(value)
    return r if len(r) <= n else r[:n] + "..."


def number(value: Any, *, field: str, path=None, lo: float | None = None,
           hi: float | None = None, lo_open: bool = False, hi_open: bool = False,
           integral: bool = False, allow_none: bool = False, exit_code: int = EX_DATAERR):
    """Check one number a user or a file gave: a real number (not a bool, not a string), finite,
    within ``[lo, hi]`` (open ends with ``lo_open``/``hi_open``), integral when ``integral``
    (then returned as ``int``). InputError naming the field otherwise."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) and \
            not hasattr(value, "__float__"):
        raise InputError(f"expected a number, got {_short(value)}", path=path, field=field,
                         exit_code=exit_code)
    try:
        f = float(value)
    except (OverflowError, ValueError, TypeError):
        raise InputError(f"not a representable number ({_short(value)})", path=path,
                         field=field, exit_code=exit_code) from None
    if not math.isfinite(f):
        raise InputError(f"must be finite, got {_short(value)}", path=path, field=field,
                         exit_code=exit_code)
    if integral and (isinstance(value, float) and not f.is_integer()):
        raise InputError(f"must be an integer, got {_short(value)}", path=path, field=field,
                         exit_code=exit_code)
    if lo is not None and (f < lo or lo_open and f == lo):
        raise InputError(f"must be {'>' if lo_open else '>='} {lo:g}, got {_short(value)}",
                         path=path, field=field, exit_code=exit_code)
    if hi is not None and (f > hi or hi_open and f == hi):
        raise InputError(f"must be {'<' if hi_open else '<='} {hi:g}, got {_short(value)}",
                         path=path, field=field, exit_code=exit_code)
    if integral:
        return int(value) if isinstance(value, int) else int(f)
    return value if isinstance(value, int) else f


def read_table(path: str | os.PathLike, *, field: str | None = None):
    """A CSV or Parquet file as a pandas DataFrame; every failure an InputError naming it."""
    import pandas as pd  # not at module level: ladder.io is imported by the trainer too
    path = Path(path)
    with open_input(path, field=field):
        pass  # missing, a directory or unreadable: the one-line error, before pandas tries
    name = path.name.lower()
    try:
        if name.endswith((".parquet", ".pq")):
            try:
                return pd.read_parquet(path)
            except ImportError as e:
                raise InputError(f"reading Parquet needs pyarrow (pip install 'ladder[parquet]'"
                                 f"; {str(e).splitlines()[0][:100]})", path=path,
                                 exit_code=69) from None
        return pd.read_csv(path)
    except InputError:
        raise
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError,
            OSError, OverflowError, RecursionError) as e:
        msg = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise InputError(f"not a readable table ({msg})", path=path) from None


def require(obj: dict, key: str, types: type | tuple[type, ...], *, path=None, prefix: str = ""):
    """``obj[key]``, checked against ``types``; InputError naming the field otherwise."""
    name = f"{prefix}{key}"
    if key not in obj:
        raise InputError("missing", path=path, field=name)
    value = obj[key]
    if types in (float, (int, float)) and isinstance(value, int) and not isinstance(value, bool):
        if types is float:
            return number(value, field=name, path=path)
        return value
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
        try:
            return float(value)
        except OverflowError:  # an integer beyond float range: not a usable metric value
            return None
    if isinstance(value, str):
        if value in _NONFINITE:
            return _NONFINITE[value]
        if len(value) > 100:  # no metric is written with 100 characters
            return None
        try:
            return float(value)
        except ValueError:
            return None
    return None


def iter_jsonl(path: str | os.PathLike, *, start: int = 0,
               bad: list | None = None) -> Iterator[tuple[int, dict]]:
    """Yield ``(end_offset, row)`` for each complete JSON object line from byte ``start`` on.

    A partial last line (no newline yet) is not yielded, so a tailing reader can resume from the
    last ``end_offset``; a corrupt complete line (bad JSON or UTF-8, an integer too long to
    convert, nesting too deep, not an object) is skipped, and its 1-based line number appended
    to ``bad`` when given. NaN/Infinity are accepted as bare tokens (Python's json) and as
    strings (see :func:`as_float`). A missing, directory or unreadable path is an InputError.
    """
    with open_input(path) as f:
        f.seek(start)
        offset = start
        line_no = 0
        try:
            for raw in f:
                line_no += 1
                if not raw.endswith(b"\n"):
                    break
                offset += len(raw)
                line = raw.strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except (ValueError, UnicodeDecodeError, RecursionError):
                    row = None
                if isinstance(row, dict):
                    yield offset, row
                elif bad is not None:
                    bad.append(line_no)
        except OSError as e:
            raise InputError(f"cannot be read ({_os_reason(e)})", path=path,
                             exit_code=EX_NOINPUT) from None


# Steps beyond 2**53 are not exact as floats and overflow int64 columns downstream (a step of
# 1e30 wrapped negative, issue 15); no real run comes near (the hero has 390,251 steps).
MAX_STEP = 2 ** 53


def step_of(value: Any) -> int | None:
    """A row's ``step`` as an int, or None when it is not a finite integral number in
    ``[0, MAX_STEP]`` (a bool, a string, NaN, 1e30, 2.5)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= MAX_STEP else None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and \
            0 <= value <= MAX_STEP:
        return int(value)
    return None


def read_metrics(path: str | os.PathLike, *, notes: list | None = None) -> list[dict]:
    """All rows of a metrics.jsonl, one per step; a repeated step replaces the earlier row.

    Rows without a valid ``step`` (see :func:`step_of`) are dropped, as are corrupt lines; with
    ``notes``, one line saying how many and where is appended. Returned in step order.
    """
    by_step: dict[int, dict] = {}
    bad: list[int] = []
    no_step = 0
    for _, row in iter_jsonl(path, bad=bad):
        step = step_of(row.get("step"))
        if step is None:
            no_step += 1
            continue
        by_step[step] = row
    if notes is not None and (bad or no_step):
        parts = []
        if bad:
            parts.append(f"{len(bad)} line(s) not a JSON object (first at line {bad[0]})")
        if no_step:
            parts.append(f"{no_step} row(s) without a valid step (an integer in 0..2**53)")
        notes.append(f"{path}: skipped " + "; ".join(parts))
    return [by_step[s] for s in sorted(by_step)]
