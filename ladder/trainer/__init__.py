"""The trainer: a ladder's rungs trained with the JAX/Flax model of ``ladder/model/``.

It stands on ``model/`` and the ladder base (the modules of ``ladder/`` itself), beside ``fit/``:
neither sees the other. JAX is imported by the modules here when they are used, never by this
file, so ``import ladder.trainer.trainconfig`` stays cheap.
"""
