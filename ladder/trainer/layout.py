"""How a rung is laid out on a device's memory: compute precision, rematerialisation and
microbatch, chosen so that the train step fits (issue 37 item 1). None of the three changes
what is trained (f32 master weights whatever the compute precision; remat recomputes the same
values; microbatches accumulate the same gradient with whole capacity cells), only the memory
and the time a step takes.

The rule, on the estimate of plan.py (``plan_rung``):
- precision: bf16 compute over f32 master weights (what accelerators run; CPUs keep f32);
- remat: the least that fits, in the order none < dots < full ("full": ~1/3 more FLOPs);
- microbatch: for that remat, the largest that fits (fewer, larger matmuls).
No remat at a small microbatch is preferred to remat at a large one: the recipe's capacity cell
already gives every device >= 65,536 tokens a microbatch (marin-535b). A value the user gave is
kept. When nothing fits, the most frugal layout is returned with ``fits`` False.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from ladder.io import InputError
from ladder.specs import Rung

log = logging.getLogger(__name__)

REMAT_ORDER = ("none", "dots", "full")   # least recomputation first


@dataclass(frozen=True)
class Layout:
    """One rung's layout on one mesh and the budget it was chosen for (bytes per device)."""

    precision: str                   # bf16 | f32
    remat: str                       # none | dots | full
    microbatch: int                  # sequences per microbatch
    devices: int
    memory_per_device: float         # the budget
    estimate_bytes: float            # plan_rung's estimate of the train step at this layout
    fits: bool
    chosen: tuple[str, ...]          # the fields chosen here (the others were given)
    budget_source: str               # where the budget came from

    def apply(self, rung: Rung) -> Rung:
        """``rung`` computed at this layout's precision and remat (the same function)."""
        return _laid(rung, self.precision, self.remat)

    def train_config(self, cfg):
        """``cfg`` (a TrainConfig) with this layout written in, so config.json records it."""
        return dataclasses.replace(cfg, microbatch=self.microbatch,
                                   model={**cfg.model, "precision": self.precision,
                                          "remat": self.remat})

    def describe(self) -> str:
        given = [f for f in ("precision", "remat", "microbatch") if f not in self.chosen]
        gib = 2 ** 30
        head = (f"layout: precision {self.precision}, remat {self.remat}, microbatch "
                f"{self.microbatch} on {self.devices} devices: ~{self.estimate_bytes / gib:.1f} "
                f"GiB per device estimated, budget {self.memory_per_device / gib:.1f} GiB "
                f"({self.budget_source})")
        tail = f"; chose {', '.join(self.chosen) or 'nothing'}" + \
            (f" (given: {', '.join(given)})" if given else "")
        return head + tail + ("" if self.fits else "; NOTHING FITS: this is the smallest")

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "chosen": list(self.chosen)}


def _laid(rung: Rung, precision: str, remat: str) -> Rung:
    return rung.replace(model=rung.model.replace(precision=precision, remat=remat))


def _chosen(precision, remat, microbatch) -> tuple[str, ...]:
    """The names of the layout fields left to the rule (None)."""
    return tuple(name for name, v in (("precision", precision), ("remat", remat),
                                      ("microbatch", microbatch)) if v is None)


def choose_layout(rung: Rung, devices: int, memory_per_device: float, *,
                  precision: str | None = None, remat: str | None = None,
                  microbatch: int | None = None, expert_parallel: int | None = None,
                  budget_source: str = "given") -> Layout:
    """The layout of ``rung`` on ``devices`` devices that fits ``memory_per_device`` by the
    estimate; ``precision``/``remat``/``microbatch`` given are kept. ValueError naming the
    field when a given microbatch does not split the batch."""
    from ladder.trainer.plan import plan_rung

    chosen = _chosen(precision, remat, microbatch)
    prec = precision or "bf16"
    last = None
    for r, mb in ordered_layouts(rung, devices, remat=remat, microbatch=microbatch):
        est = plan_rung(_laid(rung, prec, r), devices, microbatch=mb,
                        expert_parallel=expert_parallel)
        last = Layout(precision=prec, remat=r, microbatch=mb, devices=devices,
                      memory_per_device=memory_per_device, estimate_bytes=est.total_bytes,
                      fits=est.total_bytes <= memory_per_device, chosen=chosen,
                      budget_source=budget_source)
        if last.fits:
            return last
    return last


