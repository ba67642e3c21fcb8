"""Implementations of `ladder list`, `ladder plan` and `ladder run` (argument parsing is in cli)."""

from __future__ import annotations

import json

from ladder.io import EX_USAGE, InputError
from ladder.specs import LADDERS, Ladder, resolve


def _resolve(target: str):
    try:
        return resolve(target)
    except KeyError as e:
        known = ", ".join(f"{n} ({', '.join(r.name for r in lad.all)})" for n, lad in LADDERS.items())
        raise InputError(f"unknown ladder or rung {e.args[0]!r}; known: {known}",
                         field="LADDER[:RUNG]", exit_code=EX_USAGE) from None


def _fmt(x: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.4g}{unit}"
    return f"{x:.4g}"


def list_main(args) -> int:
    ladders: list[Ladder] = [_resolve(args.ladder)[0]] if args.ladder else list(LADDERS.values())
    rows = [r.summary() for lad in ladders for r in lad.all]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    head = (f"{'ladder':<11} {'rung':<14} {'total':>8} {'active':>8} {'d':>5} {'L':>3} "
            f"{'steps':>8} {'batch':>6} {'tokens':>8} {'C (no head)':>11} {'C':>9} {'peak lr':>8}")
    print(head)
    for s in rows:
        name = s["name"] + (" *" if s["is_target"] else "")
        print(f"{s['ladder']:<11} {name:<14} {_fmt(s['params']):>8} {_fmt(s['active_params']):>8} "
              f"{s['d_model']:>5} {s['n_layers']:>3} {s['steps']:>8,} {s['batch']:>6} "
              f"{_fmt(s['tokens']):>8} {s['compute_no_lm_head']:>11.3e} {s['compute']:>9.3e} "
              f"{s['peak_lr']:>8.2e}")
    conv = {s["param_convention"] for s in rows}
    print(f"* target run. params: {', '.join(sorted(conv))}; FLOPs: flops-v1, C = 3 x forward x "
          f"tokens (see ladder/counting.py)")
    return 0
