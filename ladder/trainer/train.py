"""The training loop: one rung of a ladder into one run directory.

``train_rung(rung, out_dir, cfg)`` checks its input, opens a :class:`Session` (data, mesh,
compiled step, restored state, run directory) and runs ONE visible loop: step, log, eval,
checkpoint. Batch i is a pure function of (seed, i) (on token shards: a Grain iterator whose
state every checkpoint saves) and the LR of step i of i, so a run resumed at step k recomputes
steps k+1... as the uninterrupted run did (bitwise on CPU); metrics.jsonl is cut back
(atomically) to the rows of steps <= k, so no row is duplicated or lost.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import numpy as np

from ladder.io import EX_USAGE, InputError, atomic_write_json, claim, folder_lock, read_json
from ladder.lrtable import run_lr_table
from ladder.specs import Rung
from ladder.stopflag import StopFlag
from ladder.trainer import distributed, gpuenv
from ladder.trainer.checkpointing import Checkpoints
from ladder.trainer.data import check_vocab, corrupt_bytes, load_corpus, shuffle_bytes
from ladder.trainer.rundir import (
    RUN_CONFIG_SCHEMA,
    RUN_FILES,
    MetricsFile,
    WandbMirror,
    environment,
    previous_run,
    summary,
)
from ladder.trainer.layout import run_layout
from ladder.trainer.step import batch_sharding, enable_compilation_cache, make_mesh, programs
from ladder.trainer.trainconfig import (
    TrainConfig,
    check_cell,
    checkpoint_steps,
    eval_batch_size,
    eval_sequences,
    microbatch_size,
    profile_range,
    resolve_rung,
)

EX_DIVERGED = 1        # a diverged run exits 1 (it is not an input error: those are 64+)
EX_INTERRUPTED = 130   # Ctrl-C, as shells report SIGINT


@lru_cache(maxsize=1)
def measure_peak_flops(n: int = 2048, repeats: int = 3) -> float:
    """FLOP/s of an n x n float32 matmul on the default device (best of ``repeats``)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    mm = jax.jit(lambda x: x @ x)
    mm(a).block_until_ready()
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        mm(a).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2.0 * n ** 3 / best


def peak_flops_info(per_device: float | None, devices: int) -> dict:
    """The peak FLOP/s that MFU divides by, and where it came from: ``per_device`` (the
    ``peak_flops`` setting), else one device's nominal dense bf16 peak
    (:data:`ladder.accelerators.ACCELERATORS`) x the devices. On CPU the peak is measured (a
    float32 matmul) and NOT multiplied by the device count: fake host devices share the cores."""
    import jax

    from ladder.accelerators import accelerator_peak

    dev = jax.devices()[0]
    kind = dev.device_kind
    entry = None if per_device or dev.platform == "cpu" else accelerator_peak(kind)
    if per_device or entry is not None:
        rate = float(per_device) if per_device else entry["flops"]
        return {"flops_per_s": rate, "devices": devices, "total_flops_per_s": rate * devices,
                "device_kind": kind, "source": "config (peak_flops, per device)" if per_device
                else f"{entry['name']} bf16 dense, {entry['source']}"}
    rate = measure_peak_flops()
    return {"flops_per_s": rate, "devices": devices, "device_kind": kind,
            "total_flops_per_s": rate if dev.platform == "cpu" else rate * devices,
            "source": "measured: 2048x2048 f32 matmul on the host (all devices share it)"
            if dev.platform == "cpu" else
            f"measured: 2048x2048 f32 matmul x {devices} devices ({kind!r} is not in "
            f"ladder.accelerators.ACCELERATORS; pass --peak-flops)"}

# ------------------------------------------------------------------------------ the run


