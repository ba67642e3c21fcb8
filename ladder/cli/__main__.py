"""`python -m ladder.cli` (and `python -m ladder`, through ladder/__main__.py): the same command
line as the `ladder` script."""

import sys

from ladder.cli.main import main

sys.exit(main())
