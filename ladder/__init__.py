"""ladder: scaling ladders for MoE pre-training. This folder is the base every layer stands on:
inputs and atomic writes, ladders and rungs, counting, run directories (plain Python, no JAX);
the trainer is ``ladder.trainer``, the command line ``cli``.

Importing this package is cheap: nothing here imports JAX. The model layers, the trainer and
`plan` import JAX when they are used.
"""

__version__ = "0.1.0"
