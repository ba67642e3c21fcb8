"""GPU settings (issue 37 item 4): set only on a GPU platform, the user's own kept, every flag
known to this jaxlib, recorded."""

from ladder.trainer import gpuenv


def test_gpu_platform_from_the_environment():
    assert gpuenv.gpu_platform({"JAX_PLATFORMS": "cpu"}) is False
    assert gpuenv.gpu_platform({"JAX_PLATFORMS": "cuda"}) is True
    assert gpuenv.gpu_platform({"JAX_PLATFORMS": "cuda,cpu"}) is True
    assert gpuenv.gpu_platform({"JAX_PLATFORMS": "tpu"}) is False
    assert gpuenv.gpu_platform({"CUDA_VISIBLE_DEVICES": ""}) is False


def test_nothing_is_set_off_a_gpu():
    env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    got = gpuenv.apply(env)
    assert env == {"JAX_PLATFORMS": "cpu",
                   "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    assert got["gpu"] is False and got["set"] == {} and got["xla_flags_set"] == []


def test_on_a_gpu_the_settings_are_added_and_the_users_win():
    user = "--xla_gpu_all_reduce_combine_threshold_bytes=1 --xla_dump_to=/tmp/x"
    env = {"JAX_PLATFORMS": "cuda", "XLA_FLAGS": user, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}
    got = gpuenv.apply(env, probe=False)
    flags = env["XLA_FLAGS"].split()
    assert env["XLA_FLAGS"].startswith(user)                         # the user's first, as given
    assert sum("all_reduce_combine_threshold" in f for f in flags) == 1   # theirs, not ours
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in flags
    assert len(flags) == 2 + len(gpuenv.XLA_GPU_FLAGS) - 1
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"            # the user's
    assert got["user"] == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"} and got["set"] == {}
    assert "xla_gpu_all_reduce_combine_threshold_bytes" in got["xla_flags_user"]
    env = {"JAX_PLATFORMS": "cuda"}
    got = gpuenv.apply(env, probe=False)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.9" and got["set"] == {
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}
    assert len(env["XLA_FLAGS"].split()) == len(gpuenv.XLA_GPU_FLAGS)


def test_off_switch():
    env = {"JAX_PLATFORMS": "cuda", "LADDER_GPU_FLAGS": "0"}
    got = gpuenv.apply(env, probe=False)
    assert "XLA_FLAGS" not in env and "XLA_PYTHON_CLIENT_MEM_FRACTION" not in env
    assert "LADDER_GPU_FLAGS=0" in got["note"]


def test_every_flag_is_known_to_this_jaxlib():
    # XLA aborts on an unknown flag: the CPU backend parses the GPU flags too, in a child
    flags = [f"--{k}={v}" for k, v in gpuenv.XLA_GPU_FLAGS]
    assert gpuenv.accepted_flags(flags) == flags
    assert gpuenv.accepted_flags(["--xla_gpu_no_such_flag_here=true"]) == []
