"""How ladder runs are named and placed in Weights & Biases (wandb is imported by the callers).

Every W&B run of a ladder lands in one project, grouped by the ladder, named by the rung and typed
(shared/DESIGN.md section 5): ``train`` (``ladder run --wandb``), ``forecast`` (``ladder
preregister --wandb``, under the watched key itself: ``band_keys``) and ``watch`` (``ladder watch
--wandb``). Step, tokens and FLOPs are logged as metrics so a panel can use any as its x axis.
"""

from __future__ import annotations

import os

DEFAULT_PROJECT = "ladder"
JOB_TYPES = ("train", "forecast", "watch")
# the x axes logged as metrics in every row (W&B's own _step is the row counter)
X_AXES = ("step", "tokens", "flops")


def resolve(entity: str | None, project: str | None) -> tuple[str | None, str]:
    """Entity and project: the option, else WANDB_ENTITY / WANDB_PROJECT, else W&B's default
    entity (None) and the project 'ladder'."""
    entity = entity or os.environ.get("WANDB_ENTITY") or None
    project = project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
    return entity, project


def tags(ladder: str | None, rung: str | None, job_type: str, *extra: str) -> list[str]:
    """Tags of a run: its ladder, rung and job type (W&B filters by tag across groups)."""
    if job_type not in JOB_TYPES:
        raise ValueError(f"job_type: must be one of {JOB_TYPES}, got {job_type!r}")
    out = [job_type]
    if ladder:
        out.append(f"ladder:{ladder}")
    if rung:
        out.append(f"rung:{rung}")
    return out + [t for t in extra if t]


def forecast_run_id(prereg_sha256: str) -> str:
    """The W&B run id of a pre-registration's forecast run: a function of its sha256, so `ladder
    watch --wandb` finds the run `ladder preregister --wandb` made without being told its id."""
    if not prereg_sha256 or not all(c in "0123456789abcdef" for c in prereg_sha256):
        raise ValueError(f"prereg_sha256: must be a hex digest, got {prereg_sha256!r}")
    return f"forecast-{prereg_sha256[:24]}"


def watch_run_id(prereg_sha256: str) -> str:
    """The W&B run id of the watcher of a pre-registration (`ladder watch --wandb`): a function
    of its sha256, so a restarted watcher resumes its own run."""
    return "watch-" + forecast_run_id(prereg_sha256).removeprefix("forecast-")


def band_keys(metric: str) -> tuple[str, str, str]:
    """The keys a forecast run logs its centre and band under: the watched key itself (so W&B's
    default panel of that key overlays the forecast on the live runs of the group) and its band
    beside it (same section of the workspace: W&B groups panels by the key's first part)."""
    return metric, f"{metric}_lo", f"{metric}_hi"


def define_axes(run, prefixes) -> None:
    """Declare the x-axis metrics of ``run`` and plot every ``prefix/*`` key against ``step`` by
    default (tokens and FLOPs are one click away in the panel's x-axis menu)."""
    for x in X_AXES:
        run.define_metric(x, summary="max")
    for p in prefixes:
        run.define_metric(f"{p}/*", step_metric="step")
