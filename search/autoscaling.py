"""The nodes an autoscaling cluster can add, so a search is sized for them before they exist.

A cluster started by Ray's cluster launcher (``ray up cluster.yaml``) keeps the launcher's
config on its head node, in ``~/ray_bootstrap_config.yaml``: the file Ray Tune also looks
for to tell an autoscaling cluster. It lists the node types, with the resources the
launcher filled in from their instance types, and how many of each the autoscaler may
start. A search run on the head sizes its concurrency for the cluster at full scale; the
trials waiting for resources are what makes the autoscaler add the nodes. Without the
file, only the nodes alive when the search starts count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

BOOTSTRAP_CONFIG = Path("~/ray_bootstrap_config.yaml")
HEAD_NODE_RESOURCE = "node:__internal_head__"  # Ray's marker resource of the head node
# How long a distributed trial's ranks may wait for their nodes (Ray Train's default, 60 s,
# is shorter than a cloud GPU node takes to boot and join).
WORKER_GROUP_START_TIMEOUT_S = 900


def addable_nodes(config_path: Path | None = None) -> list[dict[str, Any]]:
    """The worker nodes the autoscaler may start, at most each type's ``max_workers`` and
    the cluster's ``max_workers`` in all, shaped like ``ray.nodes()`` entries; empty when
    this is no cluster launcher's head. A node type whose resources the launcher could not
    fill in is left out: its size is unknown."""
    import yaml

    path = (config_path or BOOTSTRAP_CONFIG).expanduser()
    if not path.is_file():
        return []
    config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}  # written as JSON, which YAML reads
    head_type = config.get("head_node_type")
    workers = [(spec.get("resources") or {}, int(spec.get("max_workers", 0)))
               for name, spec in (config.get("available_node_types") or {}).items() if name != head_type]
    limit = int(config.get("max_workers", sum(count for _, count in workers)))
    nodes: list[dict[str, Any]] = []
    for resources, count in workers:
        if resources:
            node = {"Alive": True, "Resources": {key: float(value) for key, value in resources.items()}}
            nodes.extend(dict(node) for _ in range(count))
    return nodes[:limit]


def head_nodes(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [node for node in nodes if HEAD_NODE_RESOURCE in node.get("Resources", {})]
