"""`python -m ladder`: the `ladder` command line. This folder (the base) stands below ``cli/``,
so it hands over by name (runpy) rather than importing upward: the one handover
tests/test_layers.py allows (``HANDOVERS``).
"""

import runpy

runpy.run_module("ladder.cli", run_name="__main__", alter_sys=True)
