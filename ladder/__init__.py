"""ladder: scaling ladders for MoE pre-training.

Importing this package is cheap: nothing here imports JAX. The model layers, the trainer and
`plan` import JAX when they are used.
"""

__version__ = "0.1.0"
