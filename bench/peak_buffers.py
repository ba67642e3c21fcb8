"""What a compiled train (or eval) step holds at its memory peak, by XLA's own buffer assignment.

    python bench/peak_buffers.py marin-535b:27.7B-A1.2B --devices 64 --microbatch 1024 \
        [--layers 4] [--precision bf16] [--remat full] [--eval] [--top 30]

Compiles the real step (ladder.trainer.plan.compile_step / compile_eval) on ``--devices`` fake
CPU devices with ``--xla_dump_to`` set, then reads two files of the dump: the buffer assignment
(each value's size) and the live ranges (each value's first and last instruction in the
flattened schedule). Their sum over time is the heap XLA plans for; the script prints its
maximum, the largest values live at that instruction (with the JAX op that made them, from the
HLO's metadata) and the total per shape. ``--layers`` compiles a shallower model with the same
per-layer shapes (a scanned group of 4 layers shows what one group's backward holds, in a few
minutes). Issue 37 found this way that the recomputation of every block of a scanned group was
scheduled at once (docs/LOG.md, 2026-12-07).
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def peak_report(dump: str, program: str, top: int) -> dict:
    """The peak of the planned heap of ``program`` (a module name part, e.g. jit_train_step) in
    the dump folder ``dump``: {peak_bytes, at, values: [(bytes, shape, name, op)], by_shape}."""
    base = sorted(glob.glob(f"{dump}/*{program}*buffer-assignment.txt"))[-1]
    base = base.replace("-buffer-assignment.txt", "")
    with open(base + "-buffer-assignment.txt") as f:
        assignment = f.read()
    sizes: dict[str, list] = {}
    for m in re.finditer(r"value: <\d+ ([^ ]+) @\d+> \(size=(\d+),offset=\d+\): (\S+)",
                         assignment):
        sizes.setdefault(m.group(1), []).append((int(m.group(2)), m.group(3)))
    with open(base + "-live-range.txt") as f:
        ranges_text = f.read().split("BufferLiveRange:")[1]
    ranges: dict[str, list] = {}
    for m in re.finditer(r"\n\s+([^\s{]+)\{[^}]*\}:(\d+)-(\d+)", ranges_text):
        ranges.setdefault(m.group(1), []).append((int(m.group(2)), int(m.group(3))))
    values = [(a, b, size, name, shape) for name, rs in ranges.items()
              for (a, b), (size, shape) in zip(rs, sizes.get(name, []))]
    end = max(b for _, b, *_ in values) + 2
    delta = [0] * (end + 1)
    for a, b, size, *_ in values:
        delta[a] += size
        delta[b + 1] -= size
    live, peak, at = 0, 0, 0
    for t in range(end):
        live += delta[t]
        if live > peak:
            peak, at = live, t
    with open(base + ".txt") as f:
        hlo = f.read()
    ops = {m.group(1): m.group(2) for m in re.finditer(
        r"\n\s*(?:ROOT )?%?([\w.\-]+) = [^\n]*?op_name=\"([^\"]*)\"", hlo)}
    at_peak = sorted((v for v in values if v[0] <= at <= v[1]), key=lambda v: -v[2])
    by_shape = collections.Counter()
    for *_, size, _, shape in at_peak:
        by_shape[shape] += size
    return {"peak_bytes": peak, "at": at, "of": end,
            "values": [(size, shape, name, ops.get(name, ""))
                       for _, _, size, name, shape in at_peak[:top]],
            "by_shape": by_shape.most_common(top)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("target", help="LADDER:RUNG")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--microbatch", type=int, default=None, help="sequences (train)")
    ap.add_argument("--eval-batch", type=int, default=None, help="sequences (--eval)")
    ap.add_argument("--layers", type=int, default=None, help="n_layers (default: the rung's)")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--remat", default="full")
    ap.add_argument("--eval", action="store_true", help="the eval step, not the train step")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--dump", default=None, help="dump folder (default: a temporary one)")
    args = ap.parse_args(argv)
    dump = args.dump or tempfile.mkdtemp(prefix="peak_buffers_")
    os.environ["XLA_FLAGS"] = (f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump} "
                               f"--xla_force_host_platform_device_count={args.devices}")
    os.environ["JAX_PLATFORMS"] = "cpu"
    from ladder.specs import resolve
    from ladder.trainer.plan import compile_eval, compile_step

    rung = resolve(args.target)[1][0]
    model = rung.model.replace(precision=args.precision, remat=args.remat)
    if args.layers:
        model = model.replace(n_layers=args.layers)
    rung = rung.replace(model=model)
    if args.eval:
        step = compile_eval(rung, args.devices, eval_batch=args.eval_batch)
    else:
        step = compile_step(rung, args.devices, microbatch=args.microbatch)
    gib = 2 ** 30
    print(f"{args.target} ({model.n_layers} layers) on {args.devices} devices, "
          f"{args.precision}, remat {args.remat}: {step.bytes_per_device / gib:.2f} GiB per "
          f"device (memory_analysis), compiled in {step.compile_s:.0f} s; collective GiB: "
          + ", ".join(f"{k} {v / gib:.1f}" for k, v in step.collective_bytes.items()))
    r = peak_report(dump, "eval_step" if args.eval else "train_step", args.top)
    print(f"planned heap peak {r['peak_bytes'] / gib:.2f} GiB at instruction {r['at']} of "
          f"{r['of']}; largest values live there:")
    for size, shape, name, op in r["values"]:
        print(f"  {size / gib:6.2f} {shape:34s} {name:30s} {op[-100:]}")
    print("by shape:")
    for shape, size in r["by_shape"]:
        print(f"  {size / gib:6.2f} {shape}")
    print(f"dump: {dump}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
