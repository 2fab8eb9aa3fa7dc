"""``python -m skyjax.main``, the name users type for the command :mod:`skyjax.cli.train`."""

from skyjax.cli.train import run

if __name__ == "__main__":
    run()
