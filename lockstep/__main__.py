"""`python -m lockstep …` is the `lockstep` command, for environments without the console script."""

import sys

from lockstep.harness.cli import main

sys.exit(main())
