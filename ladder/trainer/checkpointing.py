"""A run's checkpoints: permanent ones on the rung's schedule and rolling ones for preemption.

``<root>/<step>/`` are the permanent checkpoints (trainconfig.checkpoint_steps; the last
``keep`` are kept); ``<root>/rolling/<step>/`` holds at most one more: the latest time-based one
(``checkpoint_minutes``; the real hero kept one an hour) or the one written when a signal
stopped the run. Resume starts from the newest of either kind. The root is the run directory's
``checkpoints/`` or a ``checkpoint_dir`` (a local path, or ``gs://``/``s3://`` through
etils/TensorStore, which need gcsfs or s3fs and credentials).

Each checkpoint is an Orbax composite: ``state`` (every process writes its own shards) and, over
token shards, ``data`` (each process's Grain iterator state). Saves are asynchronous by default:
``save`` returns once the state is off the devices; the step directory is renamed into place
only when complete, so resume never reads a half-written one. Every process waits for the
previous save at the same point (the next save, or close), where a permanent checkpoint also
removes the rolling one it supersedes.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import shutil
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from time import monotonic as _clock  # a module global, so a test can drive the clock
from urllib.parse import urlparse

ROLLING = "rolling"
log = logging.getLogger(__name__)
# OS errors of a save that are the disk's, not the program's: a full disk or quota, a read-only
# or failing device (sysexits 74, EX_IOERR, with nothing half-made left behind)
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG)
DISK_WORDS = ("no space left", "disk quota", "read-only file system", "file too large",
              "input/output error")


def location(path: str | Path):
    """A checkpoint folder: a local path (``file://`` URLs too), resolved, or an object-store
    URL (``gs://``, ``s3://``) as an etils path, which Orbax writes through."""
    text = str(path)
    if text.startswith("file://"):
        return Path(urlparse(text).path).resolve()
    if "://" in text:
        from etils import epath

        return epath.Path(text)
    return Path(text).resolve()


def _manager(path, keep: int, async_save: bool):
    import orbax.checkpoint as ocp

    return ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True, enable_async_checkpointing=async_save,
        cleanup_tmp_directories=True))


