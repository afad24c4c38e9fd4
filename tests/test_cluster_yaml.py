"""cluster.yaml is a valid Ray cluster-launcher config (Ray's own schema) and keeps its promises."""

from __future__ import annotations

import yaml

from conftest import REPO


def load():
    return yaml.safe_load((REPO / "cluster.yaml").read_text())


def test_cluster_yaml_passes_rays_schema():
    from ray.autoscaler._private.util import prepare_config, validate_config

    # `ray up` fills in the provider's defaults, then validates: the same two steps.
    validate_config(prepare_config(load()))


def test_only_ssh_is_open_and_the_dashboard_binds_to_localhost():
    config = load()
    permissions = config["provider"]["security_group"]["IpPermissions"]
    assert [(p["FromPort"], p["ToPort"]) for p in permissions] == [(22, 22)]
    head = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head


def test_every_node_starts_ray_with_token_authentication_and_the_same_token():
    """``ray start`` (Ray 2.60) turns token authentication on by itself only where a token
    already exists: a fresh head started with none, open to anyone on the network. The
    file copies the user's token to each node and starts Ray in token mode; every shell
    there is in token mode too, since Ray turns it on by itself only for ``--address auto``.
    (test_cluster.py starts the head command itself and joins it.)"""
    config = load()
    for command in (config["head_start_ray_commands"][-1], config["worker_start_ray_commands"][-1]):
        assert command.startswith("RAY_AUTH_MODE=token ray start "), command
    assert config["file_mounts"] == {"~/.ray/auth_token": "~/.ray/auth_token"}
    assert any("export RAY_AUTH_MODE=token' >> ~/.bashrc" in c for c in config["setup_commands"])


def test_gpu_workers_install_a_cuda_torch_and_the_head_runs_no_trials():
    config = load()
    assert any("download.pytorch.org/whl/cu" in c for c in config["setup_commands"])
    assert any("hpsearch[cluster]" in c for c in config["setup_commands"])  # + the job API
    assert config["available_node_types"]["head"]["resources"] == {"CPU": 0}


def test_the_workers_that_write_to_s3_storage_have_an_instance_profile():
    """Ray's launcher gives its default instance profile to the head only; without one of
    their own, trials on the workers could not upload their checkpoints to an S3 bucket."""
    from ray.autoscaler._private.util import prepare_config

    worker = prepare_config(load())["available_node_types"]["gpu_worker"]["node_config"]
    assert worker["IamInstanceProfile"]["Arn"].startswith("arn:aws:iam::")
