"""The real train step of a rung on the visible accelerators, measured phase by phase.

It imports nothing outside JAX, flax, optax, orbax-checkpoint and numpy (and the standard
library): orjson, grain, wandb, ray, tqdm, pandas and scipy may be missing (a bare GPU image;
tests/test_bench_gpu_rung.py smoke-runs it with them blocked). XLA's GPU settings
(ladder.trainer.gpuenv) are applied before JAX starts and recorded in the JSON.

On a GPU machine with network, from the repository root:

    pip install -U "jax[cuda12]==0.10.2" && pip install -e '.[train,data]'
    timeout 590 python bench/gpu_rung.py --out results/ --budget-s 540

On the H200 this workplace lends (no network there; its image holds jax 0.11.2 with the CUDA 13
plugin, flax, optax, orbax-checkpoint and tqdm, not grain): one `run` call with timeout_s 600 and

    PYTHONUNBUFFERED=1 timeout 590 python3 bench/gpu_rung.py --out "$OUT"

Without grain the data phase reads the same windows in order, without Grain's shuffle (the JSON
says which feed ran); carry grain's wheels (the device tool's README) to use the trainer's feed.

``--smoke`` runs the same phases on tiny shapes on CPU in about a minute
(tests/test_bench_gpu_rung.py). Results go to ``OUT/gpu_rung.json``, rewritten atomically after
every phase, so a run stopped by its budget, ``timeout`` or a crash keeps what it measured (the
checkpoint and the trace go to ``--scratch``, a temporary folder by default, and are removed); each
phase records its seconds, its error or why it was skipped. The budget: a watchdog thread writes
the file and exits 124 when ``--budget-s`` runs out inside a phase (a compile cannot be
interrupted from Python); before a phase starts, it is skipped when the time left is less than
the phase needs, estimated from the step time measured first.

Phases:
1. ``setup``: the rung (default marin-535b:1.6B-A61M at full depth, ``--model KEY=VALUE``
   overrides) with ``--batch`` sequences of 4096 tokens PER DEVICE (default: one device's share
   of the rung's batch on an 8-GPU node, 1024 / 8 = 128, so one GPU runs what each GPU of the
   node would), the mesh over every visible device (the expert axis over all of them when the
   experts divide, as ``ladder run`` makes it), the layout ``ladder run`` chooses for this
   device's memory (ladder.trainer.layout: bf16, the least remat and the largest microbatch the
   estimate fits; ``--precision``, ``--remat``, ``--microbatch`` override; the microbatch halved
   after a compile runs out of memory), the train state.
2. ``data``: a synthetic token shard (documents of random tokens, geometric lengths, each ended
   by an EOS) read as the trainer reads shards (ladder.trainer.tokens: windows of seq_len + 1,
   through Grain when it is installed), so every batch has segment ids and attention stays inside
   documents, as on real shards.
3. ``train``: compile seconds, the first step, then ``--steps`` timed steps: median step
   seconds, tokens/s, MFU (flops-v1 with the LM head / devices x the device's dense bf16 peak,
   ladder/accelerators.py), the attention implementation the compiled step holds (cuDNN fused
   attention custom calls, or XLA's), the allocator's peak bytes next to ``ladder plan``'s
   estimate and XLA's memory analysis of the step.
4. ``eval``: the eval step (loss with capacity and dropless) at ``ladder run``'s eval batch
   (ladder.trainer.trainconfig.eval_batch_size: whole capacity cells, 16 sequences per device on
   marin-535b): compile seconds, median call seconds, tokens/s, peak bytes.
5. ``checkpoint``: one Orbax save of the train state (ladder.trainer.checkpointing): seconds, bytes.
6. ``profile``: one step under ``jax.profiler``; the device time of every HLO op, split by the
   op's name scope (the compiled HLO's metadata) into attention, dispatch (router, sorting,
   scatter/gather, all-to-all, combine), expert matmuls (routed and shared experts), LM head
   (with the loss), optimizer and other (embedding, norms, residuals, gradient sums).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT_RUNG = "marin-535b:1.6B-A61M"
RESULTS = "gpu_rung.json"
# the default --batch is one device's share of the rung's batch on a node of this many GPUs
# (issue 37: the first rung runs on an 8 x H100 node)
NODE_DEVICES = 8
# every phase within 8 minutes of one device call (issue 37), start-up and the JSON included
DEFAULT_BUDGET_S = 450.0
# HLO op names of the expert matmuls: the capacity path, the dropless blocks, the shared experts
EXPERT_SPECS = ("ecl,elf->ecf", "ecf,efl->ecl", "cbl,clf->cbf", "cbf,cfl->cbl",
                "td,ndf->tnf", "tnf,nfd->td")
CATEGORIES = ("attention", "dispatch", "expert_matmuls", "lm_head", "optimizer", "other")
CONTAINERS = ("while", "call", "conditional", "async-start", "async-done")


class Results:
    """The JSON document of the run, written atomically whenever it changes."""

    def __init__(self, out: Path, meta: dict):
        self.path = out / RESULTS
        self.doc = {"schema": "gpu-rung/1", **meta, "phases": {}}
        self.lock = threading.Lock()
        self.write()

    def phase(self, name: str, **fields) -> dict:
        with self.lock:
            entry = self.doc["phases"].setdefault(name, {})
            entry.update(fields)
        self.write()
        return entry

    def write(self) -> None:
        from ladder.io import atomic_write_json

        with self.lock:
            atomic_write_json(self.path, self.doc)


class Watchdog:
    """Exits the process with 124 (as ``timeout`` does) once the budget is spent, after
    recording which phase was running: a compile or a step cannot be interrupted from Python."""

    def __init__(self, results: Results, budget_s: float):
        self.results, self.deadline = results, time.monotonic() + budget_s
        self.current = "setup"
        self.done = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def stop(self) -> None:
        self.done.set()

    def _watch(self) -> None:
        while not self.done.wait(min(1.0, max(self.left(), 0.01))):
            if self.left() <= 0:
                self.results.phase(self.current, status="timed out",
                                   error="--budget-s ran out")
                os._exit(124)


def run_phase(results: Results, dog: Watchdog, name: str, need_s: float, fn):
    """Run ``fn()`` as phase ``name`` (its dict goes into the results) unless fewer than
    ``need_s`` seconds are left; an exception is recorded, not raised."""
    if dog.left() < need_s:
        results.phase(name, status="skipped", reason=f"{dog.left():.0f} s left, the phase needs "
                                                     f"~{need_s:.0f} s")
        return None
    dog.current = name
    results.phase(name, status="running")
    t = time.perf_counter()
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001  (a failed phase is a result; the next may still run)
        results.phase(name, status="failed", seconds=time.perf_counter() - t,
                      error=f"{type(e).__name__}: {str(e).splitlines()[0][:500] if str(e) else ''}",
                      traceback=traceback.format_exc()[-3000:])
        return None
    results.phase(name, status="done", seconds=time.perf_counter() - t, **(out or {}))
    return out


# ------------------------------------------------------------------------------ pieces

def rung_config(name: str, per_device: int | None, devices: int, smoke: bool,
                model: dict | None = None):
    """The rung with ``per_device`` sequences a step on each of ``devices`` devices (default:
    one device's share of its batch on a NODE_DEVICES node; 2 in the smoke run) and ``model``
    field overrides."""
    from ladder.specs import LADDERS

    if smoke:
        rung = LADDERS["tiny"].rungs[0]
    else:
        ladder, _, rname = name.partition(":")
        rung = LADDERS[ladder].get(rname)
    if model:
        rung = rung.replace(model=rung.model.replace(**model))
    share = per_device or (2 if smoke else max(1, rung.batch // NODE_DEVICES))
    return rung.replace(batch=share * devices)


def model_overrides(items: list[str]) -> dict:
    """``["remat=full", "capacity_factor=2"]`` -> {field: JSON value (else the string)}."""
    out = {}
    for item in items:
        key, eq, raw = item.partition("=")
        if not eq or not key:
            raise SystemExit(f"--model: expected KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


def device_memory() -> float | None:
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    return float(stats["bytes_limit"]) if "bytes_limit" in stats else None


def peak_bytes() -> tuple[float | None, str]:
    import jax

    stats = [d.memory_stats() or {} for d in jax.local_devices()]
    if all("peak_bytes_in_use" in s for s in stats):
        return float(max(s["peak_bytes_in_use"] for s in stats)), "allocator peak_bytes_in_use"
    return None, "the backend reports no allocator statistics (CPU)"


def compiled_bytes(compiled) -> float:
    m = compiled.memory_analysis()
    return float(m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes
                 - m.alias_size_in_bytes)


def attention_ran(hlo_text: str) -> str:
    """Which attention the compiled program holds: cuDNN's fused attention custom calls, or
    XLA's own (dots and a softmax)."""
    if re.search(r'custom_call_target="__cudnn\$fmha', hlo_text):
        return "cudnn (fused flash attention)"
    return "xla (dots and a softmax; query blocks on CPU/TPU)"


def synthetic_shards(vocab: int, tokens: int, doc_mean: int, seed: int):
    """One shard of ``tokens`` random token ids in documents of geometric length (mean
    ``doc_mean``), each ended by the EOS id (vocab - 1). -> (shard, eos_id)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    eos = vocab - 1
    shard = rng.integers(0, eos, tokens, dtype=np.int32)
    ends = np.cumsum(rng.geometric(1.0 / doc_mean, size=tokens // doc_mean * 2 + 8))
    shard[ends[ends < tokens]] = eos
    return shard, eos


class InOrderFeed:
    """Batches of consecutive windows (rows ``rows`` of each): the trainer's windows without
    Grain's shuffle, for a machine that has no grain."""

    def __init__(self, source, rows: slice):
        self.source, self.rows = source, rows

    def batch(self, index: int) -> dict:
        import numpy as np

        n = self.rows.stop - self.rows.start
        items = [self.source[(index * n + i) % len(self.source)] for i in range(n)]
        return {k: np.stack([it[k] for it in items]) for k in items[0]}


def is_oom(e: Exception) -> bool:
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def category(op_name: str) -> str:
    """The profile's part of an HLO op, from its name scope (op_name metadata)."""
    if "optimizer" in op_name:
        return "optimizer"
    if "/attn/" in op_name:
        return "attention"
    if "/moe/" in op_name:
        if "/experts/" in op_name or "/shared/" in op_name \
                or any(s in op_name for s in EXPERT_SPECS):
            return "expert_matmuls"
        return "dispatch"
    if "Decoder" in op_name:
        return "other"
    if "bsd,dv->bsv" in op_name or "jvp()" in op_name:   # lm_head_losses: the loss, outside
        return "lm_head"                                 # the Decoder module, differentiated
    return "other"


def hlo_scopes(hlo_text: str) -> tuple[dict, set]:
    """{instruction name: op_name metadata} and the names of control-flow instructions (whose
    profile events contain their bodies' events) of compiled HLO text."""
    from ladder.trainer.plan import _instruction

    scopes, containers = {}, set()
    for line in hlo_text.splitlines():
        parsed = _instruction(line)
        if parsed is None:
            continue
        name, _, opcode, rest = parsed
        m = re.search(r'op_name="([^"]*)"', rest)
        scopes[name] = m.group(1) if m else ""
        if opcode in CONTAINERS:
            containers.add(name)
    return scopes, containers


def profile_split(trace_dir: Path, hlo_text: str, module: str) -> dict:
    """Device seconds per category of one traced program (``module``: its HLO module name)."""
    from jax.profiler import ProfileData

    files = sorted(trace_dir.rglob("*.xplane.pb"))
    if not files:
        raise FileNotFoundError(f"no .xplane.pb under {trace_dir}")
    scopes, containers = hlo_scopes(hlo_text)
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    unattributed, events = 0.0, 0
    data = ProfileData.from_file(str(files[-1]))
    planes = [p for p in data.planes if p.name.startswith("/device:")] or \
        [p for p in data.planes if p.name.startswith("/host:CPU")]
    for plane in planes:
        lines = list(plane.lines)
        ops_lines = [ln for ln in lines if ln.name == "XLA Ops"]   # GPU: one event per op
        for line in ops_lines or lines:
            for ev in line.events:
                stats = dict(ev.stats)
                op = stats.get("hlo_op") or (ev.name if ops_lines else None)
                if op is None or module not in str(stats.get("hlo_module", module)):
                    continue
                if op in containers:
                    continue
                dt = ev.duration_ns / 1e9
                events += 1
                if op in scopes:
                    seconds[category(scopes[op])] += dt
                else:
                    unattributed += dt
    total = sum(seconds.values()) + unattributed
    return {"device_seconds": seconds, "unattributed_seconds": unattributed,
            "fraction": {k: v / total for k, v in seconds.items()} if total else {},
            "events": events, "planes": [p.name for p in planes]}


# ------------------------------------------------------------------------------ the bench

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for gpu_rung.json (and the "
                    "profile and checkpoint, removed after unless --keep)")
    ap.add_argument("--rung", default=DEFAULT_RUNG, help=f"LADDER:RUNG (default {DEFAULT_RUNG})")
    ap.add_argument("--batch", type=int, default=None,
                    help="sequences per step on EACH device (default: one device's share of "
                         f"the rung's batch on a {NODE_DEVICES}-GPU node)")
    ap.add_argument("--microbatch", type=int, default=None,
                    help="sequences per microbatch, all devices (default: the layout "
                         "`ladder run` chooses for this memory)")
    ap.add_argument("--precision", default=None, choices=["bf16", "f32"],
                    help="compute precision (default: bf16 on accelerators, f32 on CPU)")
    ap.add_argument("--remat", default=None, choices=["none", "dots", "full"],
                    help="rematerialisation (default: the least that fits)")
    ap.add_argument("--model", action="append", default=[], metavar="KEY=VALUE",
                    help="a model config override (repeatable), e.g. --model capacity_factor=2")
    ap.add_argument("--expert-parallel", type=int, default=None,
                    help="size of the expert mesh axis (default: as ladder run)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps after the first (2)")
    ap.add_argument("--doc-mean", type=int, default=None,
                    help="mean document length of the synthetic shards, tokens (default: 1024, "
                         "at most a quarter of the sequence)")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                    help="seconds for everything; phases that do not fit are skipped "
                         f"({DEFAULT_BUDGET_S:g})")
    ap.add_argument("--scratch", default=None,
                    help="folder for the checkpoint and the trace (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint and the trace")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (tests)")
    ap.add_argument("--skip", default="", type=lambda v: {p for p in v.split(",") if p},
                    help="later phases to skip, comma-separated: eval, checkpoint, profile "
                         "(default: none)")
    args = ap.parse_args(argv)
    overrides = model_overrides(args.model)
    from ladder.trainer import gpuenv

    gpu_env = gpuenv.apply()   # before JAX starts its backend
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="gpu_rung_"))
    scratch.mkdir(parents=True, exist_ok=True)

    import jax
    import jax.numpy as jnp
    import numpy as np

    from ladder.model.layers import attention_choice
    from ladder.model.transformer import compute_dtype
    from ladder.trainer.layout import choose_layout, device_memory_budget, ordered_layouts
    from ladder.trainer.plan import plan_rung
    from ladder.trainer.step import batch_sharding, enable_compilation_cache, make_mesh, programs
    from ladder.trainer.train import peak_flops_info
    from ladder.trainer.trainconfig import TrainConfig, eval_batch_size

    if not args.smoke:
        enable_compilation_cache()
    dev = jax.devices()[0]
    results = Results(out, {
        "argv": sys.argv[1:] if argv is None else list(argv), "jax": jax.__version__,
        "backend": jax.default_backend(), "devices": jax.device_count(),
        "device_kind": dev.device_kind, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "gpu_env": gpu_env})
    dog = Watchdog(results, args.budget_s)
    s: dict = {}

    def setup():
        n = jax.device_count()
        rung = rung_config(args.rung, args.batch, n, args.smoke, overrides)
        memory = device_memory()
        budget = device_memory_budget(jax.devices())
        given = {"precision": args.precision, "remat": args.remat,
                 "microbatch": args.microbatch}
        if budget is not None:   # an accelerator: `ladder run`'s layout for its memory
            layout = choose_layout(rung, n, budget[0], budget_source=budget[1],
                                   expert_parallel=args.expert_parallel, **given)
            rung, mb = layout.apply(rung), layout.microbatch
            how = layout.describe()
        else:                    # CPU: as `ladder run` there, what was given, else the rung's
            model = {k: v for k, v in given.items() if k != "microbatch" and v is not None}
            rung = rung.replace(model=rung.model.replace(**model)) if model else rung
            mb, how = args.microbatch or rung.batch, "CPU: no layout is chosen"
        s.update(rung=rung, n=n, mb=mb, memory=memory,
                 order=ordered_layouts(rung, n, remat=args.remat, microbatch=args.microbatch))
        t = time.perf_counter()
        mesh = make_mesh(n, args.expert_parallel, rung.model.n_experts, mb)
        progs = programs(rung.model, mesh, rung.optimizer_settings, rung.batch // mb)
        s.update(mesh=mesh, progs=progs, state=progs.init_state(0))
        jax.block_until_ready(s["state"])
        return {"rung": f"{rung.ladder}:{rung.name}", "d_model": rung.model.d_model,
                "layers": rung.model.n_layers, "experts": rung.model.n_experts,
                "seq_len": rung.seq_len, "batch": rung.batch, "batch_per_device": rung.batch // n,
                "microbatch": mb, "remat": rung.model.remat, "layout": how,
                "model_overrides": overrides,
                "device_memory_bytes": memory, "mesh": {k: int(v) for k, v in mesh.shape.items()},
                "precision": str(jnp.dtype(compute_dtype(rung.model))),
                "attention_asked": attention_choice(compute_dtype(rung.model),
                                                    rung.model.head_dim, 0, True,
                                                    None).implementation,
                "init_s": time.perf_counter() - t}

    def data():
        from ladder.trainer import distributed
        from ladder.trainer.tokens import WindowSource

        rung, mesh = s["rung"], s["mesh"]
        eb = eval_batch_size(TrainConfig(), s["n"], rung)
        windows = rung.batch * (args.steps + 4) + eb
        doc_mean = args.doc_mean or min(1024, max(2, rung.seq_len // 4))
        shard, eos = synthetic_shards(rung.model.vocab_size, windows * rung.seq_len + 1,
                                      doc_mean, 0)
        split = batch_sharding(mesh)
        source = WindowSource([shard], rung.seq_len, eos)
        rows = distributed.local_rows(split, rung.batch)
        try:
            from ladder.trainer.tokens import GrainFeed
            feed = GrainFeed(source, 0, rung.batch, rows)
            kind = "grain (ladder.trainer.tokens.GrainFeed)"
        except ImportError:
            feed, kind = InOrderFeed(source, rows), "in order (grain is not installed)"
        val = [source[len(source) - 1 - i] for i in range(eb)]
        s.update(feed=feed, split=split, eval_batch={
            k: jax.device_put(np.stack([v[k] for v in val]), split) for k in val[0]},
            eb=eb, next_batch=0)
        first = feed.batch(0)
        s["batches"] = [first]
        docs = int((first["segment_ids"][:, -1] + 1).sum())
        return {"feed": kind, "train_windows": len(source), "eos_id": eos, "doc_mean": doc_mean,
                "documents_in_first_batch": docs, "eval_batch": eb}

    def batch():
        b = s["batches"].pop() if s["batches"] else s["feed"].batch(s["next_batch"])
        s["next_batch"] += 1
        return {**{k: jax.device_put(v, s["split"]) for k, v in b.items()},
                "lr": jnp.float32(1e-4)}

    def train():
        rung, n = s["rung"], s["n"]
        b = batch()
        while True:
            t = time.perf_counter()
            try:
                compiled = s["progs"].train_step.lower(s["state"], b).compile()
                break
            except Exception as e:
                # the estimate was too generous: the next layout of `ladder run`'s order (more
                # remat, then smaller microbatches; the same parameters, so the same state)
                here = (rung.model.remat, s["mb"])
                later = s["order"][s["order"].index(here) + 1:] if here in s["order"] else []
                if not is_oom(e) or not later:
                    raise
                remat, s["mb"] = later[0]
                rung = s["rung"] = rung.replace(model=rung.model.replace(remat=remat))
                results.phase("setup", microbatch=s["mb"], remat=remat,
                              layout="the next in ladder run's order after an out-of-memory "
                                     "compile")
                s["progs"] = programs(rung.model, s["mesh"], rung.optimizer_settings,
                                      rung.batch // s["mb"])
        compile_s = time.perf_counter() - t
        s["compiled"] = compiled
        text = compiled.as_text()
        t = time.perf_counter()
        s["state"], m = compiled(s["state"], b)
        jax.block_until_ready(m)
        first_s = time.perf_counter() - t
        times, losses = [], [float(m["train/loss"])]
        for _ in range(args.steps):
            b = batch()
            jax.block_until_ready(b)
            t = time.perf_counter()
            s["state"], m = compiled(s["state"], b)
            jax.block_until_ready(m)
            times.append(time.perf_counter() - t)
            losses.append(float(m["train/loss"]))
            if dog.left() < 60 + 3 * max(times):   # leave the later phases their turn
                break
        step_s = statistics.median(times) if times else first_s
        s["step_s"] = step_s
        tokens = rung.batch * rung.seq_len
        peak = peak_flops_info(None, n)
        peak_b, peak_src = peak_bytes()
        planned = plan_rung(rung, n, microbatch=s["mb"]).total_bytes
        return {"compile_s": compile_s, "first_step_s": first_s, "timed_steps": len(times),
                "step_s": step_s, "tokens_per_s": tokens / step_s,
                "mfu": tokens / step_s * rung.flops.training(1, lm_head=True)
                / peak["total_flops_per_s"], "peak": peak,
                "attention_ran": attention_ran(text), "microbatch": s["mb"],
                "peak_bytes_per_device": peak_b, "peak_bytes_source": peak_src,
                "xla_bytes_per_device": compiled_bytes(compiled),
                "plan_bytes_per_device": planned,
                "plan_note": "ladder plan's estimate at this precision and remat",
                "losses": losses, "drop_frac": float(m["moe/drop_frac"])}

    def evaluate():
        rung, progs, eb = s["rung"], s["progs"], s["eb"]
        params, rb = s["state"]["params"], s["state"]["router_bias"]
        t = time.perf_counter()
        compiled = progs.eval_step.lower(params, rb, s["eval_batch"]).compile()
        compile_s = time.perf_counter() - t
        times = []
        for _ in range(3):
            t = time.perf_counter()
            r = jax.block_until_ready(compiled(params, rb, s["eval_batch"]))
            times.append(time.perf_counter() - t)
        call_s = statistics.median(times)
        peak_b, peak_src = peak_bytes()
        return {"eval_batch": eb, "compile_s": compile_s, "call_s": call_s,
                "tokens_per_s": eb * rung.seq_len / call_s, "loss": float(r["loss"]),
                "dropless": float(r["dropless"]), "drop_frac": float(r["drop_frac"]),
                "xla_bytes_per_device": compiled_bytes(compiled),
                "peak_bytes_per_device": peak_b, "peak_bytes_source": peak_src}

    def checkpoint():
        from ladder.trainer.checkpointing import Checkpoints

        root = scratch / "checkpoint"
        shutil.rmtree(root, ignore_errors=True)
        ck = Checkpoints(root, keep=1)
        t = time.perf_counter()
        ck.save(1, s["state"])
        save_s = time.perf_counter() - t
        ck.close()
        size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        return {"save_s": save_s, "bytes": size, "bytes_per_s": size / save_s}

    def profile():
        trace = scratch / "trace"
        shutil.rmtree(trace, ignore_errors=True)
        b = batch()
        jax.block_until_ready(b)
        with jax.profiler.trace(str(trace)):
            s["state"], m = s["compiled"](s["state"], b)
            jax.block_until_ready(m)
        split = profile_split(trace, s["compiled"].as_text(), "train_step")
        if not args.keep:
            shutil.rmtree(trace, ignore_errors=True)
        return split

    try:
        for name, need, fn, made in (("setup", 0, setup, "state"), ("data", 0, data, "feed"),
                                     ("train", 0, train, "step_s")):
            run_phase(results, dog, name, need, fn)
            if made not in s:   # the later phases need what this one makes
                return 1
        step = s["step_s"]
        for name, need, fn in (("eval", 20 + step, evaluate), ("checkpoint", 30, checkpoint),
                               ("profile", 30 + 3 * step, profile)):
            if name in args.skip:
                results.phase(name, status="skipped", reason="--skip")
            else:
                run_phase(results, dog, name, need, fn)
    finally:
        dog.stop()
        if args.scratch is None and not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    results.doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    results.write()
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "traceback"}
                      for k, v in results.doc["phases"].items()}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
