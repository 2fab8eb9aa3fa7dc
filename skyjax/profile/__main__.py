"""``python -m skyjax.profile``, the name users type for the command :mod:`skyjax.cli.profile`."""

from skyjax.cli.profile import run

if __name__ == "__main__":
    run()
