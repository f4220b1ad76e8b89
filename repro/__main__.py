"""`python -m repro`: see repro/cli.py."""

import sys

from repro.cli import main

sys.exit(main())
