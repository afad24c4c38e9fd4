"""Searches on a real multi-node Ray cluster on loopback: a head and worker nodes as
separate Ray processes (``ray.cluster_utils.Cluster``), joined with ``--address``."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, commands_matching, free_port, pids_whose_command, run_cli, shrunk_example, stop_ray_at, write_yaml
from test_fault_tolerance import experiment, finish, start, wait_for

pytestmark = pytest.mark.e2e

# Node deaths are noticed within seconds rather than Ray's default half minute.
FAST_HEALTH_CHECKS = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000,
                      "health_check_failure_threshold": 3}


@pytest.fixture(autouse=True)
def one_cluster_at_a_time(tmp_path_factory):
    """Two Ray clusters on one machine fight over Ray's fixed ports (its agents', its
    metrics'): with the suite in two processes (pytest-xdist), the other one waits here
    until this test's cluster is gone. (The job API's dashboard never came up beside
    another test's cluster.)"""
    from filelock import FileLock

    with FileLock(tmp_path_factory.getbasetemp().parent / "one-ray-cluster.lock"):
        yield


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


def node_loss_experiment(root: Path, name: str, epoch_sleep: float, num_trials: int, max_concurrent: int,
                         max_epochs: int, **sections) -> Path:
    """``experiment``'s search, slowed and sized for a node to be lost under it, with
    ``max_retries: 0``: the loss must not count as the trial's fault, or the trial on the
    lost node would end FAILED."""
    path = experiment(root, name, epoch_sleep=epoch_sleep)
    config = yaml.safe_load(path.read_text())
    config["search"].update(num_trials=num_trials, max_concurrent=max_concurrent)
    config["scheduler"]["max_epochs"] = max_epochs
    config["failure"]["max_retries"] = 0
    config.update(sections)
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
def test_trials_spread_over_nodes_gpu_trials_keep_to_the_gpu_node_and_a_lost_nodes_trials_finish_elsewhere(
        tmp_path, monkeypatch):
    """Three searches on one cluster (each cluster's start is costly here): one node of 2 CPUs,
    one of 1 CPU that advertises a (fake) GPU.
    - Three trials at once need both nodes: the CPU node holds two, the GPU node one.
    - Trials that ask for a GPU run on the GPU node only.
    - The 1-CPU node dies under a search with ``max_retries: 0``: the node loss must not
      count as the trial's fault, or the trial on the lost node would end FAILED.
    The nodes run in a folder that holds a stray, broken ``userpkg``: trials import the one
    the search shipped, never a node's own."""
    stray = tmp_path / "nodes-folder" / "userpkg"
    stray.mkdir(parents=True)
    (stray / "__init__.py").write_text("raise ImportError('a stray userpkg in the nodes folder shadowed the shipped one')\n")
    monkeypatch.chdir(stray.parent)  # where the nodes' processes start, and so their workers
    cluster, (cpu_node, gpu_node) = start_cluster({"num_cpus": 2}, {"num_cpus": 1, "num_gpus": 1})
    try:
        spread = shrunk_example(tmp_path / "runs", **{"name": "spread", "search/num_trials": 6,
                                                      "search/max_concurrent": 3, "scheduler/type": "none",
                                                      "scheduler/max_epochs": 2})
        gpu = shrunk_example(tmp_path / "runs", **{"name": "on-gpu", "search/num_trials": 2,
                                                   "search/max_concurrent": 2, "scheduler/type": "none",
                                                   "scheduler/max_epochs": 1, "resources/gpus_per_trial": 1})
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

        survivor, doomed = cpu_node, gpu_node
        path = node_loss_experiment(tmp_path, "node-loss", epoch_sleep=1.5, num_trials=4, max_concurrent=3,
                                    max_epochs=4)
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



