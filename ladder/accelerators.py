"""Nominal peak FLOP/s of the accelerators the planner and the trainer's MFU know (plain data,
part of the ladder base: ``ladder.trainer.plan`` estimates step times with it,
``ladder.trainer.train`` divides by it for MFU)."""

from __future__ import annotations

GB200_BF16_DENSE_FLOPS = 2.5e15

# Nominal dense (no 2:4 sparsity) bf16 peak of one device, matched against jax's device_kind
# (lower-cased substring, first match wins, so the more specific names come first). Vendors
# quote tensor-core bf16 "with sparsity"; dense is half of that figure.
ACCELERATORS = (
    # (substring of device_kind, name, FLOP/s, source)
    ("gb200", "GB200", 2.5e15, "NVIDIA GB200 NVL72 datasheet: 5 PFLOPS FP16/BF16 per GPU with "
     "sparsity"),
    ("b200", "B200", 2.25e15, "NVIDIA HGX B200 datasheet: 4.5 PFLOPS FP16/BF16 per GPU with "
     "sparsity"),
    ("h200", "H200", 989e12, "NVIDIA H200 SXM datasheet: 1,979 TFLOPS BF16 with sparsity"),
    ("h100 pcie", "H100 PCIe", 756e12, "NVIDIA H100 PCIe datasheet: 1,513 TFLOPS BF16 with "
     "sparsity"),
    ("h100", "H100 SXM", 989e12, "NVIDIA H100 SXM datasheet: 1,979 TFLOPS BF16 with sparsity"),
    ("v5 lite", "TPU v5e", 197e12, "Google Cloud TPU v5e docs: 197 TFLOPS BF16 per chip"),
    ("v5e", "TPU v5e", 197e12, "Google Cloud TPU v5e docs: 197 TFLOPS BF16 per chip"),
    ("v5p", "TPU v5p", 459e12, "Google Cloud TPU v5p docs: 459 TFLOPS BF16 per chip"),
    ("tpu v5", "TPU v5p", 459e12, "Google Cloud TPU v5p docs: 459 TFLOPS BF16 per chip"),
    ("v6 lite", "TPU v6e", 918e12, "Google Cloud TPU v6e (Trillium) docs: 918 TFLOPS BF16 per "
     "chip"),
    ("v6e", "TPU v6e", 918e12, "Google Cloud TPU v6e (Trillium) docs: 918 TFLOPS BF16 per chip"),
)


def accelerator_peak(device_kind: str) -> dict | None:
    """{name, flops, source} of the first ACCELERATORS entry whose key is in ``device_kind``
    (case-insensitive), else None."""
    kind = device_kind.lower()
    for key, name, flops, source in ACCELERATORS:
        if key in kind:
            return {"name": name, "flops": flops, "source": source}
    return None
