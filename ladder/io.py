"""File I/O shared by every part, and the input layer every command reads through.

- **Writes** are atomic (temp file beside the target, fsync, rename): a crash never leaves a
  half-written artifact. Artifacts are 0644, a pre-registration 0444; no write replaces a
  read-only file (exit 73). JSON artifacts carry ``"schema": "<kind>/<version>"``.
- **Reads** (:func:`read_bytes`, :func:`read_json`, :func:`iter_jsonl`, :func:`read_table`) turn
  every OS or parse error into the one-line :class:`InputError` naming the file (and the field);
  :func:`number` checks every number a user or a file gives.
- **Inputs are regular files** (:func:`open_input`, issue 26): a FIFO, a device or a socket is
  refused without blocking; a file read whole is bounded (:data:`MAX_READ_BYTES`), JSON nesting
  too (:data:`MAX_JSON_DEPTH`).
- **Names that become paths** (:func:`safe_name`, :func:`inside`) are one path component of a
  safe character set, and the path resolves inside its folder.
- JSON lines are parsed by orjson (optional), the standard library taking what it refuses
  (:func:`json_line`); artifacts read whole by the standard library, whose integers stay exact.

No JAX here: ``fit`` and ``predict`` import this module.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import json
import math
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

try:
    import orjson
except ImportError:   # a bare GPU image (issue 37): the standard library reads every line
    orjson = None

# Exit statuses follow BSD sysexits(3): 64 usage, 65 data, 66 no input, 73 can't create, 74 I/O.
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
        where = [w for w in (self.path, field and f"field '{field}'") if w]
        super().__init__(": ".join([*where, message]).translate(_ONE_LINE))


# Every character str.splitlines breaks a line at, escaped: a value from a file cannot make the
# one-line message two.
_ONE_LINE = {ord(c): c.encode("unicode_escape").decode("ascii")
             for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}


# ----------------------------------------------------------------------------- names -> paths

# One path component: a letter or digit first (no hidden name, no "-x", no ".."), then letters,
# digits and . _ - + = @ (rung names such as "1.6B-A61M", shards such as "train-00000.bin");
# 128 characters at most (a name is also a W&B run name and a table column).
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=@-]{0,127}")


def safe_name(value: Any, *, field: str, path=None, what: str = "name") -> str:
    """``value`` when it can be one path component (:data:`SAFE_NAME`, no ``..``); InputError
    (65) naming the field, the value shown escaped, otherwise."""
    if not isinstance(value, str) or not SAFE_NAME.fullmatch(value) or ".." in value:
        shown = ascii(value) if isinstance(value, str) else type(value).__name__
        raise InputError(f"not a safe {what} ({shown[:80]}): use 1-128 letters, digits and "
                         f". _ - + = @, starting with a letter or digit, no '..'", path=path,
                         field=field, exit_code=EX_DATAERR)
    return value


def inside(root: str | os.PathLike, *names: str, field: str, path=None) -> Path:
    """``root / names...``, each name a :func:`safe_name`, checked to resolve inside ``root``
    (a symbolic link leading out is refused too); InputError (65) naming the field otherwise."""
    root = Path(root)
    for n in names:
        safe_name(n, field=field, path=path)
    out = root.joinpath(*names)
    try:
        base = root.resolve()
        real = out.resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise InputError(f"cannot be resolved ({type(e).__name__})", path=out, field=field,
                         exit_code=EX_DATAERR) from None
    if real != base and base not in real.parents:
        raise InputError(f"leads outside {root} (a symbolic link?); refused", path=out,
                         field=field, exit_code=EX_DATAERR)
    return out


# ----------------------------------------------------------------------------- writing


def check_replaceable(path: str | os.PathLike) -> None:
    """InputError (73) when ``path`` must not be replaced: read-only (a pre-registration) or not
    a regular file. Checked on the mode bits, not ``os.access``, so that root is refused too."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise _cannot("written", e, path) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError("is a directory; expected a file path", path=path,
                         exit_code=EX_CANTCREAT)
    if not stat.S_ISREG(st.st_mode):
        raise InputError("not a regular file (a FIFO, a device or a socket); not written",
                         path=path, exit_code=EX_CANTCREAT)
    if not st.st_mode & 0o222:
        raise InputError("is read-only (write-once, e.g. a pre-registration); not replaced",
                         path=path, exit_code=EX_CANTCREAT)