@pytest.mark.slow
def test_a_search_whose_clusters_gcs_dies_says_so_records_it_and_exits_75(tmp_path, monkeypatch):
    """The GCS of a joined cluster dies mid-search (it crashed, or the head node was lost
    under a driver on another node). Ray's core worker ends a driver whose GCS stays
    silent for its reconnect timeout (60 s by default) with status 1 and a line of its
    own: the session stayed "running", and nothing said how to go on (audit 22). hpsearch's
    watch acts at three quarters of that timeout (here 12 s, so 9 s)."""
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("RAY_gcs_rpc_server_reconnect_timeout_s", "12")  # read by the driver's Ray and its watch
    path = node_loss_experiment(tmp_path, "cluster-lost", epoch_sleep=1.5, num_trials=4, max_concurrent=2,
                                max_epochs=4)
    exp_dir = tmp_path / "runs" / "cluster-lost"
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    try:
        driver = start("run", path.name, "--address", cluster.address, cwd=tmp_path)
        wait_for(lambda: any(int(r["epochs"] or 0) >= 1 for r in rows(exp_dir).values()), what="a trial past epoch 1")
        port = int(cluster.address.rpartition(":")[2])
        # its GCS listens on a port of its choosing: found by its session, which the raylet names
        [session] = {re.search(r"--session-name=(\S+)", command).group(1) for command in commands_matching(
            lambda command: f"--gcs-address={cluster.address}" in command and "--session-name=" in command).values()}
        [gcs] = pids_whose_command(lambda command: "gcs_server" in command and f"--session-name={session} " in command)
        killed_at = time.time()
        os.kill(gcs, signal.SIGKILL)
        code, output = finish(driver, timeout=120)
    finally:
        stop_ray_at(port)  # the rest of the cluster (its raylet would end at its own GCS timeout)
    assert code == 75, output  # hpsearch's own exit, not Ray's (1)
    assert "the search's Ray has not answered for" in output and "head process or node is gone" in output, output
    assert f"hpsearch resume {exp_dir} --address ADDRESS" in output, output
    [session] = json.loads((exp_dir / "sessions.json").read_text())
    assert session["outcome"] == "ray_lost" and session["ended_at"] is not None, session
    # ended when its Ray fell silent, not 9 s later when the watch gave up on it (audit 32)
    assert session["ended_at"] < killed_at + 4, (session, killed_at)
    assert any(r["state"] == "RUNNING" for r in rows(exp_dir).values())  # as the kill left them
    status = run_cli("status", str(exp_dir), cwd=tmp_path, timeout=60)
    assert status.returncode == 0 and "No search is running: its Ray stopped answering at" in status.stdout, \
        status.stdout
    print(f"GCS lost: {output.strip().splitlines()[-1]}\nstatus: {status.stdout.strip().splitlines()[-1]}")

def kill_ranks_on(node) -> int:
    """SIGKILLs the Ray Train ranks that run on ``node`` (its raylet's child processes);
    how many there were."""
    import signal

    from ray import ray_constants

    raylet = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    killed = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            title = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if parent == raylet and b"RayTrainWorker" in title:
            os.kill(int(stat.parent.name), signal.SIGKILL)
            killed += 1
    return killed


@pytest.mark.slow
def test_a_distributed_trials_pre_empted_node_is_a_node_loss_and_the_trial_resumes_elsewhere(tmp_path):
    """A node that Ray is told will be reclaimed (a spot instance's notice: the autoscaler
    drains it), then removed, under a two-rank trial whose ranks it shares with another
    node. Ray Train restarted such a trial's ranks within the trial, as often as it
    happened, and the study never knew: no node loss counted, nothing said. And when the
    rank on the other node failed first, on its broken gloo connection, the driver
    counted that as the trial's own fault. The driver's node-loss retry must own both."""
    import subprocess
    import sys

    # One CPU a node: the two ranks must go one to each.
    cluster, nodes = start_cluster({"num_cpus": 1}, {"num_cpus": 1})
    try:
        path = node_loss_experiment(tmp_path, "pre-empted", epoch_sleep=1.0, num_trials=1, max_concurrent=1,
                                    max_epochs=8, resources={"workers_per_trial": 2, "cpus_per_worker": 1})
        exp_dir = tmp_path / "runs" / "pre-empted"
        driver = start("run", path.name, "--address", cluster.address, cwd=tmp_path)
        wait_for(lambda: any(r["state"] == "RUNNING" and int(r["epochs"] or 0) >= 1 for r in rows(exp_dir).values()),
                 what="the trial past its first epoch")
        # the node of rank 1: rank 0, on the other, lives on to fail on its link to rank 1
        doomed = next(node for node in nodes if node.node_id != rows(exp_dir)[0]["node_id"])
        survivor = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        notice_s = 2
        drain = subprocess.run([str(Path(sys.executable).parent / "ray"), "drain-node", "--address", cluster.address,
                                "--node-id", doomed.node_id, "--reason", "DRAIN_NODE_REASON_PREEMPTION",
                                "--reason-message", "spot instance reclaimed",
                                "--deadline-remaining-seconds", str(notice_s)], capture_output=True, text=True)
        assert drain.returncode == 0, drain.stderr
        time.sleep(notice_s)
        # The reclaimed machine shuts down: its processes die (rank 1 first, so rank 0's
        # broken link fails the trial before Ray hears of rank 1), then the node goes.
        assert kill_ranks_on(doomed) == 1
        cluster.remove_node(doomed, allow_graceful=False)
        code, output = finish(driver, timeout=400)
        assert code == 0, output
        assert "its node was lost; retrying from its last checkpoint on another node" in output, output
    finally:
        cluster.shutdown()
    row = rows(exp_dir)[0]
    assert row["state"] == "COMPLETE" and int(row["epochs"]) == 8, row
    assert row["node_losses"] == "1" and row["attempts"] == "1" and row["resumed"] == "True", row
    # the retry's ranks, one a node again, on the node that stayed and the one that joined
    assert set(row["rank_nodes"].split(",")) == {node.node_id for node in (*nodes, survivor)} - {doomed.node_id}, row


