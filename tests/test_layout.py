"""The default layout (issue 37 item 1): precision, remat and microbatch chosen to fit the
device's memory by the estimate, the user's values kept; collective bytes from compiled HLO."""

import pytest


from ladder.accelerators import accelerator_peak, usable_memory
from ladder.specs import LADDERS
from ladder.trainer.layout import REMAT_ORDER, choose_layout, ordered_layouts
from ladder.trainer.plan import collective_bytes, microbatch_candidates, plan_rung


def tiny():
    # 8 sequences: microbatches of 8, 4, 2 or 1 on one device
    return LADDERS["tiny"].rungs[0].replace(batch=8)


def estimate(rung, remat, mb, precision="bf16"):
    model = rung.model.replace(precision=precision, remat=remat)
    return plan_rung(rung.replace(model=model), 1, microbatch=mb).total_bytes


def test_order_prefers_less_remat_then_larger_microbatches():
    rung = tiny()
    assert ordered_layouts(rung, 1) == [(r, m) for r in REMAT_ORDER for m in (8, 4, 2, 1)]
    assert ordered_layouts(rung, 1, remat="full", microbatch=2) == [("full", 2)]


def test_chosen_is_the_first_of_the_order_that_fits():
    rung = tiny()
    sizes = {(r, m): estimate(rung, r, m) for r, m in ordered_layouts(rung, 1)}
    # a budget between two of them: the chosen one is the first in order whose estimate fits
    for budget in sorted(sizes.values()):
        lay = choose_layout(rung, 1, budget)
        first = next(k for k in ordered_layouts(rung, 1) if sizes[k] <= budget)
        assert (lay.remat, lay.microbatch) == first and lay.fits
        assert lay.precision == "bf16" and lay.estimate_bytes == sizes[first]
        assert lay.chosen == ("precision", "remat", "microbatch")
    # more memory than the largest needs: no remat, the whole batch in one microbatch
    lay = choose_layout(rung, 1, 1e12)
    assert (lay.remat, lay.microbatch) == ("none", 8)
    # nothing fits: the most frugal layout, said so
    lay = choose_layout(rung, 1, 1.0)
    assert (lay.remat, lay.microbatch, lay.fits) == ("full", 1, False)
    assert "NOTHING FITS" in lay.describe()


def test_given_values_are_kept():
    rung = tiny()
    lay = choose_layout(rung, 1, 1.0, precision="f32", remat="dots", microbatch=4)
    assert (lay.precision, lay.remat, lay.microbatch, lay.chosen) == ("f32", "dots", 4, ())
    lay = choose_layout(rung, 1, 1e12, remat="full")
    assert (lay.remat, lay.microbatch, lay.chosen) == ("full", 8, ("precision", "microbatch"))
    assert lay.estimate_bytes == estimate(rung, "full", 8)


def test_layout_is_the_same_function():
    # precision and remat are how, not what: the laid-out rung keeps every other field
    rung = tiny()
    lay = choose_layout(rung, 1, 1.0)
    laid = lay.apply(rung)
    assert laid.model == rung.model.replace(precision="bf16", remat="full")
    assert laid.replace(model=rung.model) == rung


def test_train_config_records_the_layout():
    from ladder.trainer.trainconfig import TrainConfig, train_config

    lay = choose_layout(tiny(), 1, 1.0)
    cfg = lay.train_config(TrainConfig(model={"top_k": 2}))
    assert cfg.microbatch == 1
    assert cfg.model == {"top_k": 2, "precision": "bf16", "remat": "full"}
    assert train_config(cfg.to_dict()) == cfg            # round-trips through config.json


def test_marin_first_rung_fits_an_h100_by_default():
    rung = LADDERS["marin-535b"].get("1.6B-A61M")
    budget = usable_memory(accelerator_peak("H100 SXM"))
    assert budget == 72e9
    lay = choose_layout(rung, 8, budget)
    assert lay.fits and lay.precision == "bf16"
    # the recipe's cell: 16 sequences per device at least
    assert lay.microbatch in microbatch_candidates(rung, 8) and lay.microbatch >= 128
    # in f32 without remat even the smallest microbatch does not fit (issue 37: 156 GiB)
    f32 = plan_rung(rung.replace(model=rung.model.replace(precision="f32")), 8, microbatch=128)
    assert f32.total_bytes > budget


HLO = """HloModule m

%body (p: (s32[], f32[2,4])) -> (s32[], f32[2,4]) {
  %p = (s32[], f32[2,4]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[2,4]{1,0} get-tuple-element(%p), index=1
  %g = f32[16,4]{1,0} all-gather(%x), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}
  %r = f32[2,4]{1,0} reduce-scatter(%g), channel_id=2, dimensions={0}, to_apply=%add
  %a = bf16[2,4]{1,0} all-to-all(%y), channel_id=3, replica_groups=[1,8]<=[8], dimensions={0}
  ROOT %t = (s32[], f32[2,4]{1,0}) tuple(%i, %r)
}

%cond (p: (s32[], f32[2,4])) -> pred[] {
  %p = (s32[], f32[2,4]{1,0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (x: f32[2,4]) -> f32[2,4] {
  %x = f32[2,4]{1,0} parameter(0)
  %s = f32[2,4]{1,0} all-reduce(%x), channel_id=4, replica_groups=[1,8]<=[8], to_apply=%add
  %ags = (f32[2,4]{1,0}, f32[16,4]{1,0}) all-gather-start(%x), channel_id=5, dimensions={0}
  %w = (s32[], f32[2,4]{1,0}) while(%t0), condition=%cond, body=%body, """ \
    """backend_config={"known_trip_count":{"n":"3"}}
  ROOT %o = f32[2,4]{1,0} get-tuple-element(%w), index=1
}
"""


