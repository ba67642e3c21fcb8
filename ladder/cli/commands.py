"""Implementations of `ladder list`, `ladder plan` and `ladder run` (argument parsing is in cli)."""

from __future__ import annotations

import json
import sys

from ladder.cli.output import tell
from ladder.io import EX_USAGE, InputError, inside, number
from ladder.specs import Ladder, is_one_rung, lookup_message, resolve, with_file
from ladder.trainer.checkpointing import ignore_dropped_writes
from ladder.trainer.executor import rung_exit_code  # beside the Ray driver, which uses it too


def _ladders(args) -> dict[str, Ladder]:
    """The built-in ladders, plus the one of --ladder-file (replacing a built-in of its name)."""
    return with_file(getattr(args, "ladder_file", None))


def resolve_target(target: str | None, args=None):
    """'LADDER[:RUNG]' among the built-ins and --ladder-file; no LADDER with --ladder-file (or
    ':RUNG') means the file's ladder."""
    ladders = _ladders(args)
    file = getattr(args, "ladder_file", None)
    if file is not None and (not target or target.startswith(":")):
        from ladder.specs import load_ladder_file
        target = load_ladder_file(file).name + (target or "")
    if not target:
        raise InputError("name a ladder (or give --ladder-file FILE)", field="LADDER",
                         exit_code=EX_USAGE)
    try:
        return resolve(target, ladders)
    except KeyError as e:
        raise InputError(lookup_message(e, ladders), field="LADDER[:RUNG]",
                         exit_code=EX_USAGE) from None


def _fmt(x: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.4g}{unit}"
    return f"{x:.4g}"


def list_main(args) -> int:
    if args.ladder or getattr(args, "ladder_file", None):
        ladders: list[Ladder] = [resolve_target(args.ladder, args)[0]]
    else:
        ladders = list(_ladders(args).values())
    rows = [r.summary() for lad in ladders for r in lad.all]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    head = (f"{'ladder':<11} {'rung':<14} {'total':>8} {'active':>8} {'d':>5} {'L':>3} "
            f"{'steps':>8} {'batch':>6} {'tokens':>8} {'C (no head)':>11} {'C':>9} {'peak lr':>8} "
            f"{'optimizer':>9} {'muonh lr':>8}")
    print(head)
    for s in rows:
        name = s["name"] + (" *" if s["is_target"] else "")
        muonh = s["optimizer"]["muonh_lr"]
        print(f"{s['ladder']:<11} {name:<14} {_fmt(s['params']):>8} {_fmt(s['active_params']):>8} "
              f"{s['d_model']:>5} {s['n_layers']:>3} {s['steps']:>8,} {s['batch']:>6} "
              f"{_fmt(s['tokens']):>8} {s['compute_no_lm_head']:>11.3e} {s['compute']:>9.3e} "
              f"{s['peak_lr']:>8.2e} {s['optimizer']['kind']:>9} "
              f"{'' if muonh is None else format(muonh, '.2e'):>8}")
    conv = {s["param_convention"] for s in rows}
    print(f"* target run. params: {', '.join(sorted(conv))}; FLOPs: flops-v1, C = 3 x forward x "
          f"tokens (see ladder/counting.py)")
    return 0


def _train_config(args):
    """TrainConfig from --config FILE, then --key=value overrides, then the run flags."""
    from ladder.io import read_json
    from ladder.trainer.trainconfig import parse_overrides, train_config

    values: dict = read_json(args.config) if args.config else {}
    values.pop("schema", None)
    overrides = parse_overrides(args.overrides)
    where = args.config or "overrides"
    if overrides:
        where = f"{where} + --key=value" if args.config else "--key=value"
    values.update(overrides)
    for flag in ("devices", "expert_parallel", "vocab_size", "checkpoint_minutes", "microbatch",
                 "eval_batch", "peak_flops", "checkpoint_dir", "profile_steps"):
        if getattr(args, flag) is not None:
            values[flag] = getattr(args, flag)
    for flag in ("data", "wandb", "wandb_entity", "wandb_project"):  # given: not off or empty
        if getattr(args, flag):
            values[flag] = getattr(args, flag)
    if not sys.stderr.isatty():  # progress bars only on a terminal (not in logs or CI output)
        values.setdefault("progress", False)
    return train_config(values, where=where)


