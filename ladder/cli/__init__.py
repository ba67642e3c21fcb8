"""The top floor: the `ladder` command line (``ladder.cli.main``), the handlers that join layers
(``cli.commands``) and the demo (``cli.demo``). It may import every package below it (model,
ladder, fit, predict, reports); nothing imports it.
"""
