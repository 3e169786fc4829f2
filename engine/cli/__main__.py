"""`python -m engine.cli ...` is `sopctl ...`."""

import sys

from engine.cli.commands import main

sys.exit(main())
