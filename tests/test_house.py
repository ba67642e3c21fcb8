"""bench/house.py, the figures issue 36 measures the house by: the capability table counts each
product file once, and adds up to the per-package count."""

from pathlib import Path

from bench.house import by_capability, lines

ROOT = Path(__file__).resolve().parents[1]


def test_every_product_line_is_in_exactly_one_capability():
    counts = by_capability(ROOT)
    assert sum(counts.values()) == lines(ROOT)["total"]
    assert all(n > 0 for n in counts.values()), counts  # no group names files that are gone
