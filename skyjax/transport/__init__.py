"""Moving activations and gradients between pipeline stages.

One small interface, :class:`Transport`, two implementations: :class:`LocalTransport` (every
stage a thread of one process; ``send`` is an asynchronous ``jax.device_put`` onto the
receiver's device) and :class:`TransferServerTransport` (one process per stage under
``jax.distributed``; arrays move point to point with ``jax.experimental.transfer``, host scalars
through the key-value store). Messages are matched by (src, dst, tag, n).

* ``base``: the :class:`Transport` protocol, its errors, the link-emulation clock;
* ``local``: :class:`LocalTransport`;
* ``transfer``: :class:`TransferServerTransport`;
* ``server``: the transfer server's start, address, ports and buffers (:class:`ServerOptions`);
* ``group``: ``jax.distributed`` start-up, the key-value store, shutdown;
* ``watchdog``: heartbeats; a lost peer makes waits raise :class:`PeerLost` naming it;
* ``polling``: how a waiting receive looks for its message, and what that costs in lateness;
* ``tags``: every message tag range, in one table;
* ``handoff_timing``: hand-off speed between two processes, GB/s per message size;
* ``handoff_speed``: ``python -m skyjax.transport.handoff_speed``, only naming
  :mod:`skyjax.cli.handoff_speed`.
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
