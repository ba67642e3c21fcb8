"""Whole ladders on a Ray cluster: each rung one Ray task, the same run directories as a local run.

``run_ladder_ray`` submits every rung as a Ray task that calls ``train.train_rung`` into
``LADDER_DIR/RUNG/`` on a filesystem the workers share, with the rung's resource request (Ray
runs the rungs that fit and queues the rest), and prints one line per rung status change, read
from the rung's ``summary.json``. A rung whose task fails (an exception, a lost worker or node)
or is preempted (SIGTERM: it checkpointed and stopped) is submitted again with ``resume=True``,
up to ``max_retries`` times; bad input is never retried. Each task runs in a fresh worker
process (``max_calls=1``), which releases its JAX runtime and device memory. Ray is optional
(``pip install 'ladder[ray]'``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ladder.io import EX_USAGE, InputError
from ladder.sources.runs import read_summary

RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory", "resources", "accelerator_type")
DEFAULT_RESOURCES = {"num_cpus": 1}
POLL_S = 1.0   # how often the driver looks at the rungs' summaries (a few small file reads)
# After the driver is stopped, how long running rungs get to checkpoint before they are killed
# (a checkpoint of a CPU rung takes ~1 s here; a large sharded state can take minutes).
STOP_GRACE_S = 600
# Environment a rung task needs from the driver's (a remote cluster's workers have their own).
PASS_ENV = ("LADDER_JAX_CACHE", "XLA_FLAGS", "JAX_PLATFORMS", "WANDB_MODE", "WANDB_API_KEY",
            "WANDB_DIR", "WANDB_SILENT")


def parse_resources(text: str | None, rung_names: list[str]) -> dict[str, dict]:
    """``--resources-per-rung`` -> Ray task options (:data:`RESOURCE_KEYS`; memory in bytes) per
    rung name: one object for every rung (``{"num_gpus": 8}``), or one per rung name with
    ``"*"`` for the rest (``{"*": {"num_cpus": 1}, "27.7B-A1.2B": {"num_gpus": 8}}``)."""
    where = "--resources-per-rung"
    if text is None:
        return {name: dict(DEFAULT_RESOURCES) for name in rung_names}
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"not JSON ({e.msg} at column {e.colno})", field=where,
                         exit_code=EX_USAGE) from None
    if not isinstance(obj, dict):
        raise InputError("must be a JSON object", field=where, exit_code=EX_USAGE)
    per_rung = bool(obj) and all(isinstance(v, dict) for v in obj.values()) \
        and not set(obj) & set(RESOURCE_KEYS)
    if not per_rung:
        obj = {"*": obj}
    unknown = sorted(set(obj) - set(rung_names) - {"*"})
    if unknown:
        raise InputError(f"no rung {unknown[0]!r} here (rungs: {', '.join(rung_names)})",
                         field=f"{where}.{unknown[0]}", exit_code=EX_USAGE)
    out = {}
    for name in rung_names:
        opts = obj.get(name, obj.get("*", DEFAULT_RESOURCES))
        for key, value in opts.items():
            path = f"{where}.{name if name in obj else '*'}.{key}"
            if key not in RESOURCE_KEYS:
                raise InputError(f"unknown option (known: {', '.join(RESOURCE_KEYS)})",
                                 field=path, exit_code=EX_USAGE)
            ok = (isinstance(value, dict) and all(isinstance(v, (int, float)) and v >= 0
                                                  for v in value.values())
                  if key == "resources" else isinstance(value, str) if key == "accelerator_type"
                  else isinstance(value, (int, float)) and not isinstance(value, bool)
                  and value >= 0)
            if not ok:
                raise InputError(f"bad value {value!r}", field=path, exit_code=EX_USAGE)
        out[name] = dict(opts)
    return out


@dataclass
class RungOutcome:
    """What became of one rung: its final summary (None if every attempt failed)."""

    name: str
    out: Path
    attempts: int = 0
    summary: dict | None = None
    errors: list[str] = field(default_factory=list)
    cancelled: bool = False      # stopped with the driver before it started

    @property
    def status(self) -> str:
        return self.summary["status"] if self.summary else "failed"


def rung_exit_code(s: dict) -> int:
    """The exit status a rung's summary stands for: 0 done or stopped at --max-steps, 1
    diverged, 130 stopped by Ctrl-C, 143 stopped by SIGTERM (a preemption, or a peer's)."""
    from ladder.io import EX_TERMINATED
    from ladder.trainer.train import EX_DIVERGED, EX_INTERRUPTED

    if s["status"] == "diverged":
        return EX_DIVERGED
    if s.get("interrupted"):
        return EX_INTERRUPTED if s.get("signal") == "SIGINT" else EX_TERMINATED
    return 0


@dataclass
class LadderResult:
    outcomes: list[RungOutcome]
    signal: str | None = None    # the signal that stopped the driver, if one did

    @property
    def exit_code(self) -> int:
        """0 when every rung completed or stopped at --max-steps; 1 when one diverged or failed
        after its retries; 143/130 when the driver or a rung was stopped by SIGTERM/SIGINT (the
        rungs checkpointed: run again with --resume)."""
        from ladder.io import EX_TERMINATED
        from ladder.trainer.train import EX_INTERRUPTED

        stopped = self.signal is not None
        codes = [1 if o.summary is None and not (stopped and o.cancelled) else
                 0 if o.summary is None else rung_exit_code(o.summary) for o in self.outcomes]
        if 1 in codes:
            return 1
        if stopped:
            return EX_INTERRUPTED if self.signal == "SIGINT" else EX_TERMINATED
        return max(codes, default=0)


def rung_task(rung, out: str, cfg, max_steps: int | None, resume: bool) -> dict:
    """One Ray task: train the rung into ``out``. Bad input comes back as a value
    (``{"input_error": ...}``), so that it is reported and never retried."""
    from ladder.trainer.train import train_rung

    try:
        return train_rung(rung, out, cfg, max_steps=max_steps, resume=resume)
    except InputError as e:
        return {"input_error": str(e), "exit_code": e.exit_code}


def _task_env() -> dict:
    """Environment of a rung task: this checkout importable, and the driver's JAX/W&B settings."""
    root = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, **{k: os.environ[k] for k in PASS_ENV if k in os.environ}}


