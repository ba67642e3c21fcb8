"""Nominal peak FLOP/s and memory of the accelerators the planner (step times, a layout that
fits) and the trainer (MFU) know."""

from __future__ import annotations

GB200_BF16_DENSE_FLOPS = 2.5e15

# Nominal dense (no 2:4 sparsity) bf16 peak of one device, matched against jax's device_kind
# (lower-cased substrings, first match wins, so the more specific names come first). Vendors
# quote tensor-core bf16 "with sparsity"; dense is half of that figure.
ACCELERATORS = (
    # (substrings of device_kind, name, FLOP/s, memory bytes, source); memory is the HBM of one
    # device as the same datasheets give it (GB = 1e9 bytes)
    (("gb200",), "GB200", 2.5e15, 186e9, "NVIDIA GB200 NVL72 datasheet: 5 PFLOPS FP16/BF16 per "
     "GPU with sparsity; 13.4 TB HBM3e per 72 GPUs"),
    (("b200",), "B200", 2.25e15, 180e9, "NVIDIA HGX B200 datasheet: 4.5 PFLOPS FP16/BF16 per GPU "
     "with sparsity; 180 GB HBM3e"),
    (("h200",), "H200", 989e12, 141e9, "NVIDIA H200 SXM datasheet: 1,979 TFLOPS BF16 with "
     "sparsity; 141 GB HBM3e"),
    (("h100 pcie",), "H100 PCIe", 756e12, 80e9, "NVIDIA H100 PCIe datasheet: 1,513 TFLOPS BF16 "
     "with sparsity; 80 GB HBM2e"),
    (("h100",), "H100 SXM", 989e12, 80e9, "NVIDIA H100 SXM datasheet: 1,979 TFLOPS BF16 with "
     "sparsity; 80 GB HBM3"),
    (("v5 lite", "v5e"), "TPU v5e", 197e12, 16e9, "Google Cloud TPU v5e docs: 197 TFLOPS BF16, "
     "16 GB HBM per chip"),
    (("v5p", "tpu v5"), "TPU v5p", 459e12, 95e9, "Google Cloud TPU v5p docs: 459 TFLOPS BF16, "
     "95 GB HBM per chip"),
    (("v6 lite", "v6e"), "TPU v6e", 918e12, 32e9, "Google Cloud TPU v6e (Trillium) docs: 918 "
     "TFLOPS BF16, 32 GB HBM per chip"),
)

# The share of a GPU's memory JAX's allocator takes (XLA_PYTHON_CLIENT_MEM_FRACTION, which
# ladder.trainer.gpuenv sets on GPUs unless the user did; JAX's own default is 0.75). NVIDIA's
# JAX-Toolbox performance guide (rosetta/docs/GPU_performance.md): "We typically set it to 0.9
# or 0.8"; the rest is for cuDNN/cuBLAS/NCCL workspaces. A layout is chosen to fit this share.
GPU_MEM_FRACTION = 0.9
# The accelerator `ladder plan` lays a rung out for unless told (--accelerator): the GPU a team
# starts a first rung on (issue 37: an 8 x H100 node).
DEFAULT_PLAN_ACCELERATOR = "h100"


def accelerator_peak(device_kind: str) -> dict | None:
    """{name, flops, memory, source} of the first ACCELERATORS entry with a key in
    ``device_kind`` (case-insensitive), else None."""
    kind = device_kind.lower()
    for keys, name, flops, memory, source in ACCELERATORS:
        if any(key in kind for key in keys):
            return {"name": name, "flops": flops, "memory": memory, "source": source}
    return None


def usable_memory(entry: dict) -> float:
    """Bytes of one device a layout may fill: the datasheet HBM x the allocator's share on GPUs
    (GPU_MEM_FRACTION); a TPU's runtime takes all of it."""
    gpu = not entry["name"].startswith("TPU")
    return entry["memory"] * (GPU_MEM_FRACTION if gpu else 1.0)