def run_main(args) -> int:
    """`ladder run`: the named rungs (default: all, the target last) into OUT/LADDER/RUNG/,
    one after another here, or as Ray tasks (``--executor ray``); each rung optionally over
    several JAX processes (``--coordinator ...`` / ``--distributed auto``)."""

    from ladder.trainer import distributed, gpuenv

    gpuenv.apply()   # XLA/allocator settings on GPUs: before anything starts JAX's backend
    ladder, rungs = resolve_target(args.ladder, args)
    if args.rung:
        try:
            rungs = [ladder.get(name) for name in args.rung]
        except KeyError as e:
            raise InputError(f"no rung {e.args[0]!r} in ladder {ladder.name!r} (rungs: "
                             f"{', '.join(r.name for r in ladder.all)})", field="rung",
                             exit_code=EX_USAGE) from None
    cfg = _train_config(args)
    dist = distributed.from_args(args.distributed, args.coordinator, args.num_processes,
                                 args.process_id, args.distributed_timeout)
    executor = args.executor
    for flag in ("address", "resources_per_rung"):
        if executor != "ray" and getattr(args, flag) is not None:
            raise InputError("applies only with --executor ray",
                             field=f"--{flag.replace('_', '-')}", exit_code=EX_USAGE)
    if executor == "ray":
        if dist.mode != "off":
            raise InputError("--executor ray runs each rung as its own task; multi-host JAX "
                             "inside a Ray task is not supported here", field="--executor",
                             exit_code=EX_USAGE)
        from ladder.trainer.executor import parse_resources, print_problems, run_ladder_ray

        resources = parse_resources(args.resources_per_rung, [r.name for r in rungs])
        if args.max_retries < 0:
            raise InputError(f"must be >= 0, got {args.max_retries}", field="--max-retries",
                             exit_code=EX_USAGE)
        for rung in rungs:  # every rung's folder inside --out (ladder.io: names -> paths)
            inside(args.out, ladder.name, rung.name, field="rung")
        result = run_ladder_ray(rungs, inside(args.out, ladder.name, field="ladder"), cfg,
                                max_steps=args.max_steps, resume=args.resume,
                                address=args.address, resources=resources,
                                max_retries=args.max_retries)
        print_problems(result)
        return result.exit_code
    # every folder a rung will write, inside --out, before the first one starts (ladder.io: the
    # one rule for names that become paths; a ladder file's names are checked when read, and a
    # symbolic link below --out that leads out of it is refused here)
    outs = {rung.name: inside(args.out, ladder.name, rung.name, field="rung") for rung in rungs}
    distributed.initialize(dist)
    from ladder.trainer.train import train_rung
    for rung in rungs:
        out = outs[rung.name]
        s = train_rung(rung, out, cfg, max_steps=args.max_steps, resume=args.resume)
        code = rung_exit_code(s)
        final = s.get("final", {}).get("eval_dropless/loss")
        note = f", eval_dropless/loss {final:.4f}" if isinstance(final, float) else ""
        if distributed.is_writer():
            print(f"{ladder.name}/{rung.name}: {s['status']} at step {s['step']}/{s['steps']}"
                  f"{note} -> {out}", flush=True)
        if code:
            print(f"ladder run: {rung_problem(ladder.name, rung.name, s, out)}", file=sys.stderr)
            return code
    return 0


def rung_problem(ladder: str, rung: str, s: dict, out) -> str:
    """One line saying why a rung stopped (for stderr)."""
    if s["status"] == "diverged":
        return (f"{ladder}/{rung} diverged at step {s['step']} (non-finite loss); see "
                f"{out / 'summary.json'}")
    return (f"interrupted at step {s['step']} ({s.get('signal', 'signal')}); checkpoint saved, "
            f"continue with --resume")


