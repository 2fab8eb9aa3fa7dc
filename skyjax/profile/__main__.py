"""``python -m skyjax.profile``: see :mod:`skyjax.profile.cli`."""

from absl import app

from skyjax.profile.cli import main

app.run(main)