@pytest.mark.slow
def test_a_search_submitted_as_a_ray_job_joins_the_cluster(tmp_path):
    """The README's laptop-to-cluster command, ``ray job submit --working-dir . --
    hpsearch run ...``, through the job API of a cluster whose dashboard listens on
    localhost only (the documented set-up, reached over SSH). The model is the user's
    own, in a package that only the job's upload holds: the driver, on the head, imports it
    from the unpacked upload, and the trials import it on the other node."""
    pytest.importorskip("aiohttp_cors", reason="the job API needs ray[default] (hpsearch[cluster])")
    import subprocess
    import sys
    import tempfile

    from ray.cluster_utils import Cluster

    job_dir = tmp_path / "job"
    (job_dir / "jobpkg").mkdir(parents=True)
    (job_dir / "jobpkg" / "__init__.py").write_text("")
    (job_dir / "jobpkg" / "model.py").write_text(
        "from hpsearch.models.cnn import CNNClassifier\n\n\n"
        "class JobCNN(CNNClassifier):\n    \"\"\"The built-in CNN, under a name only the job's upload holds.\"\"\"\n")
    config = shrunk_example(tmp_path / "runs", **{"name": "as-a-job", "search/num_trials": 2,
                                                  "scheduler/type": "none", "scheduler/max_epochs": 1,
                                                  "model/class_path": "jobpkg.model:JobCNN"})
    write_yaml(job_dir / "exp.yaml", config)
    port = free_port()
    # The job agent's port too: Ray's default (52365) is taken by any other Ray on this
    # machine (another search), and the job API then has no agent ("No available agent").
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": True, "dashboard_host": "127.0.0.1", "dashboard_port": port,
        "dashboard_agent_listen_port": free_port()})
    # The worker node keeps its files apart, as another machine does. Sharing the head's
    # (Ray's default on one machine), it unpacked and later removed the job's upload in the
    # very folder the job's driver ran in, which failed in os.getcwd(). A short path: Ray's
    # socket paths under it must fit in 107 characters.
    worker_files = tempfile.mkdtemp(prefix="hps-node-")
    try:
        worker = cluster.add_node(num_cpus=2, temp_dir=worker_files)
        cluster.wait_for_nodes()
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}/api/version"), timeout=120,
                 what="the job API (the dashboard starts after the nodes)")
        ray_cli = Path(sys.executable).parent / "ray"
        submit = [str(ray_cli), "job", "submit", "--address", f"http://127.0.0.1:{port}",
                  "--working-dir", str(job_dir), "--",
                  sys.executable, "-m", "hpsearch.search.cli", "run", "exp.yaml"]
        deadline = time.monotonic() + 120
        while True:
            result = subprocess.run(submit, capture_output=True, text=True, timeout=400, cwd=tmp_path)
            # The head's job agent starts after the dashboard; Ray says to try again.
            if "No available agent" not in result.stderr or time.monotonic() > deadline:
                break
            time.sleep(3)
        assert result.returncode == 0 and "succeeded" in result.stdout, result.stdout + result.stderr
    finally:
        cluster.shutdown()
        shutil.rmtree(worker_files, ignore_errors=True)
    table = rows(tmp_path / "runs" / "as-a-job")
    assert len(table) == 2 and all(r["state"] == "COMPLETE" for r in table.values()), table
    assert {r["node_id"] for r in table.values()} == {worker.node_id}  # trials ran on the cluster's worker


def fake_cloud_launcher_config(gcs_port: int, workers: int) -> dict:
    """What ``ray up`` leaves on the head as ``~/ray_bootstrap_config.yaml``, with Ray's
    fake node provider for the cloud: its "instances" are raylets that the head's
    autoscaler starts on this machine. One node type of 1 CPU, at most ``workers`` nodes."""
    empty_lists = ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands",
                   "head_start_ray_commands", "worker_start_ray_commands", "cluster_synced_files",
                   "rsync_exclude", "rsync_filter")
    return {"cluster_name": "loopback", "max_workers": workers, "upscaling_speed": 1.0, "idle_timeout_minutes": 5,
            "provider": {"type": "fake_multinode", "gcs_address": f"127.0.0.1:{gcs_port}",
                         "use_node_id_as_ip": True, "disable_node_updaters": True,
                         "disable_launch_config_check": True},
            # the type name the fake provider gives its head node
            "head_node_type": "ray.head.default",
            "available_node_types": {
                "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
                "cpu_worker": {"resources": {"CPU": 1}, "node_config": {}, "min_workers": 0, "max_workers": workers}},
            "auth": {}, "docker": {}, "file_mounts": {}, "file_mounts_sync_continuously": False,
            **{key: [] for key in empty_lists}}


