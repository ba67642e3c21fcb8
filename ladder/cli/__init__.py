"""The top floor: the `ladder` command line (``ladder.cli.main``, which names the handler modules)
and every function that takes parsed arguments. It may import every package below it (model, the
base, the trainer, fit, predict, reports); nothing imports it.
"""
