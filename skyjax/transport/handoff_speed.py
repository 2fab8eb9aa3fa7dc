"""``python -m skyjax.transport.handoff_speed``, the name users type for the command
:mod:`skyjax.cli.handoff_speed`."""

from skyjax.cli.handoff_speed import run

if __name__ == "__main__":
    run()