def ordered_layouts(rung: Rung, devices: int, *, precision: str | None = None,
                    remat: str | None = None, microbatch: int | None = None
                    ) -> list[tuple[str, int]]:
    """Every (remat, microbatch) the rule may choose, in its order of preference. When no
    microbatch splits into whole cells: the whole batch (the mesh check refuses it by name)."""
    from ladder.trainer.plan import microbatch_candidates

    remats = (remat,) if remat is not None else REMAT_ORDER
    mbs = [microbatch] if microbatch is not None else \
        (microbatch_candidates(rung, devices) or [rung.batch])
    return [(r, m) for r in remats for m in mbs]


def device_memory_budget(devices) -> tuple[float, str] | None:
    """(bytes a layout may fill on one device, where that figure came from) for JAX
    ``devices`` on an accelerator, else None (CPU, or an unknown accelerator): the allocator's
    ``bytes_limit`` when the runtime reports it, else the accelerator table's usable memory."""
    from ladder.accelerators import accelerator_peak, usable_memory

    dev = devices[0]
    if dev.platform == "cpu":
        return None
    try:
        stats = dev.memory_stats() or {}
    except Exception:   # noqa: BLE001  (a runtime without memory_stats: use the table)
        stats = {}
    if stats.get("bytes_limit"):
        return float(stats["bytes_limit"]), f"{dev.device_kind}: the allocator's bytes_limit"
    entry = accelerator_peak(dev.device_kind)
    if entry is None:
        return None
    return usable_memory(entry), f"{entry['name']} in ladder/accelerators.py x its usable share"


def run_layout(rung: Rung, cfg) -> Layout | None:
    """The layout ``ladder run`` trains ``rung`` with under ``cfg`` (a TrainConfig) on this
    process's devices (``fit_layout`` without the walk up). None when there is nothing to
    choose: on CPU, on an accelerator of unknown memory, or when all three were given."""
    import jax

    given_prec = cfg.model.get("precision")
    given_prec = None if given_prec in (None, "auto") else given_prec
    given = {"precision": given_prec, "remat": cfg.model.get("remat"),
             "microbatch": cfg.microbatch}
    if all(v is not None for v in given.values()):
        return None
    budget = device_memory_budget(jax.devices())
    if budget is None:
        return None
    from ladder.trainer.trainconfig import resolve_rung

    resolved = resolve_rung(rung, dataclasses.replace(cfg, model={
        k: v for k, v in cfg.model.items() if k not in ("precision", "remat")}))
    devices = cfg.run.devices or jax.device_count()
    from ladder.trainer.step import enable_compilation_cache

    enable_compilation_cache()   # the step compiled here is the Session's: a cache hit there
    try:
        layout = fit_layout(resolved, devices, budget[0], budget_source=budget[1],
                            expert_parallel=cfg.run.expert_parallel, search_up=False,
                            **given).layout
    except (ValueError, InputError):
        return None   # the mesh check in the Session names the field
    (log.info if layout.fits else log.warning)("ladder run: %s:%s %s", rung.ladder, rung.name,
                                               layout.describe())
    return layout


@dataclass(frozen=True)
class CompiledLayout:
    """``plan --compile``'s search: the layout chosen by XLA's own memory figure, the compiled
    train step at it, and every layout compiled on the way (``tried``: {remat, microbatch,
    bytes_per_device, fits}, in the rule's order)."""

    layout: Layout                   # the chosen one (estimate_bytes: the estimate's figure)
    step: object                     # ladder.trainer.plan.CompiledStep at that layout
    tried: tuple
    largest_fitting: dict | None     # the most preferred layout whose compiled step fits
    next_predicted: dict | None = None  # the next more preferred one, when not compiled: its
    #                                     estimate x the chosen one's compiled/estimate ratio

    @property
    def fits(self) -> bool:
        return self.step.bytes_per_device <= self.layout.memory_per_device


