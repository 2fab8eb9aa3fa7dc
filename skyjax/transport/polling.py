"""How a waiting receive looks for its message: the rule the transport follows
(``skyjax.transport.transfer``) and what it costs a message in lateness, which the
shared-host replay (``skyjax.hostmodel.sharing``) charges. One module for both, so the model follows
the runtime's rule when it changes.

A pull has no working deadline in jax 0.10, so a receive polls ``is_ready()``: sleep(0) between
looks for its first ``SPIN_S`` (a CPU device: ``CPU_SPIN_S``), then the pause doubles up to
``POLL_MIN_CAP_S`` (a CPU device: up to ``POLL_SHARE`` of the time waited so far, within
``POLL_MIN_CAP_S`` .. ``POLL_MAX_S``).
"""

from __future__ import annotations

SPIN_S, CPU_SPIN_S = 2e-3, 5e-4
POLL_MIN_CAP_S, POLL_SHARE, POLL_MAX_S = 200e-6, 0.1, 2e-3


def _spinning(waited_s: float, cpu_device: bool) -> bool:
    """Whether a receive that has waited ``waited_s`` still spins (sleep(0) between looks)."""
    return waited_s <= (CPU_SPIN_S if cpu_device else SPIN_S)


def _cap(waited_s: float, cpu_device: bool) -> float:
    return (min(max(POLL_MIN_CAP_S, POLL_SHARE * waited_s), POLL_MAX_S) if cpu_device
            else POLL_MIN_CAP_S)


def poll_pause(pause: float, waited_s: float, cpu_device: bool = False) -> float:
    """The pause before a waiting receive's next look, after ``pause`` and ``waited_s`` so far.

    A first spin (sleep(0), ~50-70 us with timer slack) for a message that is nearly there,
    then the pause doubles up to 200 us: a message is seen at most ~200 us late. That is the
    rule for a stage whose device is not the host's cores (a GPU, a TPU).

    A CPU device computes on the host's cores, and there a wake-up is not free where other
    stages' processes share them: frequent looks by waiting neighbours slow the one computing
    (three processes looking every 200 us cost a fourth's jitted call on the same cores about
    12 %), and in a pipeline every stage but the bottleneck waits for most of the step. So with
    ``cpu_device`` the spin lasts 0.5 ms (not 2) and the pause doubles up to 10 % of the time
    waited, between 200 us and 2 ms: a message is seen at most ~10 % of its wait late, and a
    long wait wakes the host rarely."""
    if _spinning(waited_s, cpu_device):
        return 0.0
    return min(max(pause * 2, 10e-6), _cap(waited_s, cpu_device))


def expected_lateness(waited_s: float, cpu_device: bool = False) -> float:
    """The mean time between a message's arrival after a wait of ``waited_s`` and the receive's
    look that sees it: half the pause in effect then (the arrival falls anywhere in it; the
    doubling reaches the cap within ~0.3 ms, left out), 0 within the first spin. A CPU
    device's receive after a 20 ms wait: 1 ms."""
    if _spinning(waited_s, cpu_device):
        return 0.0
    return 0.5 * _cap(waited_s, cpu_device)
