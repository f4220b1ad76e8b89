"""`python -m repro`: see repro/cli/main.py."""

import sys

from repro.cli.main import main

sys.exit(main())
