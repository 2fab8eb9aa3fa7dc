"""``python -m skyjax.profile.compose``, the name users type for the command
:mod:`skyjax.cli.compose`."""

from skyjax.cli.compose import run

if __name__ == "__main__":
    run()
