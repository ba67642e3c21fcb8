"""The Ray executor: the tiny ladder as Ray tasks on a local Ray equals the sequential run, rung by
rung; a rung whose task dies, or is preempted, is retried from its checkpoint; bad options fail
with one line.

Ray is a dev dependency: this module imports it unconditionally, so CI fails (not skips) without it.
"""

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import pytest
import ray

from ladder.cli.main import main
from ladder.io import InputError, read_json, read_metrics
from ladder.specs import LADDERS
from ladder.trainer.executor import parse_resources, run_ladder_ray, rung_task
from ladder.trainer.train import train_rung
from ladder.trainer.trainconfig import RunArgs, TrainConfig

LADDER = LADDERS["tiny"]
CFG = TrainConfig(run=RunArgs(peak_flops=1e11, progress=False))
VOLATILE = ("time", "throughput/tokens_per_s", "throughput/mfu")  # wall-clock, not numbers
FLAKY_STEPS = 20


PREEMPT_AT = 17


def flaky_task(rung, out, cfg, max_steps, resume):
    """The first attempt on the target rung trains 20 steps (checkpointed at its stop) and then
    dies as a lost node would; the first attempt on the first rung gets the SIGTERM of a
    preemption at step 17; every other call is the real task."""
    marker = Path(out).parent / f".{rung.name}.crashed-once"
    marker.parent.mkdir(parents=True, exist_ok=True)
    if rung.is_target and not marker.exists():
        marker.touch()
        rung_task(rung, out, cfg, FLAKY_STEPS, resume)
        raise RuntimeError("simulated node loss")
    if rung == LADDER.rungs[0] and not marker.exists():
        marker.touch()

        def preempt(row):
            if row["step"] == PREEMPT_AT:
                os.kill(os.getpid(), signal.SIGTERM)
        return train_rung(rung, out, cfg, max_steps=max_steps, resume=resume,
                          on_metrics=preempt)
    return rung_task(rung, out, cfg, max_steps, resume)


