"""ladder: scaling ladders for MoE pre-training. This folder is the base every layer stands on:
inputs and atomic writes, ladders and rungs, counting, run directories (plain Python, no JAX);
the trainer is ``ladder.trainer``, the command line ``cli``.

Importing this package is cheap: nothing here imports JAX. The model layers, the trainer and
`plan` import JAX when they are used.
"""

__version__ = "0.1.0"


def git_state() -> dict:
    """The checkout this code runs from: ``{"sha": HEAD or None, "dirty": bool or None}``
    (dirty: ``git status --porcelain`` lists anything, untracked files included; None without
    git or outside a repository). Recorded in a run's env.json and a pre-registration."""
    import subprocess
    from pathlib import Path

    def git(*a):
        try:
            return subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), *a],
                                  capture_output=True, text=True, timeout=10,
                                  check=False).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    sha = git("rev-parse", "HEAD")
    return {"sha": sha or None, "dirty": bool(git("status", "--porcelain")) if sha else None}
