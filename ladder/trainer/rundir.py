"""The run directory a training run writes (the contract of shared/DESIGN.md): config.json,
env.json, metrics.jsonl, summary.json (checkpoints/ is checkpointing.py's), and the W&B
mirror of its metrics. Every file is written atomically; only the writing process (process 0 of
a multi-host run) changes any of them.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import time
from pathlib import Path

from ladder import __version__, git_state
from ladder.counting import conventions
from ladder.io import (
    EX_USAGE,
    InputError,
    atomic_write_text,
    iter_jsonl,
    known_schema,
    read_json,
    to_jsonable,
)
from ladder.specs import Rung
from ladder.trainer import gpuenv
from ladder.trainer.data import Corpus
from ladder.trainer.trainconfig import RUN_ARGUMENTS, RunArgs, TrainConfig

RUN_CONFIG_SCHEMA = "run-config/1"
SUMMARY_SCHEMA = "run-summary/1"
ENV_SCHEMA = "run-env/1"


# What a run writes in its folder (ladder.io.claim: a file or folder of these names that ladder
# did not write there is refused, never replaced or deleted)
RUN_FILES = ("config.json", "env.json", "metrics.jsonl", "summary.json", "checkpoints",
             "profile", "wandb")


def environment(corpus: Corpus, mesh_info: dict, peak: dict) -> dict:
    import importlib.metadata as md

    import jax
    versions = {}
    for pkg in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "wandb", "tqdm"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    devs = jax.devices()
    return {
        "schema": ENV_SCHEMA, "ladder_version": __version__, "git": git_state(),
        "python": platform.python_version(), "platform": platform.platform(),
        "hostname": socket.gethostname(), "versions": versions,
        "devices": {"backend": jax.default_backend(), "count": len(devs),
                    "kind": devs[0].device_kind, "process_count": jax.process_count()},
        "mesh": mesh_info, "peak_flops": peak, "corpus": corpus.fingerprint,
        # the XLA/allocator settings ladder.trainer.gpuenv set on a GPU, and the user's
        "gpu_env": gpuenv.applied(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "started": time.time(),
    }


class MetricsFile:
    """metrics.jsonl: one row per logged step, appended and flushed; cut back on resume.
    Only the writing process (process 0 of a multi-host run) changes it; the others read it."""

    def __init__(self, path: Path, writer: bool = True):
        self.path = path
        self.writer = writer
        self._f = None

    def truncate_to(self, step: int) -> None:
        """Keep only complete rows with ``step <= step`` (atomic rewrite); drop the rest."""
        if not self.writer or not self.path.exists():
            return
        rows = [r for _, r in iter_jsonl(self.path)
                if isinstance(r.get("step"), int) and r["step"] <= step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in rows))

    def rows(self) -> list[dict]:
        return [r for _, r in iter_jsonl(self.path)] if self.path.exists() else []

    def append(self, row: dict) -> None:
        if not self.writer:
            return
        if self._f is None:
            self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (held open)
        self._f.write(json.dumps(to_jsonable(row), allow_nan=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class WandbMirror:
    """Mirrors metrics rows to Weights & Biases (WANDB_MODE=offline works without network):
    grouped by the ladder, named by the rung, job type ``train`` (``ladder.wandbrun``); ``step``,
    ``tokens`` and ``flops`` are metrics, so any can be a panel's x axis. The same W&B run id is
    reused on resume; its local directory (a `ladder watch` source) is in summary.json."""

    PREFIXES = ("train", "eval", "eval_dropless", "optim", "grad", "params", "moe", "throughput")

    def __init__(self, out_dir: Path, rung: Rung, run: RunArgs, run_id: str | None,
                 config: dict):
        import wandb

        from ladder import wandbrun

        entity, project = wandbrun.resolve(run.wandb_entity, run.wandb_project)
        self.run = wandb.init(entity=entity, project=project, group=rung.ladder, name=rung.name,
                              job_type="train", tags=wandbrun.tags(rung.ladder, rung.name,
                                                                   "train"),
                              dir=str(out_dir), id=run_id, resume="allow",
                              config={**config, **sizes(rung)}, reinit="finish_previous")
        # the sizes in the summary too: the runs table shows summary columns beside config
        self.run.summary.update(sizes(rung))
        wandbrun.define_axes(self.run, self.PREFIXES)
        self.info = {"id": self.run.id, "dir": str(Path(self.run.dir).parent),
                     "mode": os.environ.get("WANDB_MODE", "online"), "entity": entity,
                     "project": project, "group": rung.ladder, "name": rung.name,
                     "job_type": "train"}

    def log(self, row: dict) -> None:
        self.run.log(dict(row), step=int(row["step"]))

    def finish(self, exit_code: int = 0) -> None:
        self.run.finish(exit_code=exit_code)


def sizes(rung: Rung) -> dict:
    """What a run is, flat: its ladder and rung names, parameter counts, tokens and compute (the
    one counter, ladder.counting, through the rung), as W&B's config and summary carry them
    (``tokens_planned``: the run logs ``tokens``, the tokens seen, as a metric of its own)."""
    p, pe = rung.params, rung.params_exact
    return {"ladder": rung.ladder, "rung_name": rung.name, "is_target": rung.is_target,
            "params": p.total, "active_params": p.active, "param_convention": p.convention,
            "params_exact": pe.total, "active_params_exact": pe.active,
            "tokens_planned": rung.tokens,
            "compute": rung.compute(lm_head=False),
            "compute_with_lm_head": rung.compute(lm_head=True)}


def summary(rung: Rung, status: str, step: int, cfg: TrainConfig, peak: dict,
            wandb_info: dict | None, final: dict | None = None) -> dict:
    """summary.json: the run's status, sizes under their conventions, compute, and its final
    evaluation once complete."""
    p, pe = rung.params, rung.params_exact
    tokens_seen = step * rung.tokens_per_step
    s = {"schema": SUMMARY_SCHEMA, "status": status, "step": step, "steps": rung.steps,
         "ladder": rung.ladder, "rung": rung.name, "is_target": rung.is_target,
         "params": p.total, "active_params": p.active, "param_convention": p.convention,
         "params_exact": pe.total, "active_params_exact": pe.active,
         "tokens": rung.tokens, "tokens_seen": tokens_seen,
         "compute": rung.compute(lm_head=False), "compute_with_lm_head": rung.compute(lm_head=True),
         "compute_seen": rung.compute(tokens_seen), "peak_lr": rung.peak_lr,
         "seq_len": rung.seq_len, "batch": rung.batch, "seed": cfg.seed,
         "conventions": conventions(), "peak_flops": peak, "final": final or {},
         "updated": time.time()}
    if cfg.fault:
        s["fault"] = {"kind": cfg.fault.kind, "from_step": cfg.fault.first_step(rung.steps) + 1,
                      "scale": cfg.fault.scale if cfg.fault.kind == "lr-spike" else None}
    if wandb_info:
        s["wandb"] = wandb_info
    return s


def previous_run(out: Path, config: dict, resume: bool) -> dict | None:
    """The summary of an earlier run in ``out`` (None if there is none); InputError when it is
    a different run, or an unfinished one and ``resume`` is off."""
    if not (out / "summary.json").exists() and not (out / "checkpoints").exists():
        return None
    found = {"status": "running"}
    if (out / "summary.json").exists():
        found = read_json(out / "summary.json", schema="run-summary")
        # the version this trainer writes (ladder.sources.runs reads the same list); not
        # imported from there: the trainer runs on images without orjson (tests/test_bench_bare)
        known_schema(found, (SUMMARY_SCHEMA,), path=out / "summary.json")
    if (out / "config.json").exists():
        old = read_json(out / "config.json", schema="run-config")
        if old.get("rung") != json.loads(json.dumps(to_jsonable(config["rung"]))):
            raise InputError("the run directory holds a different rung; use another --out",
                             path=out / "config.json", field="rung", exit_code=EX_USAGE)
        old_train = old.get("train", {})
        for key, value in json.loads(json.dumps(to_jsonable(config["train"]))).items():
            if key not in RUN_ARGUMENTS and old_train.get(key) != value:
                raise InputError(f"differs from the run in this directory ({old_train.get(key)!r}"
                                 f" there, {value!r} now); use another --out",
                                 path=out / "config.json", field=f"train.{key}",
                                 exit_code=EX_USAGE)
    if found.get("status") in ("complete", "diverged"):
        return found
    if not resume:
        raise InputError(f"holds an unfinished run (status {found.get('status')!r}); pass "
                         f"--resume to continue it or remove the directory", path=out,
                         exit_code=EX_USAGE)
    return found