def check_writable(path: str | os.PathLike, *, field: str | None = None,
                   directory: bool = False) -> Path:
    """InputError (73) now when ``path`` could not be written later (read-only; a directory, or
    with ``directory`` a file; its nearest existing ancestor a file or not writable), so that a
    long fit or forecast is not lost to a bad ``--out``."""
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

    ``mode``: permission bits (default 0644). A read-only file is never replaced (InputError,
    73). ``exclusive``: never replace any file; published with a hard link, which fails under a
    race too (FileExistsError; without hard links, a best-effort check-then-rename). Any other
    OS error is an InputError (73) and leaves ``path`` as it was. The temp name carries the
    writer's pid: the next write into the directory removes those of killed writers.
    """
    path = Path(path)
    tmp = _stage(path, data, mode)
    try:
        _publish(tmp, path, exclusive)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # the temp name (after a link, or after a failure)
    _fsync_dir(path.parent)
    return path


def _stage(path: Path, data: bytes, mode: int | None) -> str:
    """``data`` in a fsynced temp file beside ``path``: its name (nothing left when it fails)."""
    check_replaceable(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp",
                                   dir=path.parent)
    except OSError as e:
        raise _cannot("written", e, path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, ARTIFACT_MODE if mode is None else mode)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise _cannot("written", e, path) from None
        raise
    return tmp


def _publish(tmp: str, path: Path, exclusive: bool) -> None:
    """Put the staged ``tmp`` at ``path`` (the second half of an atomic write)."""
    try:
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
        raise _cannot("written", e, path) from None


def write_with_record(path: str | os.PathLike, data: bytes, log: str | os.PathLike, line: str,
                      *, mode: int | None = None) -> Path:
    """Publish ``data`` at ``path`` (exclusively) AND append ``line`` to the JSONL log ``log``:
    both or neither (issue 39: an amendment and its line in amendments.jsonl).

    The data is staged (a full disk fails here), the line appended, then the data linked into
    place; a failure before the link cuts the log back and removes the temp file. A kill between
    append and link leaves a line whose file is missing (readers pass over it; a retry works).
    Appenders through this function are serialized by a lock on ``log``."""
    path, log = Path(path), Path(log)
    if path.exists() or path.is_symlink():
        raise FileExistsError(str(path))
    existed = log.exists()
    fd = _open_log(log)
    try:
        _flock(fd, log)
        tmp = _stage(path, data, mode)
        try:
            start = _append_fd(fd, line.encode("utf-8"), log, fsync=True)
            try:
                _publish(tmp, path, exclusive=True)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)
                    os.fsync(fd)
                raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    except BaseException:
        if not existed and os.fstat(fd).st_size == 0:
            with contextlib.suppress(OSError):
                os.unlink(log)   # created by this call, still empty: as before the call
        raise
    finally:
        os.close(fd)  # releases the lock
    _fsync_dir(path.parent)
    return path


_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)  # a file system without flock


def _flock(fd: int, path: Path) -> None:
    """An exclusive advisory lock on ``fd`` (waits: holders are short); none where the file
    system has no locks."""
    import fcntl
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as e:
        if e.errno not in _NO_LOCKS:
            raise _cannot("locked", e, path) from None


def _remove_stale_temps(path: Path) -> None:
    """Delete what killed writers of ``path`` (pid gone) left: temp files ``.NAME.<pid>.*.tmp``
    and :func:`staged_dir`'s ``.staged``/``.trash`` directories. A live writer's are left, and
    so is anything else (a directory of another name could hold a user's files)."""
    try:
        names = [q for q in path.parent.iterdir() if q.name.startswith(f".{path.name}.")
                 and q.name.endswith((".tmp", ".staged", ".trash"))]
    except OSError:
        return
    for q in names:
        pid = q.name[len(path.name) + 2:].split(".", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            if q.is_symlink() or q.is_file():
                if q.name.endswith(".tmp"):
                    q.unlink()
            elif q.is_dir() and q.name.endswith((".staged", ".trash")):
                shutil.rmtree(q)
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
        pass   # another user's process (or no pid of this OS): not known to be gone
    return True


def append_text(path: str | os.PathLike, text: str, *, fsync: bool = True) -> int:
    """Append ``text`` (whole lines) to the JSONL log ``path`` (created 0644), fsynced; OS errors
    are an InputError (73). Returns the bytes of a partial last line removed.

    Durable (issue 26): a partial last line (a kill, a full disk) is removed first, so the next
    line is not glued onto it, and a write failing midway is cut back: no partial line stays."""
    path = Path(path)
    fd = _open_log(path)
    try:
        size = os.fstat(fd).st_size
        start = _append_fd(fd, text.encode("utf-8"), path, fsync=fsync)
        return size - start
    finally:
        os.close(fd)


def _open_log(path: Path) -> int:
    """``path`` opened for appending (created 0644 whatever the umask); a regular file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NONBLOCK,
                         ARTIFACT_MODE)
            os.fchmod(fd, ARTIFACT_MODE)
        except FileExistsError:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_NONBLOCK)
    except OSError as e:
        raise _cannot("appended to", e, path) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError("not a regular file (a FIFO, a device or a socket); not appended "
                             "to", path=path, exit_code=EX_CANTCREAT)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _append_fd(fd: int, data: bytes, path: Path, *, fsync: bool) -> int:
    """Append ``data`` to ``fd`` after cutting a partial last line; the offset written at."""
    try:
        size = os.fstat(fd).st_size
        start = size - _cut_partial_line(fd, size)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if fsync:
                os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)  # no half line left behind (O_APPEND: we wrote at start)
            raise
        return start
    except OSError as e:
        raise _cannot("appended to", e, path) from None


def _cut_partial_line(fd: int, size: int) -> int:
    """Truncate the open file ``fd`` of ``size`` bytes after its last newline; the bytes cut."""
    pos = size
    while pos > 0:
        n = min(pos, 1 << 16)
        chunk = os.pread(fd, n, pos - n)
        k = chunk.rfind(b"\n")
        if k >= 0:
            end = pos - n + k + 1
            break
        pos -= n
    else:
        end = 0
    if end < size:
        os.ftruncate(fd, end)
    return size - end


def _cannot(doing: str, e: OSError, path, *, field: str | None = None,
            exit_code: int = EX_CANTCREAT) -> InputError:
    """The one line of an OS error: ``PATH: cannot be DOING (reason)`` (73 unless told), the
    reason in a few words without the path ("permission denied")."""
    reason = (e.strerror or type(e).__name__).lower() if isinstance(e, OSError) else str(e)
    return InputError(f"cannot be {doing} ({reason})", path=path, field=field,
                      exit_code=exit_code)


def atomic_write_text(path: str | os.PathLike, text: str, **kw) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), **kw)


def atomic_write_json(path: str | os.PathLike, obj: Any, **kw) -> Path:
    text = json.dumps(to_jsonable(obj), indent=2, allow_nan=False) + "\n"
    return atomic_write_text(path, text, **kw)


# ----------------------------------------------------------------------------- output folders
#
# A command touches only what it wrote (issue 39): a folder it writes holds MARKER, listing the
# names (or globs) ladder wrote there; a file the command would write that the marker does not
# list is refused with one line, never replaced, moved or deleted. Writers that can collide
# (two tokenizers, two runs into one folder) also hold :func:`folder_lock`.

MARKER = ".ladder-out.json"
MARKER_SCHEMA = "ladder-out/1"
LOCK = ".ladder.lock"
EX_TEMPFAIL = 75  # sysexits: a temporary failure (the folder is in use); try again later


def real_folder(out: str | os.PathLike, *, field: str | None = "--out") -> Path:
    """``out`` with a final symbolic link resolved; InputError (73) when it leads nowhere or to
    something that is not a folder."""
    out = Path(out)
    if not out.is_symlink():
        return out
    try:
        real = out.resolve(strict=True)
    except (OSError, RuntimeError):
        raise InputError("is a symbolic link that leads nowhere; give the real folder",
                         path=out, field=field, exit_code=EX_CANTCREAT) from None
    if not real.is_dir():
        raise InputError(f"is a symbolic link to {real}, not a folder", path=out, field=field,
                         exit_code=EX_CANTCREAT)
    return real


def marker_names(folder: Path) -> list[str]:
    """The names (globs) ``folder``'s marker lists; [] when unreadable (the safe direction)."""
    try:
        doc = loads(read_bytes(folder / MARKER, limit=1 << 20))
    except InputError:
        return []
    if not isinstance(doc, dict) or doc.get("schema") != MARKER_SCHEMA:
        return []
    files = doc.get("files")
    return [f for f in files if isinstance(f, str)] if isinstance(files, list) else []


def _listed(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, g) for g in patterns)


def write_marker(folder: Path, names: Iterable[str]) -> None:
    atomic_write_json(folder / MARKER, {"schema": MARKER_SCHEMA, "files": sorted(set(names))})


def claim(folder: str | os.PathLike, patterns: Iterable[str], *, what: str,
          field: str = "--out") -> Path:
    """Claim ``folder`` for a writer of ``patterns`` (names or globs): a matching file the
    marker does not list is InputError (73); otherwise the marker lists ``patterns`` (the folder
    created if needed). Returns the real folder."""
    folder = real_folder(folder, field=field)
    patterns = list(patterns)
    ours = marker_names(folder) if folder.is_dir() else []
    if folder.is_dir():
        try:
            names = sorted(q.name for q in folder.iterdir())
        except OSError as e:
            raise _cannot("read", e, folder, field=field) from None
        foreign = [n for n in names if n != MARKER and _listed(n, patterns) and
                   not _listed(n, ours)]
        if foreign:
            more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
            raise InputError(f"holds {foreign[0]}{more}, which ladder did not write here (not "
                             f"listed in {MARKER}); {what} would replace or remove it: use "
                             f"another folder, or move it away", path=folder, field=field,
                             exit_code=EX_CANTCREAT)
    if not set(patterns) <= set(ours):
        write_marker(folder, ours + patterns)
    return folder


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, *, what: str, field: str | None = "--out"):
    """Hold ``folder`` (created if needed) for the block: ``flock`` on ``folder/.ladder.lock``
    (released by the kernel when the holder dies). A second holder is refused with one line
    naming the first (InputError, 75). Without ``flock``, the pid in the file decides."""
    import fcntl
    import socket
    import time

    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _cannot("created", e, folder, field=field) from None
    path = folder / LOCK
    host = socket.gethostname()
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         ARTIFACT_MODE)
        except OSError as e:
            raise _cannot("locked", e, path, field=field) from None
        holder = _lock_holder(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _in_use(holder, folder, field) from None
        except OSError as e:
            if e.errno not in _NO_LOCKS:
                os.close(fd)
                raise _cannot("locked", e, path, field=field) from None
            # no flock here: the pid in the file decides (a live one on this host holds it)
            pid = holder.get("pid")
            if holder.get("host") == host and isinstance(pid, int) and pid != os.getpid() \
                    and _alive(pid):
                os.close(fd)
                raise _in_use(holder, folder, field) from None
        # the file locked must still be the one at the path (a holder removes it on release)
        try:
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        me = json.dumps({"pid": os.getpid(), "host": host, "what": what,
                         "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        os.ftruncate(fd, 0)
        os.pwrite(fd, me.encode() + b"\n", 0)
        yield folder
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still held: a waiter that opened it retries (inode check)
        os.close(fd)


def _lock_holder(fd: int) -> dict:
    try:
        doc = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _in_use(h: dict, folder: Path, field: str | None) -> InputError:
    """The refusal (75) of a second holder of ``folder``'s lock, naming the first."""
    who = (f"{str(h.get('what', 'ladder'))[:40]} (pid {h.get('pid')} on "
           f"{str(h.get('host'))[:60]}, since {str(h.get('since'))[:20]})") if h \
        else "another ladder process"
    return InputError(f"in use by {who}; wait for it to end or use another folder (lock {LOCK})",
                      path=folder, field=field, exit_code=EX_TEMPFAIL)


@contextlib.contextmanager
def staged_dir(out: str | os.PathLike, *, own: Iterable[str] = ()):
    """Build a directory of artifacts in a hidden temp directory beside ``out``, then put it in
    place; a crash while building leaves ``out`` as it was.

    A new ``out`` is one rename. Into an existing one, this writer's old files (the new names,
    and the marker's names matching ``own``: a stale figure must not pass for the new report)
    go to a hidden trash directory, then the new ones move in: a crash between leaves part of
    one report, never a mix of two. A same-named file the marker does not list, or a read-only
    one, is refused before anything moves (issue 39); nothing else in ``out`` is touched."""
    out = real_folder(out)
    own = tuple(own)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(out)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.{os.getpid()}.", suffix=".staged",
                                    dir=out.parent))
    except OSError as e:
        raise _cannot("written", e, out) from None
    trash = None
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        new = sorted(q.name for q in tmp.iterdir() if q.name != MARKER)
        if not out.exists() and not out.is_symlink():
            write_marker(tmp, new)
            os.replace(tmp, out)
        else:
            if not out.is_dir():
                raise InputError("exists and is not a directory", path=out, field="--out",
                                 exit_code=EX_CANTCREAT)
            ours = marker_names(out)
            present = {q.name: q for q in out.iterdir()}
            claim(out, new, what="this command")   # same-named files ladder did not write
            old = [q for name, q in present.items() if name != MARKER and
                   (name in new or _listed(name, own) and _listed(name, ours)) and
                   (q.is_symlink() or not q.is_dir())]
            for q in old:
                check_replaceable(q)   # read-only (or a link to a read-only file): refused
            trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.{os.getpid()}.", suffix=".trash",
                                          dir=out.parent))
            for q in old:
                os.replace(q, trash / q.name)
            for name in new:
                os.replace(tmp / name, out / name)
            stale = {q.name for q in old} - set(new)
            write_marker(out, [n for n in marker_names(out) if n not in stale] + new)
            _fsync_dir(out)
        _fsync_dir(out.parent)
    except OSError as e:
        raise _cannot("written", e, out) from None
    finally:
        for d in (tmp, trash):
            if d is not None and d.exists():
                shutil.rmtree(d, ignore_errors=True)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):   # best effort: not every file system syncs a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def to_jsonable(obj: Any) -> Any:
    """Plain JSON types; non-finite floats as the strings "NaN", "Infinity", "-Infinity"."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):  # numpy scalars and arrays
        return to_jsonable(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else "Infinity" if obj > 0 else "-Infinity"
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
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# ----------------------------------------------------------------------------- reading


# A file read whole above this is refused (issue 26: a runaway file must not take the memory);
# the largest artifact, a pre-registration with health curves, is a few MB.
MAX_READ_BYTES = 512 << 20
# JSON nesting: orjson's limit in C, held for the standard library too (ours nest < 10 deep).
MAX_JSON_DEPTH = 1024


def open_input(path: str | os.PathLike, *, field: str | None = None):
    """The regular file ``path`` opened for binary reading; InputError otherwise (66 missing or
    unreadable or a directory, 65 a FIFO, device or socket). Opened ``O_NONBLOCK`` and checked
    by ``fstat`` on the descriptor: a FIFO or a device is refused at once, and a file swapped
    between a check and the open cannot slip through."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InputError("no such file", path=path, field=field, exit_code=EX_NOINPUT) from None
    except OSError as e:
        if e.errno == errno.ENXIO:  # a socket (or a FIFO without a reader, for writing)
            raise InputError("not a regular file (a socket?); refused", path=path, field=field,
                             exit_code=EX_DATAERR) from None
        raise _cannot("read", e, path, field=field, exit_code=EX_NOINPUT) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputError("is a directory; expected a file", path=path, field=field,
                             exit_code=EX_NOINPUT)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if
                    stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a socket" if
                    stat.S_ISSOCK(st.st_mode) else "a special file")
            raise InputError(f"not a regular file ({kind}); refused", path=path, field=field,
                             exit_code=EX_DATAERR)
        os.set_blocking(fd, True)  # a regular file: reads never block anyway
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike, *, field: str | None = None,
               limit: int = MAX_READ_BYTES) -> bytes:
    """The whole regular file ``path`` (:func:`open_input`), refused above ``limit`` bytes (on
    its size, and again while reading: a file growing meanwhile)."""
    with open_input(path, field=field) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise InputError(f"larger than {limit >> 20} MiB, the limit for a file read "
                                 f"whole; refused", path=path, field=field, exit_code=EX_DATAERR)
            # read(n) allocates n bytes up front: the size (plus one, to see it grew), then what
            # it grew by in 1 MiB pieces (a read of limit + 1 allocated 512 MiB every time)
            parts = [f.read(size + 1)]
            got = len(parts[0])
            while got > size and got <= limit:
                more = f.read(min(1 << 20, limit + 1 - got))
                if not more:
                    break
                parts.append(more)
                got += len(more)
            data = parts[0] if len(parts) == 1 else b"".join(parts)
        except OSError as e:
            raise _cannot("read", e, path, field=field, exit_code=EX_NOINPUT) from None
    if len(data) > limit:
        raise InputError(f"larger than {limit >> 20} MiB, the limit for a file read whole; "
                         f"refused", path=path, field=field, exit_code=EX_DATAERR)
    return data


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def json_depth_ok(data: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text ``data`` nests at most ``limit`` deep (brackets in strings not
    counted); cheap when it has few brackets."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return True
    import numpy as np
    bare = _JSON_STRING.sub(b'""', data)
    a = np.frombuffer(bare, dtype=np.uint8)
    step = (np.isin(a, (0x5B, 0x7B)).astype(np.int32) - np.isin(a, (0x5D, 0x7D)))
    return int(np.cumsum(step).max(initial=0)) <= limit


def loads(data: bytes | str, *, path=None, field: str | None = None) -> Any:
    """Parse a JSON document read whole, every failure (bad syntax or UTF-8, an integer past
    Python's 4300 digits, nesting past :data:`MAX_JSON_DEPTH`) an InputError. The standard
    library parses: hashes are taken over what it reads, and it keeps every integer exact."""
    try:
        # UTF-8 as RFC 8259 requires (json.loads on bytes would guess UTF-16 from a \xff\xfe)
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError:
        raise InputError("not UTF-8 text", path=path, field=field) from None
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
    if not json_depth_ok(raw):
        raise InputError("JSON nested too deeply", path=path, field=field)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"not valid JSON ({e})", path=path, field=field) from None
    except RecursionError:
        raise InputError("JSON nested too deeply", path=path, field=field) from None
    except ValueError as e:  # e.g. "Exceeds the limit (4300 digits) for integer string ..."
        raise InputError(f"not valid JSON ({str(e).splitlines()[0][:120]})", path=path,
                         field=field) from None