def run_ladder_ray(rungs: list, ladder_dir: str | os.PathLike, cfg, *,
                   max_steps: int | None = None, resume: bool = False,
                   address: str | None = None, resources: dict[str, dict] | None = None,
                   max_retries: int = 2, poll_s: float = POLL_S,
                   log: Callable[[str], None] | None = None,
                   task: Callable = rung_task) -> LadderResult:
    """Train ``rungs`` as Ray tasks into ``ladder_dir/RUNG/`` (module docstring). Connects to
    ``address`` (None: ``RAY_ADDRESS`` or a new local Ray) unless Ray is already initialised
    here (then that cluster is used and left running). ``task``: what each Ray task runs (a test
    passes a flaky one). Raises InputError when a rung's input is bad."""
    try:
        import ray
    except ImportError:
        raise InputError("Ray is not installed; pip install 'ladder[ray]'", field="--executor",
                         exit_code=EX_USAGE) from None
    log = log or (lambda line: print(line, flush=True))
    resources = resources or {r.name: dict(DEFAULT_RESOURCES) for r in rungs}
    ladder_dir = Path(ladder_dir)
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, log_to_driver=False, include_dashboard=False)
    remote = ray.remote(max_calls=1)(task)
    outcomes = {r.name: RungOutcome(r.name, ladder_dir / r.name) for r in rungs}
    by_name = {r.name: r for r in rungs}
    pending: dict = {}     # ObjectRef -> rung name
    submitted: dict = {}   # rung name -> time of its latest submission
    shown: dict = {}       # rung name -> last line shown of its progress

    def submit(name: str, resume_now: bool) -> None:
        o = outcomes[name]
        o.attempts += 1
        opts = resources[name]
        ref = remote.options(**opts, runtime_env={"env_vars": _task_env()}).remote(
            by_name[name], str(o.out), cfg, max_steps, resume_now)
        pending[ref] = name
        submitted[name] = time.time()

    def report(name: str, line: str) -> None:
        if shown.get(name) != line:
            shown[name] = line
            log(f"{ladder_dir.name}/{name}: {line}")

    from ladder.stopflag import StopFlag

    stop, grace_end = StopFlag(), None
    try:
        stop.__enter__()   # SIGINT/SIGTERM of the driver: the running rungs checkpoint and stop
        for r in rungs:
            submit(r.name, resume)
            report(r.name, f"queued ({json.dumps(resources[r.name], sort_keys=True)})")
        while pending:
            if stop.set and grace_end is None:
                # a non-forced cancel interrupts a running task with SIGINT, which train_rung
                # turns into a checkpoint at the next step boundary; queued ones never start
                grace_end = time.time() + STOP_GRACE_S
                log(f"{ladder_dir.name}: {stop.signal_name}: {len(pending)} rung(s) asked to "
                    f"checkpoint and stop")
                for ref in pending:
                    ray.cancel(ref, force=False)
            if grace_end is not None and time.time() > grace_end:
                log(f"{ladder_dir.name}: rungs still running after {STOP_GRACE_S} s; killed")
                break
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=poll_s)
            for ref in ready:
                name = pending.pop(ref)
                o = outcomes[name]
                try:
                    result = ray.get(ref)
                except (ray.exceptions.RayError, OSError) as e:
                    o.errors.append(str(e).strip().splitlines()[-1][:300] if str(e).strip()
                                    else type(e).__name__)
                    if stop.set and isinstance(e, ray.exceptions.TaskCancelledError):
                        o.cancelled = True
                        report(name, "cancelled before it started")
                    elif o.attempts <= max_retries and not stop.set:
                        s = read_summary(o.out) or {}
                        report(name, f"failed ({o.errors[-1]}); retry {o.attempts}/"
                                     f"{max_retries} from checkpoint step {s.get('step', 0)}")
                        submit(name, True)
                    else:
                        report(name, f"failed after {o.attempts} attempts: {o.errors[-1]}")
                    continue
                if "input_error" in result:
                    raise InputError(result["input_error"], exit_code=result["exit_code"])
                if result.get("signal") == "SIGTERM" and o.attempts <= max_retries \
                        and not stop.set:
                    # the rung's worker was preempted (its node is going away) and checkpointed
                    # on the way out: run it again, wherever Ray finds room
                    o.errors.append(f"preempted (SIGTERM) at step {result['step']}")
                    report(name, f"preempted at step {result['step']}; retry {o.attempts}/"
                                 f"{max_retries} from checkpoint step {result['step']}")
                    submit(name, True)
                    continue
                o.summary = result
                note = " (interrupted; continue with --resume)" if result.get("interrupted") \
                    else ""
                report(name, f"{result['status']} at step {result['step']}/{result['steps']}"
                             f"{note} -> {o.out}")
            for name in pending.values():   # progress of the rungs still running
                s = read_summary(outcomes[name].out)
                # written by this attempt (not left by an earlier run), while it trains
                if s and s.get("status") == "running" and \
                        s.get("updated", 0) >= submitted[name]:
                    report(name, f"running (checkpointed: step {s.get('step', 0)}/"
                                 f"{s.get('steps')})")
    finally:
        stop.__exit__(None, None, None)
        for ref in pending:
            ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()
    return LadderResult([outcomes[r.name] for r in rungs], stop.signal_name)


def print_problems(result: LadderResult) -> None:
    """One stderr line per rung that did not finish cleanly."""
    for o in result.outcomes:
        s, problem = o.summary, None
        if o.cancelled:
            problem = "not started (the run was stopped); continue with --resume"
        elif s is None:
            problem = (f"failed after {o.attempts} attempt(s): "
                       f"{o.errors[-1] if o.errors else 'unknown error'}")
        elif s.get("interrupted"):
            problem = (f"interrupted at step {s['step']} ({s.get('signal')}); checkpoint saved, "
                       f"continue with --resume")
        elif o.status == "diverged":
            problem = (f"diverged at step {s['step']} (non-finite loss); see "
                       f"{o.out / 'summary.json'}")
        if problem:
            print(f"ladder run: {o.out.parent.name}/{o.name} {problem}", file=sys.stderr)
