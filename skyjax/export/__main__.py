"""``python -m skyjax.export``: see :mod:`skyjax.export.cli`."""

import sys

from skyjax.export.cli import main

sys.exit(main())
