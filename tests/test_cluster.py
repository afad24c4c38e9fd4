"""Searches on a real multi-node Ray cluster on loopback: a head and worker nodes as
separate Ray processes (``ray.cluster_utils.Cluster``), joined with ``--address``."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest
import yaml

from conftest import run_cli, shrunk_example, write_yaml
from test_fault_tolerance import experiment, finish, start, wait_for

pytestmark = pytest.mark.e2e

# Node deaths are noticed within seconds rather than Ray's default half minute.
FAST_HEALTH_CHECKS = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000,
                      "health_check_failure_threshold": 3}


def start_cluster(*workers: dict):
    """A head that runs no trials (0 CPUs) and the given worker nodes."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": FAST_HEALTH_CHECKS})
    nodes = [cluster.add_node(**worker) for worker in workers]
    cluster.wait_for_nodes()
    return cluster, nodes


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def rows(exp_dir: Path) -> dict[int, dict]:
    path = exp_dir / "trials.csv"
    return {int(r["trial"]): r for r in csv.DictReader(path.open())} if path.is_file() else {}


@pytest.fixture
def two_node_cluster():
    """One 2-CPU node, and one 1-CPU node that advertises a (fake) GPU. One cluster at a
    time: two on one machine fight over Ray's fixed ports (metrics, agents)."""
    cluster, (cpu_node, gpu_node) = start_cluster({"num_cpus": 2}, {"num_cpus": 1, "num_gpus": 1})
    yield cluster, cpu_node, gpu_node
    cluster.shutdown()


def test_trials_spread_over_nodes_and_gpu_trials_run_only_on_the_gpu_node(two_node_cluster, tmp_path):
    cluster, cpu_node, gpu_node = two_node_cluster
    # Three trials at once need both nodes: the CPU node holds two, the GPU node one.
    spread = shrunk_example(tmp_path / "runs", **{"name": "spread", "search/num_trials": 6,
                                                  "search/max_concurrent": 3, "scheduler/type": "none",
                                                  "scheduler/max_epochs": 2})
    gpu = shrunk_example(tmp_path / "runs", **{"name": "on-gpu", "search/num_trials": 2, "search/max_concurrent": 2,
                                               "scheduler/type": "none", "scheduler/max_epochs": 1,
                                               "resources/gpus_per_trial": 1})
    for config in (spread, gpu):
        path = write_yaml(tmp_path / f"{config['name']}.yaml", config)
        result = run_cli("run", str(path), "--address", cluster.address, cwd=tmp_path, timeout=400)
        assert result.returncode == 0, result.stdout + result.stderr

    spread_rows = rows(tmp_path / "runs" / "spread")
    assert len(spread_rows) == 6 and all(r["state"] == "COMPLETE" for r in spread_rows.values())
    assert {r["node_id"] for r in spread_rows.values()} == {cpu_node.node_id, gpu_node.node_id}
    gpu_rows = rows(tmp_path / "runs" / "on-gpu")
    assert len(gpu_rows) == 2 and all(r["state"] == "COMPLETE" for r in gpu_rows.values())
    assert {r["node_id"] for r in gpu_rows.values()} == {gpu_node.node_id}  # never the CPU-only node


