"""Moving activations and gradients between pipeline stages.

One small interface (:class:`Transport`, in :mod:`.base` with the errors and the link-emulation
clock), two implementations:

- :class:`LocalTransport` (:mod:`.local`): every stage is a thread of one process; ``send`` is an
  asynchronous ``jax.device_put`` onto the receiver's device.
- :class:`TransferServerTransport` (:mod:`.transfer`): one process per stage under
  ``jax.distributed``; arrays move point to point with ``jax.experimental.transfer``, host
  scalars through the key-value store; its server's address, ports and buffers:
  :class:`ServerOptions` (:mod:`.server`); hand-off speed between two processes:
  :mod:`.handoff_speed`.

Messages are matched by (src, dst, tag, n); which tags mean what: ``skyjax.transport.tags``.
A lost peer process is noticed by :class:`PeerWatchdog` (:mod:`.watchdog`): waits then raise
:class:`PeerLost` naming the process and its stage.
"""

from skyjax.transport.base import (DEFAULT_TIMEOUT_S, LinkClock, Transport,
                                           TransportError, TransportTimeout)
from skyjax.transport.local import LocalTransport
from skyjax.transport.server import ServerOptions
from skyjax.transport.transfer import TransferServerTransport
from skyjax.transport.watchdog import PeerLost, PeerWatchdog

__all__ = ["DEFAULT_TIMEOUT_S", "LinkClock", "LocalTransport", "PeerLost", "PeerWatchdog",
           "ServerOptions", "TransferServerTransport", "Transport", "TransportError",
           "TransportTimeout"]