def tokenize_main(args) -> int:
    """`ladder tokenize`: text, JSONL and Parquet files -> token shards and manifest.json under
    --out (streaming; an interrupted run continues when the same command is run again)."""
    import os

    from ladder.trainer.tokens import DEFAULT_SHARD_TOKENS, PROGRESS, tokenize_files

    processes = args.processes if args.processes is not None else (os.cpu_count() or 1)
    try:
        m = tokenize_files(args.files, args.tokenizer, args.out, eos=args.eos,
                           shard_tokens=args.shard_tokens or DEFAULT_SHARD_TOKENS,
                           text_key=args.text_key, processes=processes,
                           progress_bar=sys.stderr.isatty())  # a bar on a terminal, not in logs
    except KeyboardInterrupt:
        print(f"ladder tokenize: interrupted; the same command continues from "
              f"{os.path.join(args.out, PROGRESS)}", file=sys.stderr)
        return 130
    sp = m["splits"]
    docs = [sp[k]["documents"] for k in ("train", "val")]
    print(f"{args.out}: {sp['train']['tokens']:,} train + {sp['val']['tokens']:,} val tokens "
          + (f"({docs[0]:,} + {docs[1]:,} documents) " if None not in docs else "")
          + f"in {len(sp['train']['shards']) + len(sp['val']['shards'])} shard(s), "
          f"{m['dtype']}, vocab {m['vocab_size']}, eos {m['tokenizer']['eos']!r} = "
          f"{m['eos_id']}, tokenizer sha256 {m['tokenizer']['sha256'][:12]}")
    return 0


def _bytes(x: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.0f}B"


def _duration(s: float) -> str:
    for unit, scale in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= scale:
            return f"{s / scale:.3g}{unit}"
    return f"{s:.3g}s"


def _plan_child(args) -> int:
    """Re-run this `plan --compile` in a fresh process, whose JAX starts with the fake devices."""
    import os
    import subprocess

    argv = [sys.executable, "-m", "ladder", "plan", args.target, "--devices",
            str(args.devices), "--compile"]
    for flag in ("expert_parallel", "peak_flops", "mfu", "microbatch", "eval_batch",
                 "ladder_file", "memory_per_device", "accelerator", "precision", "remat"):
        if getattr(args, flag, None) is not None:
            argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    if args.json:
        argv.append("--json")
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.devices}",
           "JAX_PLATFORMS": "cpu"}
    return subprocess.run(argv, env=env, check=False).returncode


