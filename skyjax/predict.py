"""``python -m skyjax.predict``, the name users type for the command :mod:`skyjax.cli.predict`."""

from skyjax.cli.predict import run

if __name__ == "__main__":
    run()