def train_rung(rung: Rung, out_dir: str | os.PathLike, cfg: TrainConfig | None = None, *,
               max_steps: int | None = None, resume: bool = True,
               on_metrics: Callable[[dict], None] | None = None) -> dict:
    """Train ``rung`` into ``out_dir`` and return its summary (the dict written to summary.json).

    A completed (or diverged) run is not retrained: its summary is returned. An unfinished one
    is resumed from its latest checkpoint when ``resume``, else it is an InputError.
    ``max_steps`` stops after that many steps of the planned schedule (status stays "running").
    ``on_metrics(row)`` sees every metrics row as it is written. Bad input raises InputError
    before anything is written. Divergence returns status "diverged"; Ctrl-C or SIGTERM
    checkpoints and returns status "running" with ``"interrupted": True`` and the signal's name.
    Under ``jax.distributed`` every process calls this; process 0 writes the run directory.
    """
    cfg = cfg or TrainConfig()
    t_start = time.perf_counter()
    if max_steps is not None and max_steps < 1:
        raise InputError(f"must be >= 1, got {max_steps}", field="max_steps", exit_code=EX_USAGE)
    gpuenv.apply()   # before anything below starts JAX's backend (a no-op off GPUs)
    # on an accelerator, precision, remat and microbatch left open are chosen to fit its memory
    layout = run_layout(rung, cfg)
    if layout is not None:
        cfg = layout.train_config(cfg)
    out = Path(out_dir)
    # a second run into the folder (a resubmitted job) is refused in one line: locked before it
    # is read when it exists; a new one is created only after the checks
    with contextlib.ExitStack() as held:
        locked = out.is_dir() and held.enter_context(run_lock(out))
        checked = _check(rung, out, cfg, resume)   # bad input fails here, nothing written
        if isinstance(checked, dict):
            return checked  # finished: a diverged run would only diverge again from its checkpoint
        checked[3]["layout"] = layout.to_dict() if layout is not None else None
        if not locked:
            held.enter_context(run_lock(out))
        if distributed.is_writer():
            claim(out, RUN_FILES, what="ladder run")  # only files a run wrote are replaced
        return _train(checked, cfg, max_steps, on_metrics, t_start)


def run_lock(out: Path):
    """The run folder's lock (held by the process that writes it: process 0 of a multi-host
    run; the others write only their checkpoint shards)."""
    if not distributed.is_writer():
        return contextlib.nullcontext(True)
    return folder_lock(out, what="ladder run", field="--out")


def _train(checked: tuple, cfg: TrainConfig, max_steps: int | None,
           on_metrics: Callable[[dict], None] | None, t_start: float) -> dict:
    """The loop of :func:`train_rung` in its checked and locked run folder."""
    s = Session(*checked, cfg=cfg, on_metrics=on_metrics)
    rung, start = s.rung, s.start
    stop = min(rung.steps, max_steps or rung.steps)
    evals, saves = set(rung.eval_steps()), checkpoint_steps(rung, cfg.run)
    interrupted = StopFlag()
    profile = _Profile(cfg.run.profile_steps, s.out / "profile", start)
    state = s.state
    batch = s.batch(start) if start < stop else None
    if batch is not None:  # compile before the clock starts, so tokens/s is the step's own
        train_step = s.programs.compiled_step(state, batch)
        s.note_attention("train")
    status, stopped = "running", False
    tick = time.perf_counter()
    s.timing["setup_s"] = tick - t_start  # data, tracing and compiling: this session's overhead
    try:
        with interrupted:
            for i in range(start, stop):                 # ONE visible loop over steps
                step = i + 1
                profile.before(step)
                state, m = train_step(state, batch)
                if step < stop:
                    batch = s.batch(step)               # next batch, built while this one runs
                row = s.row(step, m, tick)
                profile.after(step)
                s.note_checkpoints()                    # a background save finished: summary
                diverged = not math.isfinite(row["train/loss"])
                if step in evals and not diverged:
                    row.update(s.evaluate(state))
                if step % cfg.run.log_every == 0 or step in evals or step == stop or diverged:
                    s.log(row)
                if diverged:
                    status = "diverged"
                    s.final = {"train/loss": row["train/loss"], "diverged_at_step": step}
                    break
                # a signal or the rolling clock, agreed by all processes (the save is collective)
                stopping, due = distributed.agree(interrupted.set, s.ckpt.due())
                if step in saves or step == stop or stopping or due:
                    s.save(step, state, rolling=step not in saves and step != stop)
                if stopping:
                    stopped = True
                    break
                tick = time.perf_counter()              # evals and saves are not step time
            else:
                if stop == rung.steps:
                    status = "complete"
    except BaseException:
        s.fail()
        raise
    finally:
        profile.close()
        s.ckpt.close()                                  # waits for a save in flight
    return s.finish(status, interrupted.signal_name or "peer" if stopped else None)


