"""`python -m ninfer`: the same entry point as the `ninfer` console script."""

from __future__ import annotations

import sys

from ninfer.cli.main import main

sys.exit(main())
