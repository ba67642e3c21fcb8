"""`python -m ladder`: the same command line as the `ladder` script."""

import sys

from ladder.cli import main

sys.exit(main())