def fit_layout(rung: Rung, devices: int, memory_per_device: float, *,
               precision: str | None = None, remat: str | None = None,
               microbatch: int | None = None, expert_parallel: int | None = None,
               budget_source: str = "given", search_up: bool = True) -> CompiledLayout:
    """The most preferred layout (the rule's order) whose COMPILED train step fits
    ``memory_per_device``. Compiling a real rung takes minutes, so the walk is guided by the
    estimate scaled to XLA's figure (``ratio`` = compiled / estimated bytes of the last
    compile): from the estimate's choice, while it does not fit, to the next layout in the order
    whose scaled estimate fits (else the most frugal); once one fits, to the first earlier
    layout whose scaled estimate fits and whose compiled step does, until none is left. When
    none fits, the most frugal tried."""
    from ladder.trainer.plan import compile_step, plan_rung

    prec = precision or "bf16"
    order = ordered_layouts(rung, devices, precision=precision, remat=remat,
                            microbatch=microbatch)

    def laid(j: int) -> Rung:
        return _laid(rung, prec, order[j][0])

    estimates = [plan_rung(laid(j), devices, microbatch=order[j][1],
                           expert_parallel=expert_parallel).total_bytes
                 for j in range(len(order))]
    steps: dict[int, object] = {}

    def fits(j: int) -> bool:
        if j not in steps:
            steps[j] = compile_step(laid(j), devices, microbatch=order[j][1],
                                    expert_parallel=expert_parallel)
            log.info("ladder: layout compiled: remat %s, microbatch %d: %.1f GiB per device "
                     "(estimate %.1f GiB)", *order[j], steps[j].bytes_per_device / 2 ** 30,
                     estimates[j] / 2 ** 30)
        return steps[j].bytes_per_device <= memory_per_device

    def ratio(j: int) -> float:
        return steps[j].bytes_per_device / estimates[j]

    # the estimate's choice (choose_layout's): the first that fits by the estimate, else the last
    i = next((j for j, e in enumerate(estimates) if e <= memory_per_device), len(order) - 1)
    while not fits(i) and i + 1 < len(order):
        r = ratio(i)
        i = next((j for j in range(i + 1, len(order)) if estimates[j] * r <= memory_per_device),
                 len(order) - 1)
    # earlier in the order, any that fits (the order is not monotone in bytes)
    while search_up and fits(i):
        r = ratio(i)
        earlier = [j for j in range(i) if j not in steps and estimates[j] * r <= memory_per_device]
        for j in earlier:
            if fits(j):
                i = j
                break
        else:
            break
    step = steps[i]
    chosen = Layout(precision=prec, remat=order[i][0], microbatch=order[i][1],
                    devices=devices, memory_per_device=memory_per_device,
                    estimate_bytes=estimates[i], fits=step.bytes_per_device <= memory_per_device,
                    chosen=_chosen(precision, remat, microbatch), budget_source=budget_source)
    tried = tuple({"remat": order[j][0], "microbatch": order[j][1],
                   "bytes_per_device": s.bytes_per_device, "estimate_bytes": estimates[j],
                   "fits": s.bytes_per_device <= memory_per_device}
                  for j, s in sorted(steps.items()))
    fitting = [t for t in tried if t["fits"]]
    nxt = None
    if chosen.fits and i > 0 and i - 1 not in steps:
        # the next more preferred layout, not compiled: its estimate scaled to XLA's figure
        nxt = {"remat": order[i - 1][0], "microbatch": order[i - 1][1],
               "predicted_bytes": estimates[i - 1] * ratio(i)}
    return CompiledLayout(layout=chosen, step=step, tried=tried,
                          largest_fitting=fitting[0] if fitting else None, next_predicted=nxt)
