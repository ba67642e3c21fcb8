"""A run's checkpoints: permanent ones on the rung's schedule and rolling ones for preemption.

``checkpoints/<step>/`` are the permanent checkpoints (every 25% of the run or every
``checkpoint_every`` steps; the last ``keep`` are kept). ``checkpoints/rolling/<step>/`` holds at
most one more: the latest time-based checkpoint (``checkpoint_minutes``; the real hero kept one an
hour) or the one written when a signal stopped the run. A rolling checkpoint never evicts a
permanent one, and resume starts from the newest of either kind.

Each checkpoint is an Orbax composite: ``state`` (the sharded train state; every process writes
its own shards) and, when the data pipeline has state (Grain over token shards), ``data`` (each
process's iterator state, written by Grain's own Orbax handler as one JSON file per process).
Saves are synchronous: when ``save`` returns the step directory has been renamed into place, so a
summary written after it never points at a half-written checkpoint. Checkpoints written before
this layout (one ``default`` item) are still restored.
"""

from __future__ import annotations

from pathlib import Path
from time import monotonic as _clock  # a module global, so a test can drive the clock

ROLLING = "rolling"


def _manager(path: Path, keep: int):
    import orbax.checkpoint as ocp

    return ocp.CheckpointManager(path.resolve(), options=ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True, enable_async_checkpointing=False,
        cleanup_tmp_directories=True))


class _StateSnapshot:
    """What Grain's checkpoint handler needs of an iterator (``get_state``), for a state taken
    earlier: the trainer has already drawn the next batch when it saves."""

    def __init__(self, state: bytes):
        self._state = state

    def get_state(self) -> bytes:
        return self._state


class Checkpoints:
    """Permanent and rolling checkpoints of one run directory (see the module docstring)."""

    def __init__(self, root: Path, keep: int, minutes: float | None = None):
        self.root = Path(root)
        self.permanent = _manager(self.root, keep)
        self.rolling = _manager(self.root / ROLLING, 1)
        self.interval_s = None if not minutes else 60.0 * minutes
        self._last_save = _clock()

    def latest_step(self) -> int:
        steps = [m.latest_step() for m in (self.permanent, self.rolling)]
        return max((s for s in steps if s is not None), default=0)

    def due(self) -> bool:
        """A time-based checkpoint is due: ``checkpoint_minutes`` since the last save."""
        return self.interval_s is not None and \
            _clock() - self._last_save >= self.interval_s

    def save(self, step: int, state, data_state: bytes | None = None, *,
             rolling: bool = False) -> None:
        import orbax.checkpoint as ocp

        items = {"state": ocp.args.StandardSave(state)}
        if data_state is not None:
            from grain.checkpoint import CheckpointSave

            items["data"] = CheckpointSave(_StateSnapshot(data_state))
        mngr = self.rolling if rolling else self.permanent
        mngr.save(step, args=ocp.args.Composite(**items), force=True)
        mngr.wait_until_finished()
        if not rolling and self.rolling.latest_step() is not None \
                and self.rolling.latest_step() <= step:
            # a permanent checkpoint supersedes the rolling one: keep disk to the permanent set
            self.rolling.delete(self.rolling.latest_step())
        self._last_save = _clock()

    def restore(self, step: int, like, data_iterator=None):
        """The train state of ``step`` with the shardings of ``like`` (a state of the same
        structure); ``data_iterator`` (a Grain iterator), when given, is set to its saved state."""
        import jax
        import orbax.checkpoint as ocp

        mngr = self.permanent if step in self.permanent.all_steps() else self.rolling
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like)
        step_dir = Path(mngr.directory) / str(step)
        if (step_dir / "default").is_dir():  # the single-item layout of earlier versions
            legacy = ocp.CheckpointManager(Path(mngr.directory), options=ocp.
                                           CheckpointManagerOptions(read_only=True))
            try:
                return legacy.restore(step, args=ocp.args.StandardRestore(abstract))
            finally:
                legacy.close()
        items = {"state": ocp.args.StandardRestore(abstract)}
        if data_iterator is not None:
            from grain.checkpoint import CheckpointRestore

            if not (step_dir / "data").is_dir():
                raise ValueError(f"checkpoint {step_dir} has no data iterator state; it was not "
                                 f"written by a run on token shards")
            items["data"] = CheckpointRestore(data_iterator)
        return mngr.restore(step, args=ocp.args.Composite(**items))["state"]

    def close(self) -> None:
        self.permanent.close()
        self.rolling.close()