def test_a_worker_node_dies_mid_search_and_its_trials_finish_elsewhere(tmp_path):
    """``max_retries: 0``: the node loss must not count as the trial's fault, or the
    trial on the lost node would end FAILED."""
    cluster, (survivor, doomed) = start_cluster({"num_cpus": 2}, {"num_cpus": 1})
    try:
        path = experiment(tmp_path, "node-loss", epoch_sleep=1.5)
        config = yaml.safe_load(path.read_text())
        config["search"].update(num_trials=4, max_concurrent=3)
        config["scheduler"]["max_epochs"] = 4
        config["failure"]["max_retries"] = 0
        path.write_text(yaml.safe_dump(config))
        exp_dir = tmp_path / "runs" / "node-loss"
        driver = start("run", path.name, "--address", cluster.address, cwd=tmp_path)

        def a_trial_on_the_doomed_node_has_a_checkpoint() -> bool:
            return any(r["node_id"] == doomed.node_id and r["state"] == "RUNNING" and int(r["epochs"] or 0) >= 1
                       for r in rows(exp_dir).values())

        wait_for(a_trial_on_the_doomed_node_has_a_checkpoint, what="a trial on the doomed node past epoch 1")
        lost = {n: int(r["epochs"]) for n, r in rows(exp_dir).items()
                if r["node_id"] == doomed.node_id and r["state"] == "RUNNING"}
        killed_at = time.monotonic()
        # (Its epochs stay slow: fast ones let the doomed node's trial finish while the
        # node was still going down.)
        cluster.remove_node(doomed, allow_graceful=False)
        code, output = finish(driver, timeout=400)
        assert code == 0, output
        recovered_s = time.monotonic() - killed_at
        # Said as what happened, not as Ray's RPC error on the unreachable worker.
        assert "its node was lost; retrying from its last checkpoint on another node" in output, output
        assert "(raylet)" not in output, output  # Ray's own log of the dead node stays off the console (no -v)
    finally:
        cluster.shutdown()

    table = rows(exp_dir)
    assert len(table) == 4 and all(r["state"] == "COMPLETE" for r in table.values()), table
    for number, epochs_at_loss in lost.items():
        row = table[number]
        assert row["node_losses"] == "1" and row["attempts"] == "1", row  # not counted as its own fault
        assert row["node_id"] == survivor.node_id and row["resumed"] == "True", row
        assert int(row["epochs"]) == 4
    status = run_cli("status", str(exp_dir), cwd=tmp_path, timeout=60)
    assert status.returncode == 0 and "(+1 node lost)" in status.stdout, status.stdout
    print(f"node loss: {len(lost)} trial(s) interrupted at epochs {sorted(lost.values())}, "
          f"all resumed on the surviving node; search finished {recovered_s:.0f}s after the loss")


def test_a_search_submitted_as_a_ray_job_joins_the_cluster(tmp_path):
    """``ray job submit -- hpsearch run ...`` through the job API of a cluster whose
    dashboard listens on localhost only (the documented set-up, reached over SSH)."""
    pytest.importorskip("aiohttp_cors", reason="the job API needs ray[default] (hpsearch[cluster])")
    import socket
    import subprocess
    import sys

    from ray.cluster_utils import Cluster

    def free_port() -> int:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]

    port = free_port()
    # The job agent's port too: Ray's default (52365) is taken by any other Ray on this
    # machine (another search), and the job API then has no agent ("No available agent").
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": True, "dashboard_host": "127.0.0.1", "dashboard_port": port,
        "dashboard_agent_listen_port": free_port()})
    try:
        worker = cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}/api/version"), timeout=120,
                 what="the job API (the dashboard starts after the nodes)")
        config = shrunk_example(tmp_path / "runs", **{"name": "as-a-job", "search/num_trials": 2,
                                                      "scheduler/type": "none", "scheduler/max_epochs": 1})
        job_dir = tmp_path / "job"
        job_dir.mkdir()
        write_yaml(job_dir / "exp.yaml", config)
        ray_cli = Path(sys.executable).parent / "ray"
        submit = [str(ray_cli), "job", "submit", "--address", f"http://127.0.0.1:{port}", "--",
                  sys.executable, "-m", "hpsearch.search.cli", "run", str(job_dir / "exp.yaml")]
        # No --working-dir here: with it, the job driver's working directory (the upload,
        # unpacked under /tmp/ray, which these loopback "nodes" share) vanished mid-run
        # and Tune failed in os.getcwd(). Most likely a worker node cleaning up its copy
        # of the shared path, which separate machines would not share; not seen on one.
        deadline = time.monotonic() + 120
        while True:
            result = subprocess.run(submit, capture_output=True, text=True, timeout=400)
            # The head's job agent starts after the dashboard; Ray says to try again.
            if "No available agent" not in result.stderr or time.monotonic() > deadline:
                break
            time.sleep(3)
        assert result.returncode == 0 and "succeeded" in result.stdout, result.stdout + result.stderr
    finally:
        cluster.shutdown()
    table = rows(tmp_path / "runs" / "as-a-job")
    assert len(table) == 2 and all(r["state"] == "COMPLETE" for r in table.values())
    assert {r["node_id"] for r in table.values()} == {worker.node_id}  # trials ran on the cluster's worker
