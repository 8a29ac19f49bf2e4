"""`python -m harness …` is the `lockstep` command, for environments without the console script."""

import sys

from harness.cli import main

sys.exit(main())