def _mesh_and_batches(rung: Rung, cfg: TrainConfig):
    """(microbatch, mesh, eval batch) of a run, each checked to hold whole capacity cells on
    every device."""
    microbatch = microbatch_size(rung, cfg)
    mesh = make_mesh(cfg.run.devices, cfg.run.expert_parallel, rung.model.n_experts, microbatch)
    devices = int(mesh.devices.size)
    eval_batch = eval_batch_size(cfg, devices, rung)
    if eval_batch % devices:
        raise InputError(f"the {devices} devices must divide it ({eval_batch})",
                         field="eval_batch", exit_code=EX_USAGE)
    check_cell(rung, devices, microbatch, "microbatch")
    check_cell(rung, devices, eval_batch, "eval_batch")
    return microbatch, mesh, eval_batch


def _check(rung: Rung, out: Path, cfg: TrainConfig, resume: bool):
    """Every input checked before the first file is written -> the finished run's summary
    (nothing to do), or (rung as run, corpus, out, config, previous)."""
    corpus = load_corpus(cfg.data, cfg.vocab_size)
    # the model is the rung's: its vocabulary changes only when --model.vocab_size says so (a
    # stray id must not grow the embedding under the rung's name, issue 39)
    rung = resolve_rung(rung, cfg)
    _mesh_and_batches(rung, cfg)   # a microbatch that splits a capacity cell, say
    check_vocab(rung, corpus.vocab_size, "data", ",".join(cfg.data) or None,
                explicit="vocab_size" in cfg.model)
    corpus.check_fits(rung.seq_len, ",".join(cfg.data) or "python-stdlib")
    for name in ("train_data", "switch_data"):   # other training data (the evals stay on data's)
        files = getattr(cfg, name)
        if files is None:
            continue
        other = load_corpus(files, cfg.vocab_size)
        check_vocab(rung, other.vocab_size, name, ",".join(files),
                    explicit="vocab_size" in cfg.model)
        other.check_fits(rung.seq_len, ",".join(files))
    config = {"schema": RUN_CONFIG_SCHEMA, "rung": rung.to_dict(), "train": cfg.to_dict()}
    previous = previous_run(out, config, resume)
    if previous is not None and (out / "config.json").exists():
        # the checkpoints are where the run put them: resuming elsewhere would start over
        old = read_json(out / "config.json").get("train", {}).get("checkpoint_dir")
        if old != cfg.run.checkpoint_dir:
            raise InputError(f"differs from the run in this directory ({old!r} there, "
                             f"{cfg.run.checkpoint_dir!r} now): its checkpoints are there; give "
                             f"the same --checkpoint-dir", path=out / "config.json",
                             field="train.checkpoint_dir", exit_code=EX_USAGE)
    if previous is not None and previous.get("status") in ("complete", "diverged"):
        return previous
    return rung, corpus, out, config, previous


