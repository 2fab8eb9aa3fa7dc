"""A rehearsal of another cluster (``config.rehearse``): its devices on this host's, its plan,
and every call and message of the run taking the time its profile declares.

``cluster`` gives the run one logical device per profiled device (this process's local devices
reused in turn in one process; one process each under ``jax.distributed``) with
:class:`~skyjax.cluster.declared.DeclaredLinks`; ``prepare`` turns the plan the planner chose
on the profile into the rehearsal's time base (``time_scale``) and the declared times that the
executors give their stages; ``report`` is summary.json's ``rehearsal`` record: the measured
step against the simulator's and the cost model's, and what this host added per call.
"""

from __future__ import annotations

import statistics

from skyjax.cluster import Cluster, DeviceSpec
from skyjax.cluster.devices import select_devices
from skyjax.cluster.declared import LEDGER, DeclaredLinks, merge
from skyjax.plan import Plan
from skyjax.plan.replay.declared import Declared, declare, scale_plan, scale_profile
from skyjax.plan.replay.simulate import simulate_plan
from skyjax.profile.format import Profile


def cluster(profile: Profile, time_scale: float, mode: str) -> Cluster:
    """The profiled devices on this host: in one process, each on a local device in turn (the
    declared times, not the device, set its speed); under ``jax.distributed``, the first device
    of each process. Links declared, scaled by ``time_scale``."""
    n = profile.num_devices
    # one process per device under jax.distributed, else local devices in turn
    devices = select_devices("distributed", n)
    specs = [DeviceSpec(name=str(d.get("name", f"device{i}")),
                        kind=f"declared:{d.get('kind', 'device')}",
                        region=str(d.get("region") or "r0"),
                        process_index=int(devices[i].process_index))
             for i, d in enumerate(profile.devices)]
    scaled = scale_profile(profile, time_scale)
    links = DeclaredLinks(scaled.latency_s, scaled.bandwidth_Bps)
    return Cluster(specs, devices, scaled.latency_s, scaled.bandwidth_Bps, emulate_links=True,
                   mode=mode, declared_links=links)


def prepare(plan: Plan, profile: Profile, time_scale: float,
            run_cluster: Cluster) -> tuple[Plan, Profile, Declared]:
    """The plan and profile in the rehearsal's time base (every time x ``time_scale``: the same
    stages, cuts and shares) and the declared times of its calls; the cluster's links learn the
    plan's declared bytes. Clears this process's ledger of declared calls."""
    plan, profile = scale_plan(plan, time_scale), scale_profile(profile, time_scale)
    declared = declare(plan, profile)
    run_cluster.declared_links.declare(declared.wire_bytes, declared.coding_s)
    LEDGER.reset()
    return plan, profile, declared


def report(path: str, time_scale: float, plan: Plan, profile: Profile,
           step_times: list[float], calls: list[dict] | None) -> dict:
    """summary.json's ``rehearsal``: the median measured step (the first, compiling step left
    out; the mean under DiLoCo, whose exchange every H steps the model amortises) against the simulator's step and the cost model's ``T``, in the rehearsal's time base
    and divided by ``time_scale`` (the declared cluster's seconds), the devices and pipelines
    used, and per call the real compute and this host's overhead (``calls``: every process's
    ledger; None on processes other than 0)."""
    simulated = simulate_plan(plan, profile).step_time_s
    steps = step_times[1:] or step_times
    # DiLoCo exchanges every H steps and the model amortises it (AR / H): the mean, not the
    # median, is what it predicts
    average = statistics.mean if plan.averaging.startswith("diloco") else statistics.median
    measured = average(steps) if steps else float("nan")
    return {
        "profile": path, "time_scale": time_scale,
        "devices": profile.num_devices, "devices_used": len(plan.stages),
        "pipelines": plan.num_pipelines, "schedule": plan.schedule,
        "microbatches": plan.microbatches,
        "measured_step_s": measured, "simulated_step_s": simulated,
        "model_step_s": plan.step_time_s,
        "error": (measured - simulated) / simulated if simulated else None,
        "declared_cluster_step_s": {"measured": measured / time_scale,
                                    "simulated": simulated / time_scale,
                                    "model": plan.step_time_s / time_scale},
        "steps_measured": len(steps),
        "calls": merge(calls) if calls else None,
    }


def ledger() -> dict:
    """This process's ledger of declared calls (for :func:`report`'s ``calls``)."""
    return LEDGER.to_json()

