"""``python -m skyjax.launch``, the name users type for the command :mod:`skyjax.cli.launch`."""

from skyjax.cli.launch import run

if __name__ == "__main__":
    run()