class Session:
    """One process's part of one training session of a rung: the data feed, the mesh and its
    programs, the (restored) state, and the run directory. The loop calls ``batch(i)``, ``row``,
    ``evaluate``, ``log``, ``save``, then ``finish`` (or ``fail``)."""

    def __init__(self, rung: Rung, corpus, out: Path, config: dict, previous: dict | None, *,
                 cfg: TrainConfig, on_metrics: Callable[[dict], None] | None):
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        self.rung, self.cfg, self.out, self.on_metrics = rung, cfg, out, on_metrics
        self.timing = {"setup_s": 0.0, "steps_s": 0.0, "eval_s": 0.0, "checkpoint_s": 0.0}
        self.final: dict = {}
        enable_compilation_cache()
        microbatch, mesh, eval_batch = _mesh_and_batches(rung, cfg)
        mesh_info = {"axes": list(mesh.axis_names), "shape": dict(mesh.shape),
                     "devices": int(mesh.devices.size), "microbatch": microbatch,
                     "microbatches": rung.batch // microbatch, "eval_batch": eval_batch}
        config["mesh"] = mesh_info
        self.peak = peak_flops_info(cfg.run.peak_flops, int(mesh.devices.size))

        # --- the run directory (process 0 writes it; every process checkpoints its shards)
        self.writer = distributed.is_writer()
        distributed.barrier("ladder-run-checked")  # all read the old run before it is rewritten
        out.mkdir(parents=True, exist_ok=True)
        self.write_json(out / "config.json", config)
        # "attention": filled in as the train and eval steps are traced (note_attention)
        self.env = {**environment(corpus, mesh_info, self.peak),
                    "processes": distributed.info(), "attention": {}}
        self.write_json(out / "env.json", self.env)
        from ladder.model.layers import attention_mark
        self.attention_mark = attention_mark()
        self.ckpt = Checkpoints(checkpoint_root(out, rung, cfg), cfg.run.keep,
                                cfg.run.checkpoint_minutes, async_save=cfg.run.checkpoint_async)
        self.metrics = MetricsFile(out / "metrics.jsonl", writer=self.writer)

        # --- the programs, the data and the state
        # the LR table from what config.json records, by the function the curve laws rebuild it
        # with (RunDir.lr_table): the LRs a run stepped with and the ones fitted are one table
        self.lrs = run_lr_table(rung, config["train"]).astype(np.float32)
        self.programs = programs(rung.model, mesh, rung.optimizer_settings,
                                 rung.batch // microbatch)
        self.split = batch_sharding(mesh)
        self.replicated = NamedSharding(mesh, P())
        self.corpus = corpus
        rows = distributed.local_rows(self.split, rung.batch)
        train_corpus = corpus if cfg.train_data is None else load_corpus(cfg.train_data,
                                                                         cfg.vocab_size)
        self.feed = train_corpus.train_feed(cfg.seed, rung.batch, rung.seq_len, rows)
        # a change of data at switch_at (issue 27): batches from then on are drawn from the
        # other corpus, still a pure function of (seed, step), so a resume is exact
        self.switch_feed, self.switch_step = None, None
        if cfg.switch_data is not None:
            self.switch_feed = load_corpus(cfg.switch_data, cfg.vocab_size).train_feed(
                cfg.seed, rung.batch, rung.seq_len, rows)
            self.switch_step = int(round(cfg.switch_at * rung.steps))
        if (cfg.train_data is not None or cfg.switch_data is not None) and \
                self.feed.iterator is not None:
            raise InputError("train_data/switch_data need a data set whose batches are pure "
                             "functions of the step (text files or a token array), not token "
                             "shards", field="train_data", exit_code=EX_USAGE)
        self.state = self.programs.init_state(cfg.seed)
        # the newest intact checkpoint (a damaged one is named in one line and set aside)
        self.start, self.state = self.ckpt.restore_latest(self.state, self.feed.iterator)
        if self.start:
            self.feed.seek(self.start)
        self.metrics.truncate_to(self.start)  # rows past the checkpoint are recomputed
        if not self.start and self.writer and self.metrics.path.exists():
            self.metrics.path.unlink()
        self.last_saved = self.start
        eval_rows = distributed.local_rows(self.split, eval_batch)
        n_eval = -(-eval_sequences(cfg, rung) // eval_batch)   # whole calls
        self.eval_set = [self._to_global({k: v[eval_rows] for k, v in b.items()}, eval_batch)
                         for b in corpus.eval_batches(n_eval, eval_batch, rung.seq_len)]
        self.train_flops_per_token = rung.flops.training(1, lm_head=True)  # MFU counts the head

        self.wb, self.wandb_info = None, (previous or {}).get("wandb")
        if cfg.run.wandb and self.writer:
            self.wb = WandbMirror(out, rung, cfg.run, (self.wandb_info or {}).get("id"), config)
            self.wandb_info = self.wb.info
        self.write_summary("running", self.start)
        from tqdm.auto import tqdm
        self.bar = tqdm(total=rung.steps, initial=self.start, desc=f"{rung.ladder}/{rung.name}",
                        unit="step", disable=not (cfg.run.progress and self.writer),
                        mininterval=0.5, dynamic_ncols=True, leave=False)

    def note_attention(self, program: str) -> None:
        """env.json's ``attention[program]`` ("train" or "eval"): the attention implementations
        the program traced; called right after its first call."""
        from ladder.model.layers import attention_mark, attention_traced

        if program in self.env["attention"]:
            return
        traced = attention_traced(self.attention_mark)
        self.attention_mark = attention_mark()
        if traced:
            self.env["attention"][program] = traced
            self.write_json(self.out / "env.json", self.env)

    def write_json(self, path: Path, obj) -> None:
        if self.writer:
            atomic_write_json(path, obj)

    def write_summary(self, status: str, step: int, **extra) -> dict:
        s = {**summary(self.rung, status, step, self.cfg, self.peak, self.wandb_info,
                       final=self.final), **extra}
        self.write_json(self.out / "summary.json", s)
        return s

    def _to_global(self, b: dict, n: int):  # this process's rows of an n-row batch -> global
        return {k: distributed.global_array(self.split, v, (n, *v.shape[1:]))
                for k, v in b.items()}

    def batch(self, i: int) -> dict:
        """The input of step i (0-based): this process's rows of batch i, and its LR."""
        if self.switch_feed is not None and i >= self.switch_step:
            b = self.switch_feed.batch(i)
        else:
            b = self.feed.batch(i)
        fault, steps, seed = self.cfg.fault, self.rung.steps, self.cfg.seed
        if fault is not None and i >= fault.first_step(steps):
            if fault.kind == "data-swap":
                b = shuffle_bytes(b, seed, i)
            elif fault.kind == "loss-drift":   # noise share grows linearly to drift_max
                first = fault.first_step(steps)
                share = fault.drift_max * (i - first + 1) / max(1, steps - first)
                b = corrupt_bytes(b, share, self.rung.model.vocab_size, seed, i)
        return {**self._to_global(b, self.rung.batch),
                "lr": distributed.global_array(self.replicated, self.lrs[i], ())}

    def row(self, step: int, m: dict, tick: float) -> dict:
        """The metrics row of ``step`` from the step's metrics (waits for them) and its time."""
        import jax

        m = {k: float(v) for k, v in jax.device_get(m).items()}
        dt = time.perf_counter() - tick
        self.timing["steps_s"] += dt
        rung = self.rung
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{m['train/loss']:.3f}",
                             tok_s=f"{rung.tokens_per_step / dt:.0f}", refresh=False)
        return {"step": step, "tokens": step * rung.tokens_per_step,
                "progress": step / rung.steps, "time": time.time(), **m,
                "throughput/tokens_per_s": rung.tokens_per_step / dt,
                "throughput/mfu": rung.tokens_per_step / dt * self.train_flops_per_token
                / self.peak["total_flops_per_s"],
                "flops": rung.compute(step * rung.tokens_per_step)}

    def evaluate(self, state) -> dict:
        """Held-out loss as trained and dropless, the drop fraction, bits per byte."""
        import jax

        t = time.perf_counter()
        # every call dispatched before the first result is read: with one sequence per device an
        # eval is ~100 calls, which then queue on the devices instead of waiting one by one
        parts = jax.device_get([self.programs.eval_step(state["params"], state["router_bias"], b)
                                for b in self.eval_set])
        self.note_attention("eval")
        loss = float(np.mean([p["loss"] for p in parts]))
        dropless = float(np.mean([p["dropless"] for p in parts]))
        row = {"eval/loss": loss, "eval_dropless/loss": dropless,
               "eval/drop_frac": float(np.mean([p["drop_frac"] for p in parts]))}
        if self.corpus.bytes_per_token:  # bits per byte of the dropless loss (the fitted metric)
            row["eval/bpb"] = dropless / math.log(2) / self.corpus.bytes_per_token
        self.timing["eval_s"] += time.perf_counter() - t
        return row

    def log(self, row: dict) -> None:
        self.metrics.append(row)
        if self.wb:
            self.wb.log(row)
        if self.on_metrics:
            self.on_metrics(row)

    def save(self, step: int, state, *, rolling: bool) -> None:
        """Start the checkpoint of ``step``; ``checkpoint_s`` counts only the loop's wait."""
        t = time.perf_counter()
        self.ckpt.save(step, state, self.feed.state_for(step), rolling=rolling)
        self.timing["checkpoint_s"] += time.perf_counter() - t
        self.note_checkpoints()

    def note_checkpoints(self) -> None:
        """summary.json names the newest complete checkpoint, once it is complete."""
        done = self.ckpt.done_step()
        if done > self.last_saved:
            self.last_saved = done
            self.write_summary("running", done)

    def fail(self) -> None:
        """After an exception: close the files and say so in summary.json."""
        self.bar.close()
        self.metrics.close()
        with contextlib.suppress(InputError):  # a full disk: the first error is the one told
            self.write_summary("failed", self.last_saved,
                               error="training raised an exception; see the log")
        if self.wb:
            self.wb.finish(exit_code=1)

    def finish(self, status: str, stopped_by: str | None) -> dict:
        """The final summary.json (its final evaluation once complete); ``stopped_by``: the
        signal that stopped the run here, "peer" when another process's did, else None."""
        self.bar.close()
        self.metrics.close()
        self.last_saved = max(self.last_saved, self.ckpt.done_step())  # closed: all written
        step = self.last_saved if status != "diverged" else self.final["diverged_at_step"]
        if status == "complete":
            distributed.barrier("ladder-metrics-written")  # process 0 has written every row
            evals = [r for r in self.metrics.rows() if "eval_dropless/loss" in r]
            self.final = {k: v for k, v in evals[-1].items()
                          if k.startswith(("eval", "train/"))} if evals else {}
        extra = {"timing": {k: round(v, 3) for k, v in self.timing.items()}}  # this session's
        if stopped_by:
            extra.update(interrupted=True, signal=stopped_by)
        s = self.write_summary(status, step, **extra)
        if self.wb:
            self.wb.finish(exit_code=0 if status in ("complete", "running") else 1)
        return s


def checkpoint_root(out: Path, rung: Rung, cfg: TrainConfig):
    """Where a run's checkpoints go: ``out/checkpoints``, or ``checkpoint_dir/LADDER/RUNG``
    (a folder or an object-store URL, ladder.trainer.checkpointing.location)."""
    if cfg.run.checkpoint_dir is None:
        return out / "checkpoints"
    return f"{cfg.run.checkpoint_dir.rstrip('/')}/{rung.ladder}/{rung.name}"


class _Profile:
    """``profile_steps`` "A:B": a jax.profiler trace of steps A..B (of this session) into
    ``folder`` (TensorBoard's profile plugin and Perfetto read it), one per process."""

    def __init__(self, steps: str | None, folder: Path, start: int):
        self.range = profile_range(steps) if steps else None
        self.folder, self.start, self.on = folder, start, False

    def before(self, step: int) -> None:
        if self.range and step == max(self.range[0], self.start + 1) <= self.range[1]:
            import jax

            jax.profiler.start_trace(str(self.folder))
            self.on = True

    def after(self, step: int) -> None:      # the step's metrics were read: it has finished
        if self.on and step >= self.range[1]:
            self.close()

    def close(self) -> None:
        if self.on:
            import jax

            jax.profiler.stop_trace()
            self.on = False

