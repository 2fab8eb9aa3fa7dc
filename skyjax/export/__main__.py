"""``python -m skyjax.export``, the name users type for the command :mod:`skyjax.cli.export`."""

from skyjax.cli.export import run

if __name__ == "__main__":
    run()
