"""``python -m skyjax.plan``, the name users type for the command :mod:`skyjax.cli.plan`."""

from skyjax.cli.plan import run

if __name__ == "__main__":
    run()