def test_collective_bytes_count_loops_and_the_larger_buffer():
    got = collective_bytes(HLO)
    # in the loop (3 trips): the all-gather's output 16 x 4 f32 = 256 B, the reduce-scatter's
    # input (the same 256 B), the all-to-all of an operand of unknown type: its bf16 output
    # (2 x 4 x 2 = 16 B); outside: the all-reduce's 32 B, the async all-gather's output 256 B
    assert got["all-gather"] == 3 * 256 + 256
    assert got["reduce-scatter"] == 3 * 256
    assert got["all-to-all"] == 3 * 16
    assert got["all-reduce"] == 32
    assert got["collective-permute"] == 0


@pytest.mark.slow   # two compiles of the tiny step
def test_run_layout_on_an_accelerator(monkeypatch):
    """`ladder run` on a device of known memory (faked here: the CPU's devices with a budget):
    what the user left open is chosen."""
    import ladder.trainer.layout as layout_mod
    from ladder.trainer.layout import device_memory_budget, run_layout
    from ladder.trainer.trainconfig import TrainConfig

    import jax
    assert device_memory_budget(jax.devices()) is None           # CPU: nothing is planned
    monkeypatch.setattr(layout_mod, "device_memory_budget", lambda devs: (1.0, "test budget"))
    rung = LADDERS["tiny"].rungs[0]
    lay = run_layout(rung, TrainConfig())
    assert (lay.precision, lay.remat, lay.microbatch, lay.fits) == ("bf16", "full", 1, False)
    assert lay.budget_source == "test budget"
    lay = run_layout(rung, TrainConfig(model={"remat": "dots", "precision": "f32"}))
    assert (lay.precision, lay.remat, lay.chosen) == ("f32", "dots", ("microbatch",))
    assert run_layout(rung, TrainConfig(microbatch=2, model={"remat": "none",
                                                             "precision": "f32"})) is None


@pytest.mark.slow   # one tiny training step: ~15 s of CPU
def test_run_records_the_layout(monkeypatch, tmp_path):
    """The run records the chosen layout: config.json's train and rung, and the layout block."""
    import ladder.trainer.layout as layout_mod
    from ladder.io import read_json
    from ladder.trainer.train import train_rung
    from ladder.trainer.trainconfig import RunArgs, TrainConfig

    monkeypatch.setattr(layout_mod, "device_memory_budget", lambda devs: (1.0, "test budget"))
    rung = LADDERS["tiny"].rungs[0]
    cfg = TrainConfig(model={"precision": "f32", "remat": "full"},
                      run=RunArgs(peak_flops=1e11, progress=False))
    train_rung(rung, tmp_path / "r", cfg, max_steps=1)
    written = read_json(tmp_path / "r" / "config.json")
    assert written["layout"]["microbatch"] == 1 and written["layout"]["chosen"] == ["microbatch"]
    assert written["train"]["microbatch"] == 1 and written["mesh"]["microbatches"] == rung.batch
    assert written["rung"]["model"]["remat"] == "full"


@pytest.mark.parametrize("inflation", [0.7, 1.0, 1.6, 3.0])
def test_compiled_walk_finds_the_first_fitting_layout_in_few_compiles(monkeypatch, inflation):
    """fit_layout against a compiler whose figure is the estimate x ``inflation`` (XLA:CPU's
    bf16 copies inflate it; a GPU's fused kernels deflate it): it lands on the first layout of
    the order whose compiled step fits, compiling at most a few."""
    from types import SimpleNamespace

    import ladder.trainer.plan as plan_mod
    from ladder.trainer.layout import fit_layout

    rung = tiny()
    compiled = []

    def fake_compile(laid, devices, *, microbatch=None, expert_parallel=None):
        compiled.append((laid.model.remat, microbatch))
        est = plan_rung(laid, devices, microbatch=microbatch).total_bytes
        return SimpleNamespace(bytes_per_device=inflation * est, microbatch=microbatch)

    monkeypatch.setattr(plan_mod, "compile_step", fake_compile)
    order = ordered_layouts(rung, 1)
    sizes = [estimate(rung, r, m) for r, m in order]
    for budget in sorted(set(sizes)) + [sizes[-1] * inflation * 0.5]:
        compiled.clear()
        found = fit_layout(rung, 1, budget)
        fitting = [k for k, b in zip(order, sizes) if b * inflation <= budget]
        want = fitting[0] if fitting else order[-1]
        assert (found.layout.remat, found.layout.microbatch) == want, (budget, compiled)
        assert found.fits == bool(fitting)
        assert len(compiled) <= 3 and len(set(compiled)) == len(compiled)