class Checkpoints:
    """Permanent and rolling checkpoints of one run (see the module docstring)."""

    def __init__(self, root, keep: int, minutes: float | None = None, *,
                 async_save: bool = True):
        self.root = location(root)
        self.async_save = async_save
        self.permanent = _manager(self.root, keep, async_save)
        self.rolling = _manager(self.root / ROLLING, 1, async_save)
        self.interval_s = None if not minutes else 60.0 * minutes
        self._last_save = _clock()
        self._pending: dict[str, int] = {}   # manager -> step being written in the background
        self._closed = False
        self._done = self.latest_step()
        _quiet(+1)   # until close

    def latest_step(self) -> int:
        steps = [m.latest_step() for m in (self.permanent, self.rolling)]
        return max((s for s in steps if s is not None), default=0)

    def due(self) -> bool:
        """A time-based checkpoint is due: ``checkpoint_minutes`` since the last save."""
        return self.interval_s is not None and \
            _clock() - self._last_save >= self.interval_s

    def save(self, step: int, state, data_state: bytes | None = None, *,
             rolling: bool = False) -> None:
        """Start writing ``step`` (finished before this returns when saves are synchronous)."""
        import orbax.checkpoint as ocp

        self._settle()
        items = {"state": ocp.args.StandardSave(state)}
        if data_state is not None:
            from grain.checkpoint import CheckpointSave

            # what Grain's handler needs of an iterator (get_state), for a state taken earlier:
            # the trainer has already drawn the next batch when it saves
            items["data"] = CheckpointSave(SimpleNamespace(get_state=lambda: data_state))
        kind = ROLLING if rolling else "permanent"
        mngr = self.rolling if rolling else self.permanent
        with self._disk_errors(step):
            mngr.save(step, args=ocp.args.Composite(**items), force=True)
        self._pending[kind] = step
        if not self.async_save:
            self._settle()
        self._last_save = _clock()

    @contextlib.contextmanager
    def _disk_errors(self, step: int):
        """A save that fails on the disk (full, quota, read-only: an OSError, or Orbax's or
        TensorStore's error that carries one) becomes one line, exit 74, after the temporary
        folders of the unfinished checkpoint are removed (issue 39: nothing half-made); the
        newest complete checkpoint is untouched."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 - examined, re-raised unless the disk's
            reason = _disk_reason(e)
            if reason is None:
                raise
            self._close_quietly()       # background writers stop before the clean-up
            self._remove_unfinished()
            from ladder.io import EX_IOERR, InputError
            raise InputError(f"checkpoint of step {step} could not be written ({reason}); "
                             f"the newest complete one is step {self._done}; make room and "
                             f"continue with --resume", path=self.root,
                             exit_code=EX_IOERR) from None

    def _remove_unfinished(self) -> None:
        """Orbax's temporary folders removed until two passes 0.2 s apart find none (at most
        ~5 s): writes of the failed save may land after the managers closed and recreate them."""
        from orbax.checkpoint._src.path.step import TMP_DIR_SUFFIX

        quiet = 0
        for _ in range(25):
            found = []
            for folder in (self.root, self.root / ROLLING):
                try:
                    found += [q for q in Path(folder).iterdir() if TMP_DIR_SUFFIX in q.name]
                except (OSError, TypeError):
                    continue
            for q in found:
                shutil.rmtree(q, ignore_errors=True)
            quiet = 0 if found else quiet + 1
            if quiet == 2:
                return
            time.sleep(0.2)

    def done_step(self) -> int:
        """The newest step whose checkpoint is complete, as this process sees it (no
        collective: for what process 0 writes in the summary). A background save that ended is
        complete only once its folder is in place: a failed one ends too, and is told at the
        next save or close."""
        for kind, mngr in (("permanent", self.permanent), (ROLLING, self.rolling)):
            step = self._pending.get(kind)
            if step is not None and not mngr.is_saving_in_progress() and \
                    (mngr.directory / str(step)).is_dir():
                self._done = max(self._done, self._pending.pop(kind))
        return self._done

    def _settle(self) -> None:
        """Wait for every save in flight (all processes call this at the same points: a save,
        close), then drop a rolling checkpoint that a permanent one supersedes."""
        with self._disk_errors(max(self._pending.values(), default=self._done)):
            self.permanent.wait_until_finished()
            self.rolling.wait_until_finished()
        self._done = max([self._done, *self._pending.values()])
        self._pending = {}
        kept, roll = self.permanent.latest_step(), self.rolling.latest_step()
        if kept is not None and roll is not None and roll <= kept:
            self.rolling.delete(roll)

    def restore(self, step: int, like, data_iterator=None):
        """The train state of ``step`` with the shardings of ``like``; ``data_iterator`` (a
        Grain iterator), when given, is set to its saved state."""
        import jax
        import orbax.checkpoint as ocp

        mngr = self._holder(step)
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like)
        step_dir = mngr.directory / str(step)    # a pathlib or etils path
        items = {"state": ocp.args.StandardRestore(abstract)}
        if data_iterator is not None:
            from grain.checkpoint import CheckpointRestore

            if not (step_dir / "data").is_dir():
                raise ValueError(f"checkpoint {step_dir} has no data iterator state; it was not "
                                 f"written by a run on token shards")
            items["data"] = CheckpointRestore(data_iterator)
        return mngr.restore(step, args=ocp.args.Composite(**items))["state"]

    def _holder(self, step: int):
        return self.permanent if step in self.permanent.all_steps() else self.rolling

    def restore_latest(self, like, data_iterator=None):
        """``(step, state)`` of the newest checkpoint that restores, ``(0, like)`` when there
        is none. A damaged one (Orbax cannot read it back: a truncated array file, a torn
        metadata file) is named in one line, set aside as ``<step>.damaged`` (kept for a look,
        never listed as a step again), and the next older one is tried (issue 39)."""
        steps = sorted({*self.permanent.all_steps(), *self.rolling.all_steps()}, reverse=True)
        for step in steps:
            try:
                return step, self.restore(step, like, data_iterator)
            except Exception as e:  # noqa: BLE001 - any failure to read it back is damage
                older = [s for s in steps if s < step]
                where = self._set_aside(step)
                log.warning("checkpoint of step %d is damaged (%s: %s); set aside as %s; %s",
                            step, type(e).__name__, str(e).splitlines()[0][:160] if str(e)
                            else "", where, f"resuming from step {older[0]}" if older else
                            "no older checkpoint: starting from step 0")
        return 0, like

    def _set_aside(self, step: int) -> str:
        """Rename the damaged ``step`` out of Orbax's sight (process 0 only: the folder is
        shared by every process)."""
        import jax

        mngr = self._holder(step)
        src = mngr.directory / str(step)
        dst = mngr.directory / f"{step}.damaged"
        if dst.exists():
            dst = mngr.directory / f"{step}.damaged-{int(time.time())}"
        if jax.process_index() == 0:
            src.rename(dst)
        mngr.reload()
        return str(dst)

    def close(self) -> None:
        """Wait for the saves in flight (a failed background write raises here), then close."""
        if self._closed:
            return
        try:
            self._settle()
        except BaseException:
            self._close_quietly()   # the first error is the one told
            raise
        self._closed = True
        self.permanent.close()
        self.rolling.close()
        _quiet(-1)

    def _close_quietly(self) -> None:
        """Close after a failure. The quiet below stays on for good: the failed save's writes go
        on finishing (and calling back) after the managers are closed."""
        if self._closed:
            return
        self._closed = True
        for mngr in (self.permanent, self.rolling):
            with contextlib.suppress(Exception):
                mngr.close()
        atexit.unregister(ignore_dropped_writes)   # registered once, however many failed
        atexit.register(ignore_dropped_writes)


# While any Checkpoints is open, and after one failed, the noise of an Orbax failure that its one
# line tells is dropped (a full disk was ~750 to 1,000 lines of tracebacks before that line):
# Orbax's log records of a disk error, one from each of its threads, and the "RuntimeError: Event
# loop is closed" tracebacks of TensorStore's threads, whose reads and writes (of a damaged
# checkpoint, of a failed save) finish after Orbax has closed the event loop they call back into.
_open = 0
_hook_before = None


def _quiet(change: int) -> None:
    """``change`` the count of open Checkpoints: the quiet is on while it is above 0 (put back
    if another hook replaced it meanwhile), and off, as before, when it comes back to 0."""
    global _open, _hook_before
    _open += change
    absl = logging.getLogger("absl")
    if _open > 0:
        absl.addFilter(_told_by_us)     # a filter already there is not added twice
        if sys.unraisablehook is not _drop_closed_loop:
            _hook_before, sys.unraisablehook = sys.unraisablehook, _drop_closed_loop
    else:
        absl.removeFilter(_told_by_us)
        if sys.unraisablehook is _drop_closed_loop:   # not if someone put another in since
            sys.unraisablehook = _hook_before
        _hook_before = None


def ignore_dropped_writes() -> None:
    """Ignore, under the current warning filters, the RuntimeWarning of a coroutine dropped
    unawaited: the writes of a failed save that Orbax never started. It comes when the garbage
    collector reaches them, at any later moment: in-process during another command (the command
    line sets this in each command's warning filters), often only as Python shuts down (set at
    exit after a failed save). It names an Orbax internal, nothing a user can act on."""
    warnings.filterwarnings("ignore", message=r"coroutine '.*' was never awaited",
                            category=RuntimeWarning)


def _drop_closed_loop(u) -> None:
    if not (isinstance(u.exc_value, RuntimeError) and str(u.exc_value) == "Event loop is closed"):
        (_hook_before or sys.__unraisablehook__)(u)


def _told_by_us(record: logging.LogRecord) -> bool:
    """False for Orbax's log records of a disk error (a traceback from each of its threads):
    :meth:`Checkpoints._disk_errors` tells it in one line."""
    e = record.exc_info[1] if record.exc_info else None
    return _disk_reason(e) is None and _disk_words(record.getMessage()) is None


def _disk_reason(e: BaseException) -> str | None:
    """The disk's reason (a few words) when ``e`` or an exception it came from is a disk error
    (:data:`DISK_ERRNOS`, or TensorStore's message of one); None otherwise."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
            return (e.strerror or str(e)).lower()
        words = _disk_words(str(e))
        if words is not None:
            return words
        e = e.__cause__ or e.__context__
    return None


def _disk_words(text: str) -> str | None:
    """The :data:`DISK_WORDS` that ``text`` holds, if any."""
    text = text.lower()
    return next((words for words in DISK_WORDS if words in text), None)
