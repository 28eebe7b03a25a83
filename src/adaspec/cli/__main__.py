"""``python -m adaspec.cli``: the same as the ``adaspec`` command."""

import sys

from adaspec.cli import main

sys.exit(main())
