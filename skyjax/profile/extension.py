"""Extra probes: what a caller may add to the profiler's measurements, and nothing more.

The core profiler measures devices that compute independently: every process times its own
device at once, in one pass, and records the core terms of profile.json. A cluster whose
devices interfere in ways those terms do not express (processes that share one host's CPU
cores: :mod:`skyjax.hostmodel`) hands the profiler an :class:`ExtraProbes` as
``Options.host``; ``None``, the default, is the core profiler alone (:class:`CoreProbes`), and
then nothing of the extra model runs or is imported. The profiler calls the probes object
(``Options.probes``) and never asks which one it has. Pure typing; no JAX.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class ExtraProbes(Protocol):
    """The profiler's hooks; :class:`CoreProbes` is what each does without extra probes."""

    one_at_a_time: bool  # devices take turns, each timed while the others wait at a barrier

    def turns(self, rank: int, num_devices: int, p: int) -> list[int]:
        """The devices whose turn comes, in order, in pass ``p`` of a profile taken by one
        process per device (``rank``: this process's device)."""

    def combine_passes(self, timed: list[dict[str, Any]]) -> dict[str, Any]:
        """One ``units.measure_units`` result from those of ``Options.passes`` passes."""

    def wake_records(self, chain: list, timed: list, inputs: dict, labels: np.ndarray,
                     targets: list, params_on: Any) -> list[dict | None]:
        """Per measured device, profile.json device keys for calls after idle (None: none)."""

    def device_fields(self) -> dict:
        """profile.json device keys this process adds for its own devices."""

    def record_devices(self, devices: list[dict], measured: dict) -> None:
        """Adds the extra device keys of ``measured`` (``units.measure_units``'s, combined) to
        profile.json's ``devices`` records, in place."""

    def message_costs(self, transport: Any, rank: int, cluster: Any, message_bytes: int,
                      link_repeats: int, tag: int) -> tuple[dict | None, int]:
        """This process's message-cost record (None: not probed) and the next free tag."""

    def loaded_links(self, costs: list[dict | None], devices: list[dict], latency: np.ndarray,
                     bandwidth: np.ndarray, message_bytes: int) -> tuple[list, np.ndarray]:
        """The per-device message costs and the link latencies, after what the probes add."""


class CoreProbes:
    """No extra probes: every device timed at once in one pass, the core terms only."""

    one_at_a_time = False

    @staticmethod
    def turns(rank: int, num_devices: int, p: int) -> list[int]:
        return [rank]

    @staticmethod
    def combine_passes(timed: list[dict[str, Any]]) -> dict[str, Any]:
        if len(timed) != 1:
            raise ValueError("several profiling passes need the shared-host model "
                             "(config.cluster.shared_host)")
        return timed[0]

    @staticmethod
    def wake_records(chain: list, timed: list, inputs: dict, labels: np.ndarray, targets: list,
                     params_on: Any) -> list[dict | None]:
        return [None] * len(targets)

    @staticmethod
    def device_fields() -> dict:
        return {}

    @staticmethod
    def record_devices(devices: list[dict], measured: dict) -> None:
        return None

    @staticmethod
    def message_costs(transport: Any, rank: int, cluster: Any, message_bytes: int,
                      link_repeats: int, tag: int) -> tuple[dict | None, int]:
        return None, tag

    @staticmethod
    def loaded_links(costs: list[dict | None], devices: list[dict], latency: np.ndarray,
                     bandwidth: np.ndarray, message_bytes: int) -> tuple[list, np.ndarray]:
        return costs, latency


CORE = CoreProbes()