def plan_main(args) -> int:
    from ladder.trainer.layout import choose_layout
    from ladder.trainer.plan import DEFAULT_MFU, ensure_host_devices, plan_rung

    _, rungs = resolve_target(args.target, args)
    # 2**20 devices: ~1300x the hero's 792 GPUs; the planner's mesh search grows with the count
    number(args.devices, field="--devices", lo=1, hi=2 ** 20, integral=True,
           exit_code=EX_USAGE)
    number(args.expert_parallel, field="--expert-parallel", lo=1, hi=2 ** 20, integral=True,
           allow_none=True, exit_code=EX_USAGE)
    number(args.peak_flops, field="--peak-flops", lo=0, lo_open=True, allow_none=True,
           exit_code=EX_USAGE)
    number(args.mfu, field="--mfu", lo=0, hi=1, lo_open=True, allow_none=True,
           exit_code=EX_USAGE)
    if args.compile:
        if len(rungs) != 1 or not is_one_rung(args.target or "", _ladders(args)):
            raise InputError("--compile compiles one rung: give LADDER:RUNG",
                             field="LADDER[:RUNG]", exit_code=EX_USAGE)
        if not ensure_host_devices(args.devices):
            return _plan_child(args)
    budget, budget_source, peak = _plan_budget(args)
    mfu = DEFAULT_MFU if args.mfu is None else args.mfu
    kw = {"expert_parallel": args.expert_parallel, "peak_flops": peak, "mfu": mfu}
    given = {"precision": args.precision, "remat": args.remat, "microbatch": args.microbatch}
    try:
        rows = []
        for r in rungs:   # the layout (precision, remat, microbatch) the estimate fits
            lay = choose_layout(r, args.devices, budget, expert_parallel=args.expert_parallel,
                                budget_source=budget_source, **given)
            plan = plan_rung(lay.apply(r), args.devices, microbatch=lay.microbatch, **kw)
            rows.append({**plan.to_dict(), "layout": lay.to_dict()})
        if args.compile:
            extra = _compiled_plan(rungs[0], args, budget, budget_source, given)
            # the estimate at the layout XLA chose, next to XLA's figure
            lay = extra["layout"]
            laid = rungs[0].replace(model=rungs[0].model.replace(precision=lay["precision"],
                                                                 remat=lay["remat"]))
            rows[0] = {**plan_rung(laid, args.devices, microbatch=extra["microbatch"],
                                   **kw).to_dict(), **extra}
    except ValueError as e:  # names the field: devices, expert_parallel, peak_flops, mfu
        field, _, message = str(e).partition(": ")
        raise InputError(message, field=f"--{field.replace('_', '-')}",
                         exit_code=EX_USAGE) from None
    for r in rows:
        r["memory_per_device"] = budget
        # with --compile, XLA's figures decide (train and eval); the estimate's verdict is kept
        # beside them (the estimate's sum is an upper bound of what the program holds)
        r["estimate_fits"] = r["total_bytes"] <= budget
        r["fits"] = (r["compiled_fits"] and r["compiled_eval_fits"] if "compiled" in r
                     else r["estimate_fits"])
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'ladder':<11} {'rung':<14} {'mesh dxe':>9} {'micro':>6} {'params':>8} {'active':>8} "
          f"{'FLOPs/step':>10} {'tok/dev':>8} {'params':>9} {'grads':>9} {'adam':>9} "
          f"{'act/seq':>9} {'activ.':>9} {'total':>9} {'step':>8} {'run':>8}")
    for r in rows:
        mesh = f"{r['data_parallel']}x{r['expert_parallel']}"
        print(f"{r['ladder']:<11} {r['name']:<14} {mesh:>9} {r['microbatch']:>6} "
              f"{_fmt(r['params']):>8} {_fmt(r['active_params']):>8} {r['flops_per_step']:>10.3e} "
              f"{_fmt(r['tokens_per_device']):>8} {_bytes(r['param_bytes']):>9} "
              f"{_bytes(r['grad_bytes']):>9} {_bytes(r['optimizer_bytes']):>9} "
              f"{_bytes(r['activation_bytes_per_sequence']):>9} "
              f"{_bytes(r['activation_bytes']):>9} {_bytes(r['total_bytes']):>9} "
              f"{_duration(r['step_time_s']):>8} {_duration(r['run_time_s']):>8}")
    for r in rows:
        print(f"{r['ladder']}:{r['name']} {_layout_line(r['layout'])}")
    print(f"memory per device: params, grads, Adam 2 x f32 (FSDP over all devices), weights "
          f"gathered for use, the balancing statistic, activations of one microbatch (micro: "
          f"sequences; at the layout's precision and remat; see ladder/trainer/plan.py). "
          f"time: FLOPs/step (LM head included) / ({args.devices} x {peak:.3g} FLOP/s x MFU "
          f"{mfu:g})")
    for r in rows:
        if not r["fits"]:
            need = (max(r["compiled"]["bytes_per_device"], r["compiled_eval"]["bytes_per_device"])
                    if "compiled" in r else r["total_bytes"])
            print(f"warning: {r['ladder']}:{r['name']} needs ~{_bytes(need)} per "
                  f"device, over the {_bytes(budget)} budget (--memory-per-device)",
                  file=sys.stderr)
        if "compiled" in r:
            c = r["compiled"]
            coll = ", ".join(f"{k} {v}" for k, v in c["collectives"].items())
            cbytes = ", ".join(f"{k} {_bytes(v)}" for k, v in c["collective_bytes"].items())
            print(f"compiled ({r['compiled_mesh']['data']}x{r['compiled_mesh']['expert']} mesh, "
                  f"{c['precision']}, remat {c['remat']}, "
                  f"microbatch {r['microbatch']} of {r['batch']} sequences): "
                  f"{_bytes(c['bytes_per_device'])} and {c['flops_per_device']:.3e} matmul "
                  f"FLOPs per device (loops x trip counts; {c['flops_ratio']:.2f}x flops-v1); "
                  f"collectives: {coll}; bytes per device per step: {cbytes}. "
                  f"{r['microbatch_note']}")
            ev = r["compiled_eval"]
            print(f"compiled eval step ({ev['eval_batch']} sequences, with and without drops): "
                  f"{_bytes(ev['bytes_per_device'])} and {ev['flops_per_device']:.3e} matmul "
                  f"FLOPs per device ({ev['flops_ratio']:.2f}x flops-v1 of two forward passes)")
    return 0