@pytest.fixture
def local_ray(monkeypatch):
    """A local Ray with 2 CPUs for this test, its temp dir (short: Ray's socket paths must fit
    in 107 bytes) removed afterwards."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    ray.init(num_cpus=2, _temp_dir=tmp, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # flaky_task, by value
    try:
        yield tmp
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    assert not Path(tmp).exists()


def _rows(path: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in read_metrics(path)]


@pytest.mark.slow
def test_tiny_ladder_through_ray_equals_the_sequential_run(local_ray, tmp_path):
    lines: list[str] = []
    result = run_ladder_ray(list(LADDER.all), tmp_path / "ray" / "tiny", CFG, max_retries=1,
                            resources={r.name: {"num_cpus": 1} for r in LADDER.all},
                            poll_s=0.2, log=lines.append, task=flaky_task)
    assert result.exit_code == 0, [o.errors for o in result.outcomes]
    for rung in LADDER.all:
        seq = tmp_path / "seq" / rung.name
        ref = train_rung(rung, seq, CFG)
        got = read_json(tmp_path / "ray" / "tiny" / rung.name / "summary.json",
                        schema="run-summary")
        assert got["status"] == "complete" and got["final"] == ref["final"], rung.name
        assert _rows(tmp_path / "ray" / "tiny" / rung.name / "metrics.jsonl") == \
            _rows(seq / "metrics.jsonl"), rung.name
    target = [o for o in result.outcomes if o.name == LADDER.target.name][0]
    assert target.attempts == 2 and "simulated node loss" in target.errors[0]
    # streamed status: every rung queued, then done; the target's retry from its checkpoint
    for rung in LADDER.all:
        mine = [line for line in lines if line.startswith(f"tiny/{rung.name}: ")]
        assert mine[0].startswith(f"tiny/{rung.name}: queued")
        assert mine[-1].startswith(f"tiny/{rung.name}: complete at step {rung.steps}/")
    assert any(f"retry 1/1 from checkpoint step {FLAKY_STEPS}" in line for line in lines)
    first = [o for o in result.outcomes if o.name == LADDER.rungs[0].name][0]
    assert first.attempts == 2 and first.errors == [f"preempted (SIGTERM) at step {PREEMPT_AT}"]
    assert f"tiny/{first.name}: preempted at step {PREEMPT_AT}; retry 1/1 from checkpoint " \
        f"step {PREEMPT_AT}" in lines


def paced_task(rung, out, cfg, max_steps, resume):
    """The real task, 0.1 s slower per step, so that the driver can be stopped mid-rung."""
    import time

    return train_rung(rung, out, cfg, max_steps=max_steps, resume=resume,
                      on_metrics=lambda row: time.sleep(0.1))


@pytest.mark.slow
def test_stopping_the_driver_checkpoints_running_rungs_then_resume_completes(local_ray,
                                                                             tmp_path):
    lines: list[str] = []

    def log(line):
        lines.append(line)
        if "running (checkpointed: step 15/" in line and not any("asked" in x for x in lines):
            os.kill(os.getpid(), signal.SIGTERM)   # the ladder's job is being preempted

    out = tmp_path / "ray" / "tiny"
    before = signal.getsignal(signal.SIGTERM)   # Ray's own handler, installed by ray.init
    result = run_ladder_ray(list(LADDER.all), out, CFG, poll_s=0.2, log=log, task=paced_task)
    assert result.exit_code == 143 and result.signal == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before
    assert any("SIGTERM: 4 rung(s) asked to checkpoint and stop" in x for x in lines)
    stopped = [o for o in result.outcomes if o.summary and o.summary.get("interrupted")]
    cancelled = [o for o in result.outcomes if o.cancelled]
    assert stopped and len(stopped) + len(cancelled) == len(LADDER.all)   # 2 CPUs: 2 ran
    for o in stopped:   # each checkpointed where it stopped: a rolling checkpoint, or the
        # permanent one when the stop fell on a scheduled save step (trainer/checkpointing.py;
        # seen under load: a rung stopped at step 32, a quarter of its run)
        step = o.summary["step"]
        assert 15 <= step < o.summary["steps"]
        ck = o.out / "checkpoints"
        assert (ck / "rolling" / str(step)).is_dir() or (ck / str(step)).is_dir(), \
            sorted(p.relative_to(ck) for p in ck.rglob("*") if p.is_dir() and p.name.isdigit())
    again = run_ladder_ray(list(LADDER.all), out, CFG, resume=True, poll_s=0.2,
                           log=lambda line: None)
    assert again.exit_code == 0
    name = stopped[0].name
    ref = train_rung(LADDER.get(name), tmp_path / "seq" / name, CFG)
    assert read_json(out / name / "summary.json", schema="run-summary")["final"] == ref["final"]
    assert _rows(out / name / "metrics.jsonl") == _rows(tmp_path / "seq" / name / "metrics.jsonl")


def test_resources_per_rung_parsing():
    names = ["a", "b"]
    assert parse_resources(None, names) == {"a": {"num_cpus": 1}, "b": {"num_cpus": 1}}
    assert parse_resources('{"num_gpus": 8}', names) == {"a": {"num_gpus": 8},
                                                         "b": {"num_gpus": 8}}
    got = parse_resources('{"*": {"num_cpus": 2}, "b": {"num_gpus": 4, "resources": '
                          '{"rack": 1}}}', names)
    assert got == {"a": {"num_cpus": 2}, "b": {"num_gpus": 4, "resources": {"rack": 1}}}
    for bad, field in [("{", "--resources-per-rung"), ("[1]", "--resources-per-rung"),
                       ('{"c": {"num_cpus": 1}}', "--resources-per-rung.c"),
                       ('{"num_gpu": 1}', "--resources-per-rung.*.num_gpu"),
                       ('{"num_cpus": -1}', "--resources-per-rung.*.num_cpus")]:
        with pytest.raises(InputError, match=field.replace("*", r"\*")):
            parse_resources(bad, names)


@pytest.mark.parametrize("args, field", [
    (["--resources-per-rung", '{"gpus": 1}'], "gpus"),
    (["--max-retries", "-1"], "--max-retries"),
    (["--coordinator", "127.0.0.1:1234", "--num-processes", "2", "--process-id", "0"],
     "--executor")])
def test_bad_ray_options_fail_with_one_line(tmp_path, capsys, args, field):
    code = main(["run", "tiny", "--executor", "ray", "--out", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err.strip()
    assert code == 64 and len(err.splitlines()) == 1 and field in err
    assert not (tmp_path / "o").exists()
    assert ray.__version__  # the executor's engine is installed (a dev dependency)


def test_ray_options_need_the_ray_executor(tmp_path, capsys):
    code = main(["run", "tiny", "--address", "auto", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 64 and "--address" in err and "--executor ray" in err