def json_line(raw: bytes) -> tuple[Any, bool]:
    """One JSON line: ``(value, by_stdlib)``, ``value`` None when it is not JSON. orjson parses
    (the same values as ``json.loads``, floats to the bit, issue 24); what it refuses (NaN and
    Infinity tokens, a number beyond float range, a lone surrogate) goes to ``json.loads``.
    An integer outside [-2**63, 2**64) reads as the nearest float (every reader here makes it
    a float anyway; tests/test_watch_jsonl.py)."""
    if orjson is not None:
        try:
            return orjson.loads(raw), False
        except orjson.JSONDecodeError:
            pass
    else:
        value = _stdlib_line(raw)
        if value is not _REFUSED:
            return value, True
    try:
        if not json_depth_ok(raw):
            return None, True
        return json.loads(raw.decode("utf-8")), True
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, True


_REFUSED = object()


def _orjson_int(text: str):
    """An integer as orjson reads it: exact within [-2**63, 2**64), else the nearest float."""
    value = int(text)
    return value if -2 ** 63 <= value < 2 ** 64 else _finite_float(text)


def _finite_float(text: str) -> float:
    """A number as orjson reads it: refused (ValueError) beyond float range (1e999)."""
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text[:20]} is beyond float range")
    return value


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _stdlib_line(raw: bytes):
    """One line read by the standard library to orjson's values (without orjson); ``_REFUSED``
    for what orjson refuses, which :func:`json_line` then reads as usual."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        if not json_depth_ok(text.encode("utf-8")):
            return _REFUSED
        value = json.loads(text, parse_int=_orjson_int, parse_float=_finite_float,
                           parse_constant=_refuse_constant)
        # a lone surrogate ("\ud800" escaped in the line), which orjson refuses, cannot be
        # encoded as UTF-8
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (ValueError, UnicodeError, RecursionError):
        return _REFUSED
    return value


def read_json(path: str | os.PathLike, *, schema: str | None = None,
              field: str | None = None) -> dict:
    """A JSON object read whole, its ``schema`` checked to be of the kind ``schema`` (``"law/"``)
    when given; the version is the caller's to check (:func:`known_schema`)."""
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