def _plan_budget(args) -> tuple[float, str, float]:
    """(memory budget per device, where it came from, peak FLOP/s) of `ladder plan`:
    --memory-per-device, else the accelerator's usable memory (--accelerator, default an H100);
    the peak: --peak-flops, else --accelerator's, else one GB200's (the hero's)."""
    from ladder.accelerators import (ACCELERATORS, DEFAULT_PLAN_ACCELERATOR, GB200_BF16_DENSE_FLOPS,
                                     accelerator_peak, usable_memory)

    name = args.accelerator
    entry = None
    if name is not None:
        entry = next((accelerator_peak(keys[0]) for keys, label, *_ in ACCELERATORS
                      if name.lower() in (*keys, label.lower())), None)
        if entry is None:
            known = sorted({label for _, label, *_ in ACCELERATORS})
            raise InputError(f"unknown accelerator {name!r} (known: {', '.join(known)})",
                             field="--accelerator", exit_code=EX_USAGE)
    table = entry or accelerator_peak(DEFAULT_PLAN_ACCELERATOR)
    budget = args.memory_per_device
    number(budget, field="--memory-per-device", lo=0, lo_open=True, allow_none=True,
           exit_code=EX_USAGE)
    source = "--memory-per-device" if budget is not None else \
        f"{table['name']}: {table['memory'] / 1e9:g} GB x its usable share"
    budget = budget if budget is not None else usable_memory(table)
    peak = args.peak_flops if args.peak_flops is not None else \
        (entry["flops"] if entry else GB200_BF16_DENSE_FLOPS)
    return float(budget), source, float(peak)


def _layout_line(lay: dict) -> str:
    given = [f for f in ("precision", "remat", "microbatch") if f not in lay["chosen"]]
    return (f"layout: {lay['precision']}, remat {lay['remat']}, microbatch {lay['microbatch']} "
            f"(~{_bytes(lay['estimate_bytes'])} estimated, budget "
            f"{_bytes(lay['memory_per_device'])}: {lay['budget_source']}; "
            f"given: {', '.join(given) or 'none'})")