@pytest.mark.slow
def test_cluster_yamls_head_adds_nodes_for_a_search_that_joins_it_with_its_token(tmp_path):
    """cluster.yaml's own head command on loopback: its launcher config where ``ray up``
    puts it, the token where its file_mounts put it, and the cloud played by Ray's fake
    node provider. The head has no CPUs, so every trial waits for nodes the autoscaler
    adds, and the search is sized for the cluster at full scale. A process that joins
    without token mode is refused in words, not with a traceback."""
    import subprocess
    import sys

    from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

    laptop, home, bin_dir, port = tmp_path / "laptop", tmp_path / "home", Path(sys.executable).parent, free_port()
    launcher = yaml.safe_load((REPO / "cluster.yaml").read_text())
    env = {key: value for key, value in os.environ.items() if not key.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    # On the laptop, before `ray up`, as cluster.yaml says; then `ray up` copies its file_mounts.
    subprocess.run(["ray", "get-auth-token", "--generate"], env={**env, "HOME": str(laptop)}, check=True,
                   capture_output=True, timeout=60)
    for remote, local in launcher["file_mounts"].items():
        target = home / remote.removeprefix("~/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(laptop / local.removeprefix("~/"), target)
    home.mkdir(exist_ok=True)
    (home / "ray_bootstrap_config.yaml").write_text(json.dumps(fake_cloud_launcher_config(port, workers=2)))
    env["HOME"] = str(home)  # from here on, processes on the head
    head_command = launcher["head_start_ray_commands"][-1]
    assert "--port=6379" in head_command
    # What the launcher adds or this loopback needs: the head node type's 0 CPUs, free ports.
    head_command = (head_command.replace("--port=6379", f"--port={port}") +
                    f" --num-cpus=0 --node-ip-address=127.0.0.1 --dashboard-port={free_port()}"
                    f" --dashboard-agent-listen-port={free_port()} --disable-usage-stats")
    head_env = {**env, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}
    try:
        subprocess.run(["bash", "-c", head_command], env=head_env, check=True, capture_output=True, timeout=120)
        config = shrunk_example(tmp_path / "runs", **{"name": "autoscaled", "search/num_trials": 4,
                                                      "scheduler/type": "none", "scheduler/max_epochs": 2})
        path = write_yaml(tmp_path / "exp.yaml", config)
        address = f"127.0.0.1:{port}"

        # Refused before the preflight, by one call to the GCS (Ray's own join retried for
        # 20 s, printing a line of its log each time, and `check` passed: audit 24).
        for command in ("check", "run"):
            refused = run_cli(command, str(path), "--address", address, cwd=tmp_path, env=env, timeout=300)
            assert refused.returncode == 1, refused.stdout + refused.stderr
            assert f"the Ray cluster at {address} requires token authentication" in refused.stderr, refused.stderr
            assert "RAY_AUTH_MODE=token" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
            assert "Failed to get cluster ID" not in refused.stderr and not (tmp_path / "runs").exists()

        # cluster.yaml's setup_commands put RAY_AUTH_MODE=token in every shell on the nodes.
        result = run_cli("run", str(path), "--address", address, cwd=tmp_path, env={**env, "RAY_AUTH_MODE": "token"},
                         timeout=400)
        assert result.returncode == 0, result.stdout + result.stderr
    finally:
        stop_ray_at(port)
    output = result.stdout + result.stderr
    assert "holds 0 trials of this size now and 2 once its autoscaler has added nodes" in output, output
    table = rows(tmp_path / "runs" / "autoscaled")
    assert len(table) == 4 and all(r["state"] == "COMPLETE" for r in table.values()), table
    launched = {FAKE_HEAD_NODE_ID[:-5] + f"{number:05d}" for number in (1, 2)}  # the provider's ids, in order
    assert {r["node_id"] for r in table.values()} <= launched, table
    print(f"autoscaled: {len({r['node_id'] for r in table.values()})} node(s) added ran the 4 trials; "
          f"refused without token mode: {refused.stderr.strip().splitlines()[-1]}")
