"""The top floor: the `ladder` command line (``ladder.cli.main``) and every function that takes
parsed arguments: the handlers (``commands``: list, plan, run, tokenize, isoflop; ``fit``: fit,
compare, predict; ``predict``: preregister, verify, watch; ``report``) and the demo (``demo``).
It may import every package below it (model, the base, the trainer, fit, predict, reports);
nothing imports it.
"""
