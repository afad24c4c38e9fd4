"""Will the trials fit? Checked against the cluster's nodes before any trial starts.

Pure arithmetic over ``ray.nodes()``-shaped dicts, so every case is testable without a
cluster. A trial is ``workers_per_trial`` workers, each needing ``worker_cpus`` CPUs and
``worker_gpus`` GPUs on one node; workers of one trial may span nodes.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

from .config import ResourcesConfig
from .errors import ResourceError


def alive_node_resources(nodes: Iterable[Mapping]) -> list[dict[str, float]]:
    return [dict(n.get("Resources", {})) for n in nodes if n.get("Alive", True)]


def workers_that_fit(node: Mapping[str, float], cpus: float, gpus: float) -> int:
    """How many workers of this size one node can hold at once."""
    limits = [math.floor(node.get("CPU", 0.0) / cpus + 1e-9)] if cpus > 0 else []
    if gpus > 0:
        limits.append(math.floor(node.get("GPU", 0.0) / gpus + 1e-9))
    return max(0, min(limits)) if limits else 0


def concurrent_trials_capacity(resources: ResourcesConfig, nodes: Iterable[Mapping]) -> int:
    """Trials the cluster can run at once; raises ``ResourceError`` if not even one fits."""
    nodes = alive_node_resources(nodes)
    cpus, gpus, workers = resources.worker_cpus, resources.worker_gpus, resources.workers_per_trial
    slots = sum(workers_that_fit(node, cpus, gpus) for node in nodes)
    per_worker = f"{cpus:g} CPU(s)" + (f" and {gpus:g} GPU(s)" if gpus else "")
    what = "a trial" if workers == 1 else f"each of a trial's {workers} workers"
    if not any(workers_that_fit(node, cpus, gpus) for node in nodes):
        most_cpu = max((n.get("CPU", 0.0) for n in nodes), default=0.0)
        most_gpu = max((n.get("GPU", 0.0) for n in nodes), default=0.0)
        raise ResourceError(
            f"{what} needs {per_worker} on one node, but the largest node has {_amount(most_cpu, 'CPU')} and "
            f"{_amount(most_gpu, 'GPU')} ({len(nodes)} node(s)); lower resources.* or add a larger node"
        )
    if slots < workers:
        total_cpu = sum(n.get("CPU", 0.0) for n in nodes)
        total_gpu = sum(n.get("GPU", 0.0) for n in nodes)
        raise ResourceError(
            f"a trial needs {workers} workers of {per_worker} = {workers * cpus:g} CPUs"
            + (f" and {workers * gpus:g} GPUs" if gpus else "")
            + f", but the cluster can hold only {slots} such workers ({total_cpu:g} CPUs, {total_gpu:g} GPUs "
            f"in {len(nodes)} node(s)); lower resources.workers_per_trial or what each worker needs "
            "(resources.cpus_per_worker, gpus_per_worker), or add nodes"
        )
    return slots // workers


def _amount(count: float, unit: str) -> str:
    """``1 CPU``, ``0.5 GPUs``, ``8 CPUs`` (audit 34: "has 1 CPUs")."""
    return f"{count:g} {unit}" + ("" if count == 1 else "s")
