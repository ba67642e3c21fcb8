"""`python -m ladder`: the same command line as the `ladder` script (``ladder.cli.main``).

Python looks for the entry point of ``-m ladder`` in this folder, the ladder base, which stands
below the command line (``cli/``). So this file hands over to the ``cli`` package by name (runpy)
instead of importing it: nothing imports this file, and no import runs from ``ladder/`` up to
``ladder/cli/``. tests/test_layers.py names it as the one such handover (``HANDOVERS``).
"""

import runpy

runpy.run_module("ladder.cli", run_name="__main__", alter_sys=True)
