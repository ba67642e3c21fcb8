"""What a command prints once its result is on disk: a command that writes an artifact writes it
first and prints after, through :func:`tell`, so a reader that went away (``ladder fit runs |
head``) costs the rest of the printout, never the artifact or the exit status. A command whose
result *is* its printout (``ladder list``) prints; a closed pipe ends it with 141 (cli.main)."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

from ladder.trainer.checkpointing import ignore_dropped_writes


def tell(*values, file=None, sep: str = " ") -> bool:
    """``print(*values, file=file)`` and a flush, so that a closed pipe shows here and not at
    exit. On a closed pipe the stream is pointed at /dev/null (what it still holds, and every
    later line, goes nowhere, without a second error when Python flushes at exit) and False is
    returned; True when the line went out."""
    stream = file if file is not None else sys.stdout
    try:
        print(*values, sep=sep, file=stream, flush=True)
        return True
    except BrokenPipeError:
        silence(stream)
        return False


def silence(stream) -> None:
    """Point ``stream``'s file descriptor at /dev/null (a stream without one is left alone)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


@contextlib.contextmanager
def recorded_warnings():
    """The warnings raised inside, each time it is raised, in the list this yields, for the
    command to print in its own words (but not Orbax's dropped writes: ignore_dropped_writes)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ignore_dropped_writes()
        yield caught