def known_schema(obj: dict, known: tuple[str, ...], *, path=None, field: str = "schema") -> str:
    """``obj["schema"]`` when one of ``known``; any other is refused by name (a newer one is
    never read as the current one, issue 39)."""
    kind = obj.get("schema") if isinstance(obj, dict) else None
    if kind not in known:
        newer = schema_version(obj) if isinstance(obj, dict) else None
        newest = max((schema_version({"schema": k}) or 0) for k in known)
        why = "written by a newer ladder? " if newer is not None and newer > newest else ""
        raise InputError(f"unknown schema {_short(kind)} ({why}this tool reads "
                         f"{', '.join(known)})", path=path, field=field)
    return kind


def _short(value: Any, n: int = 60) -> str:
    r = repr(value)
    return r if len(r) <= n else r[:n] + "..."


def number(value: Any, *, field: str, path=None, lo: float | None = None,
           hi: float | None = None, lo_open: bool = False, hi_open: bool = False,
           integral: bool = False, allow_none: bool = False, exit_code: int = EX_DATAERR):
    """One number a user or a file gave: real (not a bool or string), finite, in ``[lo, hi]``
    (open ends with ``lo_open``/``hi_open``), integral when ``integral`` (then an ``int``).
    InputError naming the field otherwise."""
    if value is None and allow_none:
        return None

    def refuse(why: str) -> InputError:
        return InputError(f"{why}, got {_short(value)}", path=path, field=field,
                          exit_code=exit_code)
    if isinstance(value, bool) or not isinstance(value, (int, float)) and \
            not hasattr(value, "__float__"):
        raise refuse("expected a number")
    try:
        f = float(value)
    except (OverflowError, ValueError, TypeError):
        raise InputError(f"not a representable number ({_short(value)})", path=path,
                         field=field, exit_code=exit_code) from None
    if not math.isfinite(f):
        raise refuse("must be finite")
    if integral and (isinstance(value, float) and not f.is_integer()):
        raise refuse("must be an integer")
    if lo is not None and (f < lo or lo_open and f == lo):
        raise refuse(f"must be {'>' if lo_open else '>='} {lo:g}")
    if hi is not None and (f > hi or hi_open and f == hi):
        raise refuse(f"must be {'<' if hi_open else '<='} {hi:g}")
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
    kinds = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, types) or isinstance(value, bool) and bool not in kinds:
        raise InputError(f"expected {' or '.join(t.__name__ for t in kinds)}, got "
                         f"{type(value).__name__}", path=path, field=name)
    return value


