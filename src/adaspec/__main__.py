"""``python -m adaspec``: the command-line interface (the same as the ``adaspec`` command)."""

import sys

from adaspec.cli import main

sys.exit(main())