def _compiled_plan(rung, args, budget: float, budget_source: str, given: dict) -> dict:
    """The `compiled` and `compiled_eval` blocks of `plan --compile`: XLA's figures of the real
    train step at the layout chosen by XLA's memory figure (ladder.trainer.layout.fit_layout),
    and of the eval step at its precision. A ValueError names the option (as in plan_main)."""
    from ladder.trainer.layout import fit_layout
    from ladder.trainer.plan import compile_eval

    found = fit_layout(rung, args.devices, budget, expert_parallel=args.expert_parallel,
                       budget_source=budget_source, **given)
    step, lay = found.step, found.layout
    note = (f"chose {lay.precision}, remat {lay.remat}, microbatch {lay.microbatch}: the "
            f"first of the rule's order (less remat, then larger microbatches first) whose "
            f"compiled step fits {_bytes(budget)} per device" if found.fits else
            f"no layout fits {_bytes(budget)} per device; the most frugal tried "
            f"(remat {lay.remat}, microbatch {lay.microbatch}) needs "
            f"{_bytes(step.bytes_per_device)}")
    ev = compile_eval(lay.apply(rung), args.devices, eval_batch=args.eval_batch,
                      expert_parallel=args.expert_parallel)
    d, e = step.to_dict(), ev.to_dict()
    return {"compiled": {k: d[k] for k in (
                "bytes_per_device", "flops_per_device", "flops_v1_per_device", "flops_ratio",
                "xla_flops", "loops", "collectives", "collective_bytes", "precision", "remat",
                "argument_bytes", "temp_bytes", "output_bytes", "alias_bytes", "compile_s")},
            "compiled_eval": {k: e[k] for k in (
                "bytes_per_device", "flops_per_device", "eval_batch", "flops_v1_per_device",
                "flops_ratio", "xla_flops", "temp_bytes", "collectives", "collective_bytes",
                "compile_s")},
            "layout": lay.to_dict(), "largest_fitting": found.largest_fitting,
            "next_layout_predicted": found.next_predicted,
            "compiled_mesh": step.mesh, "microbatch": step.microbatch,
            "microbatches": step.microbatches, "layout_search": [dict(t) for t in found.tried],
            "microbatch_note": note, "compiled_fits": found.fits,
            "compiled_eval_fits": ev.bytes_per_device <= budget,
            "compiled_on": "fake CPU devices (XLA CPU backend)"}


def isoflop_main(args) -> int:
    """`ladder isoflop`: Approaches 1 and 2 (ladder.fit.isoflop) on a points table or runs, the
    compute-optimal N and D for ``--budget``, the figure with ``--plot`` (reports.isoflop)."""
    from pathlib import Path

    from ladder.fit.isoflop import isoflop
    from ladder.fit.points import load_points
    from ladder.io import atomic_write_bytes, check_writable, read_table, to_jsonable

    number(args.level, field="--level", lo=0, hi=1, lo_open=True, hi_open=True,
           exit_code=EX_USAGE)
    number(args.bootstrap, field="--bootstrap", lo=0, hi=100_000, integral=True,
           exit_code=EX_USAGE)
    number(args.budget, field="--budget", lo=0, lo_open=True, allow_none=True,
           exit_code=EX_USAGE)
    if args.plot:
        check_writable(args.plot, field="--plot")
    renames = {}
    for item in args.column or []:
        new, eq, old = item.partition("=")
        if not eq or not new.strip() or not old.strip():
            raise InputError(f"expected NAME=COLUMN, got {item!r}", field="--column",
                             exit_code=EX_USAGE)
        renames[old.strip()] = new.strip()
    sources = []
    for src in args.points:
        if Path(src).is_file():  # a table: its columns renamed as asked
            df = read_table(src).rename(columns=renames)
            if "loss" not in df.columns and args.metric and args.metric in df.columns:
                df = df.rename(columns={args.metric: "loss"})
            df.attrs["source"] = src
            sources.append(df)
        else:
            sources.append(src)
    import warnings
    with warnings.catch_warnings():  # dropped rows: named by load_points, printed once
        warnings.simplefilter("default")
        ignore_dropped_writes()
        df = load_points(sources, args.metric)
    res = isoflop(df, bootstrap=args.bootstrap, level=args.level, seed=args.seed,
                  where=", ".join(args.points))
    shown = json.dumps(to_jsonable(res.to_json(args.budget))) if args.json else \
        res.report(args.budget)
    if args.plot:  # written before anything is printed (ladder.cli.output)
        from ladder.reports.isoflop import plot_isoflop
        from ladder.reports.plots import png_bytes
        atomic_write_bytes(args.plot, png_bytes(plot_isoflop(res, args.budget)))
    tell(shown)
    if args.plot:
        tell(f"wrote {args.plot}", file=sys.stderr if args.json else sys.stdout)
    return 0