_NONFINITE = {"nan": math.nan, "NaN": math.nan, "Infinity": math.inf, "inf": math.inf,
              "-Infinity": -math.inf, "-inf": -math.inf}


def as_float(value: Any) -> float | None:
    """A metric value as float: numbers, numeric strings and "NaN"/"Infinity"; None otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    if isinstance(value, str):
        if value in _NONFINITE:
            return _NONFINITE[value]
        if len(value) > 100:  # no metric is written with 100 characters
            return None
    try:
        return float(value)
    except (OverflowError, ValueError):  # an integer beyond float range; a non-numeric string
        return None


# One metrics line is one step's scalars (a few KB; every expert's load of the hero ~0.4 MB). A
# longer line is skipped as corrupt, read past in 1 MiB pieces (issue 39: a 3 GiB line).
MAX_LINE_BYTES = 16 << 20


def skip_line(f) -> int | None:
    """Read past the rest of the current line of ``f`` in 1 MiB pieces: the bytes consumed
    through its newline, or None when the file ends first (a line still being written)."""
    n = 0
    while True:
        piece = f.readline(1 << 20)
        n += len(piece)
        if not piece:
            return None
        if piece.endswith(b"\n"):
            return n


def iter_jsonl(path: str | os.PathLike, *, start: int = 0,
               bad: list | None = None) -> Iterator[tuple[int, dict]]:
    """Yield ``(end_offset, row)`` for each complete JSON object line from byte ``start`` on.

    A partial last line is not yielded (a tailing reader resumes at the last ``end_offset``); a
    corrupt line (not a JSON object, :func:`json_line`) is skipped, its 1-based number appended
    to ``bad``. A path that cannot be read is an InputError (:func:`open_input`)."""
    with open_input(path) as f:
        f.seek(start)
        offset = start
        line_no = 0
        try:
            while raw := f.readline(MAX_LINE_BYTES + 1):
                line_no += 1
                if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                    rest = skip_line(f)
                    if rest is None:
                        break
                    offset += len(raw) + rest
                    if bad is not None:
                        bad.append(line_no)
                    continue
                if not raw.endswith(b"\n"):
                    break
                offset += len(raw)
                line = raw.strip()
                if not line:
                    continue
                row, _ = json_line(line)
                if isinstance(row, dict):
                    yield offset, row
                elif bad is not None:
                    bad.append(line_no)
        except OSError as e:
            raise _cannot("read", e, path, exit_code=EX_NOINPUT) from None


# Steps beyond 2**53 are not exact as floats (issue 15: 1e30 wrapped negative); the hero has
# 390,251.
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
    """All rows of a metrics.jsonl in step order, a repeated step replacing the earlier row.
    Rows without a valid ``step`` (:func:`step_of`) and corrupt lines are dropped, said in one
    line appended to ``notes``."""
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
