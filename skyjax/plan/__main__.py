"""``python -m skyjax.plan``: see :mod:`skyjax.plan.cli`."""

import sys

from skyjax.plan.cli import main

sys.exit(main())
