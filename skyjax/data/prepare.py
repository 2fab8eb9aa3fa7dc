"""``python -m skyjax.data.prepare``, the name users type for the command
:mod:`skyjax.cli.prepare`."""

from skyjax.cli.prepare import run

if __name__ == "__main__":
    run()
