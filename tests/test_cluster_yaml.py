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
    # Ray's token authentication stays on: nothing in the file turns it off.
    assert "RAY_AUTH_MODE" not in (REPO / "cluster.yaml").read_text()


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
