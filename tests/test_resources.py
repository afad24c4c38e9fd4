"""Resource feasibility and distributed settings, checked before anything starts."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings

import pytest

from conftest import shrunk_example, write_yaml
from hpsearch.search.config_loading import load_config
from hpsearch.search.devices import precision_fallback_warning
from hpsearch.search.distributed import check_strategy_available, driver_resources, strategy_name
from hpsearch.search.errors import ConfigError, ResourceError
from hpsearch.search.resources import concurrent_trials_capacity

TWO_CPUS = [{"Alive": True, "Resources": {"CPU": 2.0, "memory": 1e9}}]
CLUSTER = [
    {"Alive": True, "Resources": {"CPU": 8.0}},
    {"Alive": True, "Resources": {"CPU": 16.0, "GPU": 4.0}},
    {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}},  # a dead node counts for nothing
]


def resources(example_config, **values):
    example_config["resources"] = values
    return load_config(example_config).resources


def test_two_one_cpu_trials_fit_two_cpus(example_config):
    assert concurrent_trials_capacity(resources(example_config, cpus_per_trial=1), TWO_CPUS) == 2


def test_a_trial_larger_than_any_node_is_refused_with_the_numbers(example_config):
    with pytest.raises(ResourceError, match=r"needs 4 CPU\(s\) on one node, but the largest node has 2 CPUs"):
        concurrent_trials_capacity(resources(example_config, cpus_per_trial=4), TWO_CPUS)


def test_a_gpu_trial_on_a_cpu_only_cluster_is_refused(example_config):
    with pytest.raises(ResourceError, match=r"1 GPU\(s\) on one node, but the largest node has 2 CPUs and 0 GPUs"):
        concurrent_trials_capacity(resources(example_config, gpus_per_trial=1), TWO_CPUS)
    # one of each, said so (audit 34: "the largest node has 1 CPUs")
    with pytest.raises(ResourceError, match=r"the largest node has 1 CPU and 1 GPU \(1 node\(s\)\)"):
        concurrent_trials_capacity(resources(example_config, cpus_per_trial=2),
                                   [{"Resources": {"CPU": 1.0, "GPU": 1.0}, "Alive": True}])


def test_more_workers_than_the_cluster_holds_is_refused(example_config):
    config = resources(example_config, workers_per_trial=3, cpus_per_worker=1)
    with pytest.raises(ResourceError, match=r"needs 3 workers of 1 CPU\(s\) = 3 CPUs, but the cluster can hold only 2"):
        concurrent_trials_capacity(config, TWO_CPUS)


def test_workers_of_one_trial_may_span_nodes_and_gpus_are_counted(example_config):
    config = resources(example_config, workers_per_trial=4, cpus_per_worker=4, gpus_per_worker=1)
    assert concurrent_trials_capacity(config, CLUSTER) == 1
    fractional = resources(example_config, cpus_per_trial=2, gpus_per_trial=0.5)
    assert concurrent_trials_capacity(fractional, CLUSTER) == 8


def test_a_one_process_trials_per_worker_request_is_the_trials_own(example_config):
    # Ray reserved cpus_per_trial while the fit check, torch's threads and the loader used
    # cpus_per_worker: 0.5 CPU trials held 1 each (one at a time on 2 CPUs) and used half;
    # gpus_per_worker: 1 trained on a GPU Ray had not reserved.
    half = resources(example_config, cpus_per_worker=0.5)
    assert (half.cpus_per_trial, half.worker_cpus) == (0.5, 0.5)
    assert concurrent_trials_capacity(half, TWO_CPUS) == 4
    gpu = resources(example_config, gpus_per_worker=1)
    assert (gpu.gpus_per_trial, gpu.worker_gpus) == (1, 1)
    with pytest.raises(ConfigError, match=r"resources\.cpus_per_worker.*one process is its one worker"):
        resources(example_config, cpus_per_trial=1, cpus_per_worker=4)
    # a distributed trial's ranks keep their own request
    ranks = resources(example_config, workers_per_trial=2, cpus_per_worker=0.5)
    assert (ranks.cpus_per_trial, ranks.worker_cpus) == (1, 0.5)


def test_distributed_trials_hold_no_cpu_for_their_driver():
    assert driver_resources()["cpu"] == 0 and driver_resources()["memory"] > 0


@pytest.mark.parametrize("settings, field, message", [
    ({"trainer": {"strategy": "ddp"}}, "trainer.strategy", "needs resources.workers_per_trial > 1"),
    ({"trainer": {"strategy": "fsdp"}, "resources": {"workers_per_trial": 2}}, "trainer.strategy", "shards over GPUs"),
    ({"trainer": {"deepspeed_stage": 3}, "resources": {"workers_per_trial": 2}}, "trainer.deepspeed_stage",
     "is DeepSpeed's ZeRO stage, and trainer.strategy is 'auto'"),
    # Lightning refuses DeepSpeed on CPU too: every trial failed on it, each after a retry
    ({"trainer": {"strategy": "deepspeed"}, "resources": {"workers_per_trial": 2}}, "trainer.strategy",
     "'deepspeed' shards over GPUs"),
    # one process: Lightning's single-device training, which would drop the strategy unsaid
    ({"trainer": {"strategy": "fsdp"}, "resources": {"gpus_per_trial": 1}}, "trainer.strategy",
     "'fsdp' shards the model over a trial's ranks: it needs resources.workers_per_trial > 1"),
    ({"trainer": {"strategy": "deepspeed"}, "resources": {"gpus_per_trial": 1}}, "trainer.strategy",
     "'deepspeed' shards the model over a trial's ranks: it needs resources.workers_per_trial > 1"),
    ({"resources": {"gpus_per_worker": 1.5, "workers_per_trial": 2}}, "resources.gpus_per_worker", "must be whole"),
    ({"resources": {"gpus_per_worker": 0.5, "workers_per_trial": 2}}, "resources.gpus_per_worker", "cannot share a GPU"),
    ({"resources": {"gpus_per_trial": 0.25, "workers_per_trial": 4}}, "resources.gpus_per_trial", "cannot share a GPU"),
])
def test_inconsistent_distributed_settings_are_config_errors_naming_the_field(example_config, settings, field,
                                                                               message):
    for section, values in settings.items():
        example_config[section] = {**example_config.get(section, {}), **values}
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(example_config)
    assert [problem.field for problem in caught.value.problems] == [field]


def test_strategy_cannot_be_searched(example_config):
    example_config["space"]["trainer.strategy"] = {"type": "categorical", "choices": ["ddp", "fsdp"]}
    with pytest.raises(ConfigError, match="changes speed, not results"):
        load_config(example_config)


def test_strategy_names(example_config):
    assert strategy_name(load_config(example_config)) == "single"
    example_config["resources"] = {"workers_per_trial": 2}
    assert strategy_name(load_config(example_config)) == "ddp"


def test_deepspeed_without_the_package_says_how_to_install_it(example_config, monkeypatch):
    import importlib.util

    example_config["trainer"]["strategy"] = "deepspeed"
    example_config["resources"] = {"workers_per_trial": 2, "gpus_per_worker": 1}
    config = load_config(example_config)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'hpsearch\[deepspeed\]'"):
        check_strategy_available(config)


def test_fp16_on_cpu_trials_warns_once_in_the_driver(example_config):
    example_config["trainer"]["precision"] = "16-mixed"
    config = load_config(example_config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        precision_fallback_warning(config.trainer, config.resources)
    assert len(caught) == 1 and "'bf16-mixed' instead" in str(caught[0].message)
    assert caught[0].filename == __file__  # the user's call, not hpsearch's own line
    example_config["resources"] = {"gpus_per_trial": 1}
    gpu = load_config(example_config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        precision_fallback_warning(gpu.trainer, gpu.resources)
    assert caught == []
    # a searched 16-mixed: CPU trials that sample it train as bf16-mixed ones do
    example_config["resources"] = {}
    example_config["trainer"]["precision"] = "32-true"
    example_config["space"]["trainer.precision"] = {"type": "categorical", "choices": ["bf16-mixed", "16-mixed"]}
    searched = load_config(example_config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        precision_fallback_warning(searched.trainer, searched.resources, searched.space)
    assert [str(w.message) for w in caught] == ["space.trainer.precision: '16-mixed' needs a GPU and these trials run "
                                                "on CPU: a trial that samples it uses 'bf16-mixed', so the two "
                                                "choices train alike"]


NO_RAY_START = ("import sys, ray\n"
                "def refused(*args, **kwargs):\n"
                "    raise SystemExit('ray.init was called')\n"
                "ray.init = refused\n"
                "from hpsearch.search.cli import main\n"
                "sys.exit(main(sys.argv[1:]))\n")


@pytest.mark.e2e
@pytest.mark.parametrize("setting, field", [
    ({"resources/cpus_per_trial": 64}, "resources.cpus_per_trial"),
    ({"resources/workers_per_trial": 3, "resources/cpus_per_worker": 1}, "resources.workers_per_trial"),
])
def test_the_cli_refuses_a_trial_too_large_for_this_machine_before_ray_starts(tmp_path, setting, field):
    # A mistake in the file like any other (exit 2, the field and its line), found before
    # Ray's start: ray.init is made to fail here, and is never reached.
    path = write_yaml(tmp_path / "exp.yaml", shrunk_example(tmp_path / "runs", **setting))
    (tmp_path / "no_ray.py").write_text(NO_RAY_START)
    result = subprocess.run([sys.executable, "no_ray.py", "run", str(path)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=180)
    assert result.returncode == 2, result.stderr
    assert re.search(rf"- {re.escape(field)} \(\S*exp.yaml, line \d+\): ", result.stderr), result.stderr
    assert "(on this machine, where the search starts its own Ray unless given --address)" in result.stderr
    assert "ray.init was called" not in result.stderr
    assert not (tmp_path / "runs").exists()


def test_a_reservation_that_cannot_be_freed_warns_and_the_search_goes_on(monkeypatch):
    # Asking Ray about the placement group fails (a lost connection, say): that must be a
    # warning naming the group and the trial, not an error that ends the search.
    import importlib

    from hpsearch.search.outcome import PLACEMENT_GROUP
    from hpsearch.search.tune_callbacks import FreeRankReservations

    def unreachable(group):
        raise ConnectionError("the GCS is unreachable")

    # the module, which ``ray.util.placement_group`` (a function of the same name) hides
    monkeypatch.setattr(importlib.import_module("ray.util.placement_group"), "placement_group_table", unreachable)

    class Trial:
        trial_id = "t1"

    reservations = FreeRankReservations()
    reservations.on_trial_result(0, [], Trial(), {PLACEMENT_GROUP: "ab" * 18})
    assert reservations.groups == {"t1": "ab" * 18}
    with pytest.warns(UserWarning, match=f"placement group {'ab' * 18} of trial t1: the GCS is unreachable"):
        reservations.on_trial_complete(0, [], Trial())
    assert reservations.groups == {}  # freed once, not again at the next hook


def test_warnings_from_deep_inside_a_search_name_the_users_line(example_config):
    """The Python API's warnings point at the user's call into hpsearch, however deep
    inside it they are raised (here: check, then its preflight, then the device rules)."""
    import hpsearch

    example_config["trainer"]["precision"] = "16-mixed"
    example_config["search"]["preflight"] = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hpsearch.check(example_config); line = sys._getframe().f_lineno  # noqa: E702
    fallback = [w for w in caught if "'bf16-mixed' instead" in str(w.message)]
    assert [(w.filename, w.lineno) for w in fallback] == [(__file__, line)], [(w.filename, w.lineno) for w in caught]


HEAD_ONLY = [{"Alive": True, "Resources": {"CPU": 0.0, "node:__internal_head__": 1.0, "memory": 1e9}}]


def launcher_config(tmp_path, gpu_worker_resources):
    """cluster.yaml as `ray up` leaves it on the head (~/ray_bootstrap_config.yaml): Ray's
    defaults filled in, and the worker type's resources, which on AWS the launcher fills in
    from the instance type (here given, as no AWS is reachable)."""
    import json

    import yaml
    from ray.autoscaler._private.util import prepare_config

    from conftest import REPO

    config = prepare_config(yaml.safe_load((REPO / "cluster.yaml").read_text()))
    config["available_node_types"]["gpu_worker"]["resources"] = gpu_worker_resources
    path = tmp_path / "ray_bootstrap_config.yaml"
    path.write_text(json.dumps(config))
    return path


def test_the_nodes_an_autoscaler_may_add_are_read_from_the_launchers_config(tmp_path):
    from hpsearch.search.autoscaling import addable_nodes

    nodes = addable_nodes(launcher_config(tmp_path, {"CPU": 48, "GPU": 4}))
    assert len(nodes) == 8 and nodes[0]["Resources"] == {"CPU": 48.0, "GPU": 4.0}  # gpu_worker's max_workers
    # A node type the launcher could not size is left out; no launcher config, no nodes.
    assert addable_nodes(launcher_config(tmp_path, {})) == []
    assert addable_nodes(tmp_path / "absent.yaml") == []


def test_max_concurrent_lowered_names_where_the_trials_run(example_config):
    """A search's own Ray on this machine was called "the cluster" (audit 34)."""
    from hpsearch.search.tuner import plan_concurrency

    example_config["search"]["max_concurrent"] = 4
    config = load_config(example_config)
    for place in ("this machine", "the cluster"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert plan_concurrency(config, TWO_CPUS, place=place) == 2
        assert [str(w.message) for w in caught] == [
            f"search.max_concurrent=4 but {place} holds 2 trials of this size at once; running 2 at a time"]


def test_a_search_on_cluster_yamls_head_is_sized_for_the_gpu_nodes_its_autoscaler_adds(tmp_path, example_config):
    """Right after `ray up`, the head (0 CPUs, it runs no trials) is the only node: the
    search used to be refused there, though the autoscaler adds GPU nodes on demand."""
    from hpsearch.search.autoscaling import addable_nodes
    from hpsearch.search.tuner import plan_concurrency

    example_config["resources"] = {"cpus_per_trial": 4, "gpus_per_trial": 1}
    example_config["search"]["max_concurrent"] = 40
    config = load_config(example_config)
    with pytest.raises(ResourceError, match="largest node has 0 CPUs"):
        plan_concurrency(config, HEAD_ONLY)  # no autoscaler: as before
    addable = addable_nodes(launcher_config(tmp_path, {"CPU": 48, "GPU": 4}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert plan_concurrency(config, HEAD_ONLY, addable) == 32  # 8 nodes x 4 GPUs
    assert any("holds 0 trials of this size now and 32 once its autoscaler has added nodes" in str(w.message)
               for w in caught), [str(w.message) for w in caught]
    example_config["resources"] = {"cpus_per_trial": 4, "gpus_per_trial": 8}  # no node type has 8 GPUs
    with pytest.raises(ResourceError, match="nor do the 8 nodes the cluster's autoscaler may add hold one"):
        plan_concurrency(load_config(example_config), HEAD_ONLY, addable)


def test_on_an_autoscaling_cluster_distributed_trials_wait_longer_for_their_nodes(tmp_path, monkeypatch):
    from hpsearch.search import autoscaling
    from hpsearch.search.tuner import ray_settings

    monkeypatch.delenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", raising=False)
    assert "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S" not in ray_settings()
    monkeypatch.setattr(autoscaling, "BOOTSTRAP_CONFIG", launcher_config(tmp_path, {"CPU": 48, "GPU": 4}))
    assert ray_settings()["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] == "900"


def test_a_distributed_gpu_trials_evaluation_runs_on_one_ranks_gpu(example_config, monkeypatch):
    """With the GPUs given per worker alone (``gpus_per_trial`` 0, as the example file has
    it), the best trial's test evaluation ran in the driver, on its CPU."""
    import ray

    from hpsearch.search import results

    example_config["resources"].update(workers_per_trial=2, gpus_per_worker=1, cpus_per_worker=3)
    config = load_config(example_config)
    asked = {}

    def remote(**resources):
        asked.update(resources)
        return lambda function: type("Task", (), {"remote": staticmethod(lambda *args: "done")})

    monkeypatch.setattr(ray, "remote", remote)
    monkeypatch.setattr(ray, "get", lambda ref: {"test_acc": 1.0} if ref == "done" else None)
    monkeypatch.setattr("hpsearch.search.evaluation.evaluate_checkpoint",
                        lambda *args: pytest.fail("evaluated in the driver"))
    assert results.evaluate_on_cluster(config, {}, "best.ckpt") == {"test_acc": 1.0}
    assert asked == {"num_cpus": 3, "num_gpus": 1}


def test_a_resume_that_only_evaluates_starts_the_ray_a_per_worker_gpu_evaluation_runs_on(example_config, tmp_path,
                                                                                          monkeypatch):
    """A complete study whose evaluation failed resumes to run it alone, starting Ray only
    where the evaluation needs a GPU. It judged that by ``gpus_per_trial``: a distributed
    trial's GPUs given per worker alone started none, and the evaluation's Ray task started
    a default Ray of its own, one that ``--address`` did not name (audit 64)."""
    from contextlib import nullcontext

    from hpsearch.search import api, results, tuner
    from hpsearch.search.experiment import ExperimentDir

    example_config["resources"].update(workers_per_trial=2, gpus_per_worker=1, cpus_per_worker=1)
    (tmp_path / "trials.csv").write_text("trial,state\n")
    started = []
    monkeypatch.setattr(tuner, "ray_for_search", lambda config, address, verbose: started.append(address) or
                        nullcontext())
    monkeypatch.setattr(results, "finalize", lambda config, exp, mirror: None)
    api._evaluate_again(load_config(example_config), ExperimentDir(tmp_path), "10.0.0.1:6379", False, None)
    assert started == ["10.0.0.1:6379"]
