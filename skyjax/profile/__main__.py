"""``python -m skyjax.profile``: see :mod:`skyjax.profile.cli`."""

from absl import app

from skyjax.config.flags import parse_flags
from skyjax.profile.cli import main

app.run(main, flags_parser=parse_flags)
