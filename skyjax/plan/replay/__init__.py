"""Replays of a plan: the simulator, which is the spec of what runs, and the times it replays,
whether priced, declared by a profile for a rehearsal, or read from a measured step.

* ``simulate``: an event simulation of a schedule;
* ``exchange_run``: the gradient exchange between pipelines event by event, each device from
  its own last backward;
* ``coding``: what a plan's averaging codes on the wire (phases, bytes, coding rates);
* ``peer_run``: the peer modes' exchange (decentral, async) event by event;
* ``rehearsal``: every action's time a profile declares, for a rehearsal (``config.rehearse``);
* ``measured``: each message's delay read from a measured step's spans.
"""
