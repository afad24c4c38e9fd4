"""Config validation: every bad input is rejected, naming the field and, from a file, its line."""

from __future__ import annotations

import copy
import importlib.util
import inspect
import os
import sys
import types
import warnings
from pathlib import Path

import pytest

from conftest import example_dict, write_yaml
from hpsearch.search.components import check_components
from hpsearch.search.config_loading import apply_override, load_config, parse_overrides
from hpsearch.search.errors import ConfigError


def mutated(change) -> dict:
    config = example_dict()
    change(config)
    return config


def _set(path: str, value):
    def change(config):
        node = config
        *parents, last = path.split("/")
        for key in parents:
            node = node[key]
        node[last] = value
    return change


def _all(*changes):
    def change(config):
        for each in changes:
            each(config)
    return change


def _delete(path: str):
    def change(config):
        node = config
        *parents, last = path.split("/")
        for key in parents:
            node = node[key]
        del node[last]
    return change


BAD_SCHEMA = [
    ("unknown top-level key", _set("epochs", 3), "epochs", "unknown key (check the spelling"),
    # a key misspelled, or put where Lightning's Trainer takes it: the one meant is named (audit 45)
    ("unknown nested key", _set("search/num_trails", 3), "search.num_trails",
     "unknown key; did you mean search.num_trials?"),
    ("a section's key a part of a name", _set("trainer/patience", 3), "trainer.patience",
     "unknown key; did you mean trainer.early_stopping_patience?"),
    ("a key of another section", _set("trainer/max_epochs", 3), "trainer.max_epochs",
     "unknown key; did you mean scheduler.max_epochs?"),
    ("a Trainer argument hpsearch takes elsewhere", _set("trainer/devices", 2), "trainer.devices",
     "unknown key; did you mean resources.gpus_per_trial (or, for DDP, resources.workers_per_trial)?"),
    ("a Trainer argument misspelled", _set("trainer/max_epoch", 3), "trainer.max_epoch",
     "unknown key; did you mean scheduler.max_epochs?"),
    # where no other section's key goes, none is suggested (audit 46: search.seed for a space parameter's seed)
    ("another section's key in a space parameter", _set("space/model.lr/seed", 3), "space.model.lr.seed",
     "unknown key (check the spelling"),
    # in a class's section, a key is an argument of the class, or another section's (audit 47: none was said)
    ("an argument beside init_args", _set("model/lr", 0.1), "model.lr",
     "unknown key; did you mean model.init_args.lr (an argument of its class)?"),
    ("a loader setting beside init_args", _set("data/num_workers", 4), "data.num_workers",
     "unknown key; did you mean data.init_args.num_workers (an argument of its class) or loader.num_workers?"),
    ("a top-level key in a section", _set("search/metric", "val_acc"), "search.metric",
     "unknown key; did you mean metric?"),
    ("low > high", _set("space/model.lr", {"type": "float", "low": 0.1, "high": 0.01}), "space.model.lr", "low (0.1) must be <= high"),
    ("log with low <= 0", _set("space/model.lr", {"type": "float", "low": 0.0, "high": 0.1, "log": True}), "space.model.lr", "low > 0"),
    ("int log with low 0", _set("space/data.batch_size", {"type": "int", "low": 0, "high": 8, "log": True}), "space.data.batch_size", "low > 0"),
    ("empty choices", _set("space/model.channels", {"type": "categorical", "choices": []}), "space.model.channels.choices", "at least 1"),
    ("unknown param type", _set("space/model.lr", {"type": "uniform", "low": 0, "high": 1}), "space.model.lr", "type must be one of"),
    ("space key without section", _set("space/lr", {"type": "float", "low": 0.1, "high": 1.0}), "space.lr", "is 'model.<arg>'"),
    ("unknown trainer setting", _set("space/trainer.momentum", {"type": "float", "low": 0.1, "high": 1.0}), "space.trainer.momentum", "trainer has no searchable setting 'momentum'"),
    ("searched epochs", _set("space/trainer.max_epochs", {"type": "int", "low": 1, "high": 9}), "space.trainer.max_epochs", "the epochs are scheduler.max_epochs"),
    ("searched strategy", _set("space/trainer.strategy", {"type": "categorical", "choices": ["ddp"]}), "space.trainer.strategy", "set trainer.strategy instead"),
    ("num_trials zero", _set("search/num_trials", 0), "search.num_trials", "greater than 0"),
    ("keep_checkpoints zero", _set("search/keep_checkpoints", 0), "search.keep_checkpoints", "greater than 0"),
    ("num_trials negative", _set("search/num_trials", -3), "search.num_trials", "greater than 0"),
    ("num_trials true", _set("search/num_trials", True), "search.num_trials", "a number is needed; YAML reads yes, no, on and off as true and false (got True)"),
    ("max_epochs 3.0", _set("scheduler/max_epochs", 3.0), "scheduler.max_epochs", "valid integer"),
    # pydantic took true as seed 1 and as a retry or a range's bound (audit 21)
    ("seed true", _set("search/seed", True), "search.seed", "a number is needed; YAML reads yes, no, on and off as true and false (got True)"),
    ("max_retries true", _set("failure", {"max_retries": True}), "failure.max_retries", "a number is needed; YAML reads yes, no, on and off as true and false (got True)"),
    # every trial ended as hung in its first batch (audit 69)
    ("hang timeout below a second", _set("failure", {"hang_timeout_s": 0.001}), "failure.hang_timeout_s", "greater than or equal to 1"),
    ("int range bound true", _set("space/data.batch_size", {"type": "int", "low": True, "high": 64}),
     "space.data.batch_size.low", "a number is needed; YAML reads yes, no, on and off as true and false (got True)"),
    # pydantic's lax floats took these as numbers (gpus_per_trial: yes asked for a GPU), while
    # whole numbers refused them (audit 26)
    ("gpus yes", _set("resources/gpus_per_trial", True), "resources.gpus_per_trial", "a number is needed; YAML reads yes, no, on and off as true and false (got True)"),
    ("quoted cpus", _set("resources/cpus_per_trial", "1"), "resources.cpus_per_trial",
     "a number is needed; remove the quotes (got '1')"),
    ("quoted float bound", _set("space/model.lr", {"type": "float", "low": "0.001", "high": 0.1}),
     "space.model.lr.low", "a number is needed; remove the quotes (got '0.001')"),
    ("quoted batch limit", _set("trainer/limit_train_batches", "5"), "trainer.limit_train_batches",
     "a number is needed; remove the quotes (got '5')"),
    ("word for a budget", _set("search/time_budget_s", "1h"), "search.time_budget_s", "a number is needed (got '1h')"),
    # pydantic said "a valid dictionary or instance of ComponentConfig", naming its classes (audit 26)
    ("model as a name", _set("model", "cnn"), "model",
     "a section of settings (keys under it) is needed; the class goes under class_path: model: {class_path: cnn}"),
    ("section as a number", _set("search", 5), "search", "a section of settings (keys under it) is needed (got 5)"),
    ("section as a list", _set("trainer", [1]), "trainer", "a section of settings (keys under it) is needed, not a list"),
    ("step above the range", _set("space/model.lr", {"type": "float", "low": 1e-3, "high": 0.1, "step": 1.0}),
     "space.model.lr", "step (1.0) is larger than high - low"),
    ("int step above the range", _set("space/data.batch_size", {"type": "int", "low": 32, "high": 48, "step": 32}),
     "space.data.batch_size", "step (32) is larger than high - low"),
    ("unknown sampler", _set("search/sampler", "bayes"), "search.sampler", "'tpe'"),
    ("bad mode", _set("mode", "maximize"), "mode", "'min' or 'max'"),
    ("missing metric", _delete("metric"), "metric", "required key is missing"),
    ("grace above max_epochs", _set("scheduler/grace_period", 50), "scheduler.grace_period", "grace_period (50) must be <= max_epochs"),
    ("reduction factor 1", _set("scheduler/reduction_factor", 1), "scheduler.reduction_factor", "greater than 1"),
    # audit 36: these passed the check and failed later, after Ray had started, or hung the check
    ("seed below 0", _set("search/seed", -1), "search.seed", "greater than or equal to 0"),
    ("seed past numpy's", _set("search/seed", 2**32), "search.seed", "less than or equal to 4294967295"),
    ("infinite cpus", _set("resources/cpus_per_trial", float("inf")), "resources.cpus_per_trial", "finite number"),
    ("nan budget", _set("search/time_budget_s", float("nan")), "search.time_budget_s", "finite number"),
    ("reduction factor just above 1", _set("scheduler/reduction_factor", 1.000001), "scheduler.reduction_factor",
     "1.000001 makes Ray's ASHA build 2,995,733 rungs"),
    ("reduction factor of a million rungs", lambda c: c["scheduler"].update(reduction_factor=1.00001, max_epochs=200),
     "scheduler.reduction_factor", "makes Ray's ASHA build 529,834 rungs"),
    ("a grid of a billion points",
     lambda c: (c["search"].update(sampler="grid"),
                c["space"].update({"model.lr": {"type": "float", "low": 0.0, "high": 1.0, "step": 1e-9},
                                   "data.batch_size": {"type": "int", "low": 32, "high": 256, "step": 32}})),
     "space.model.lr", "(1,000,000,000 values of this parameter)"),
    ("a log-scale grid float", _set("search/sampler", "grid"), "space.model.lr",
     "a grid has no log scale: list the values as a categorical parameter"),
    ("a URI with a slash missing", _set("storage", "s3:/bucket/runs"), "storage",
     "'s3:/bucket/runs' looks like a s3:// URI with a slash missing; as it is, it is a local folder named 's3:'"),
    ("a file URI naming a host", _set("storage", "file://runs"), "storage",
     "'file://runs' names the host 'runs': a file URI's path follows three slashes"),
    ("an unset variable in the storage", _set("storage", "$HPSEARCH_UNSET_VARIABLE/runs"), "storage",
     "holds $HPSEARCH_UNSET_VARIABLE, which is not set in this environment"),
    ("bad precision", _set("trainer/precision", "fp8"), "trainer.precision", "'32-true'"),
    ("negative cpus", _set("resources/cpus_per_trial", -1), "resources.cpus_per_trial", "greater than 0"),
    ("empty space", _set("space", {}), "space", "space is empty"),
    ("list choices", _set("space/model.layers", {"type": "categorical", "choices": [[32], [64, 32]]}),
     "space.model.layers.choices", "choice 0 ([32]) is a list: choices must be null, true/false, numbers or strings"),
    ("a choice twice", _set("space/model.channels", {"type": "categorical", "choices": [8, 16, 8]}),
     "space.model.channels.choices", "choices must be distinct: 8 is given twice"),
    # Optuna finds a sampled value's choice by ==: 1 was reported, stored and shown as True
    ("choices equal to Optuna", _set("space/model.channels", {"type": "categorical", "choices": [True, 1]}),
     "space.model.channels.choices", "choices True and 1 are one choice to Optuna"),
    ("choices 0 and 0.0", _set("space/model.dropout", {"type": "categorical", "choices": [0, 0.0, 0.5]}),
     "space.model.dropout.choices", "choices 0 and 0.0 are one choice to Optuna"),
    ("space entry without a type", _set("space/model.dropout", {"low": 0.1, "high": 0.5}), "space.model.dropout",
     "needs a 'type'"),
    ("grid float without step", _set("search/sampler", "grid"), "space.model.lr", "grid' needs a 'step' on this float"),
    # its points, rounded to 12 decimals, were five of 0.0, below low (audit 66)
    ("grid step lost to its rounding", _all(_set("search/sampler", "grid"), _set("space", {
        "model.lr": {"type": "float", "low": 1e-13, "high": 5e-13, "step": 1e-13}})), "space.model.lr.step",
     "a grid's points are rounded to 12 decimals"),
    # 0, 2e-12, 3e-12, 5e-12: not low plus whole steps (audit 67)
    ("grid step not whole in its rounding", _all(_set("search/sampler", "grid"), _set("space", {
        "model.lr": {"type": "float", "low": 0.0, "high": 6e-12, "step": 1.5e-12}})), "space.model.lr.step",
     "which a step of more decimals does not survive"),
    ("grid low lost to its rounding", _all(_set("search/sampler", "grid"), _set("space", {
        "model.lr": {"type": "float", "low": 1e-13, "high": 5e-12, "step": 1e-12}})), "space.model.lr.low",
     "which a low of more decimals does not survive"),
    ("bad class path", _set("model/class_path", "my.module:"), "model.class_path", "package.module:ClassName"),
    ("bad name", _set("name", "my experiment/1"), "name", "study's folder"),
    ("unknown loader hand-over", _set("loader", {"sharing_strategy": "pipes"}), "loader.sharing_strategy",
     "'file_system' or 'file_descriptor'"),
]


@pytest.mark.parametrize("label, change, field, message", BAD_SCHEMA, ids=[case[0] for case in BAD_SCHEMA])
def test_bad_schema_is_rejected_naming_the_field(label, change, field, message, tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_config(write_yaml(tmp_path / "exp.yaml", mutated(change)))  # as a person writes it
    problems = caught.value.problems
    assert any(p.field == field and message in p.message for p in problems), [str(p) for p in problems]
    with pytest.raises(ConfigError) as caught:
        load_config(mutated(change))  # as the Python API gets it
    assert any(p.field == field for p in caught.value.problems), [str(p) for p in caught.value.problems]


@pytest.mark.parametrize("change, field, message", [
    (_set("search/num_trials", True), "search.num_trials", "a number is needed, not a boolean (got True)"),
    (_set("resources/cpus_per_trial", "1"), "resources.cpus_per_trial", "a number is needed, not a string (got '1')"),
    (_set("name", 1000.0), "name", "Input should be a valid string (got 1000.0)"),
])
def test_a_python_value_of_the_wrong_type_gets_no_advice_on_yaml(change, field, message):
    """A dict from the Python API has no quotes to remove, and no YAML read its booleans:
    it was told to put a name in quotes."""
    with pytest.raises(ConfigError) as caught:
        load_config(mutated(change))
    [problem] = caught.value.problems
    assert (problem.field, problem.message) == (field, message), problem
    assert "YAML" not in str(problem) and "quotes" not in str(problem), problem


BAD_COMPONENTS = [
    ("space key not a constructor argument", _set("space/model.nesterov", {"type": "float", "low": 0.1, "high": 0.9}),
     "space.model.nesterov", "takes no argument 'nesterov'"),
    ("init_args key not a constructor argument", _set("data/init_args", {"batch_size": 64, "shuffle_buffer": 3}),
     "data.init_args.shuffle_buffer", "takes no argument 'shuffle_buffer'"),
    ("unknown built-in", _set("model/class_path", "resnet"), "model.class_path", "neither a built-in"),
    ("the other section's built-in", _set("model/class_path", "digits"), "model.class_path",
     "'digits' is a built-in data class: it goes under data.class_path"),
    ("a dot for the colon", _set("model/class_path", "mypkg.models.Base"), "model.class_path",
     "did you mean 'mypkg.models:Base'?"),
    ("module that does not import", _set("data/class_path", "no_such_pkg.data:Loader"), "data.class_path", "cannot import module 'no_such_pkg.data'"),
    ("class missing from module", _set("model/class_path", "hpsearch.models.cnn:ResNet"), "model.class_path", "has no attribute 'ResNet'"),
    ("not a class", _set("model/class_path", "hpsearch.models.cnn:nn"), "model.class_path", "is not a class"),
    ("a DataModule as the model", _set("model/class_path", "hpsearch.models.digits:DigitsDataModule"),
     "model.class_path", "DigitsDataModule is not a pytorch_lightning.LightningModule"),
    ("a model as the data", _set("data/class_path", "hpsearch.models.cnn:CNNClassifier"),
     "data.class_path", "CNNClassifier is not a pytorch_lightning.LightningDataModule"),
]


@pytest.mark.parametrize("label, change, field, message", BAD_COMPONENTS, ids=[case[0] for case in BAD_COMPONENTS])
def test_bad_components_are_rejected_naming_the_field(label, change, field, message):
    config = load_config(mutated(change))
    with pytest.raises(ConfigError) as caught:
        check_components(config)
    problems = caught.value.problems
    assert any(p.field == field and message in p.message for p in problems), [str(p) for p in problems]


def test_a_datamodule_without_a_val_dataloader_is_blamed_not_the_model(monkeypatch):
    import pytorch_lightning as pl

    from hpsearch.models.digits import DigitsDataModule

    module = types.ModuleType("users_data")
    module.NoValData = type("NoValData", (DigitsDataModule,), {"val_dataloader": pl.LightningDataModule.val_dataloader,
                                                                "__module__": "users_data"})
    monkeypatch.setitem(sys.modules, "users_data", module)
    with pytest.raises(ConfigError) as caught:
        check_components(load_config(mutated(_set("data/class_path", "users_data:NoValData"))))
    [problem] = caught.value.problems
    assert problem.field == "data.class_path" and "NoValData defines no val_dataloader()" in problem.message


def test_a_model_built_on_the_lightning_package_is_told_to_use_pytorch_lightning(monkeypatch):
    # The 'lightning' package is not installed here: its class is imitated by its module name.
    module = types.ModuleType("users_models")
    lightning_base = type("LightningModule", (), {"__module__": "lightning.pytorch.core.module"})
    module.Net = type("Net", (lightning_base,), {"__module__": "users_models"})
    monkeypatch.setitem(sys.modules, "users_models", module)
    with pytest.raises(ConfigError) as caught:
        check_components(load_config(mutated(_set("model/class_path", "users_models:Net"))))
    [problem] = caught.value.problems
    assert problem.field == "model.class_path"
    assert "lightning.pytorch.core.module.LightningModule" in problem.message
    assert "import LightningModule from pytorch_lightning" in problem.message


def test_a_module_importing_the_lightning_package_is_told_to_use_pytorch_lightning(monkeypatch, tmp_path):
    """Where the 'lightning' package is not installed (as here), such a model failed with
    only "No module named 'lightning'" (audit 45)."""
    pytest.importorskip("pytorch_lightning")
    if importlib.util.find_spec("lightning") is not None:
        pytest.skip("the 'lightning' package is installed here")
    (tmp_path / "users_lightning_models.py").write_text("import lightning as L\n\nclass Net(L.LightningModule):\n"
                                                       "    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        check_components(load_config(mutated(_set("model/class_path", "users_lightning_models:Net"))))
    [problem] = caught.value.problems
    assert problem.field == "model.class_path" and "No module named 'lightning'; hpsearch runs pytorch_lightning, " \
        "not the 'lightning' package: import from pytorch_lightning" in problem.message, problem


def test_the_example_is_valid_and_its_classes_resolve(example_config):
    config = load_config(example_config)
    model_class, data_class = check_components(config)
    assert (model_class.__name__, data_class.__name__) == ("CNNClassifier", "DigitsDataModule")


def test_errors_from_a_file_carry_the_yaml_line(tmp_path):
    text = (tmp_path / "x.yaml")
    source = open(__import__("conftest").EXAMPLE).read().replace("log: true}", "log: true, lw: 1}", 1)
    text.write_text(source)
    line = next(i for i, l in enumerate(source.splitlines(), 1) if "lw: 1" in l)
    with pytest.raises(ConfigError) as caught:
        load_config(text)
    [problem] = caught.value.problems
    assert problem.field == "space.model.lr.lw" and problem.line == line and str(text) in str(problem)


def test_a_refused_value_is_said_with_it_and_a_union_gives_one_problem_saying_what_the_field_takes(tmp_path):
    # pydantic gives one error per member ('auto', int >= 0), each under the member's name
    config = example_dict()
    config["loader"] = {"num_workers": -1, "pin_memory": "maybe"}
    with pytest.raises(ConfigError) as caught:
        load_config(write_yaml(tmp_path / "x.yaml", config))
    assert [(p.field, p.message) for p in caught.value.problems] == [
        ("loader.num_workers", "Input should be 'auto' or greater than or equal to 0 (got -1)"),
        ("loader.pin_memory", "Input should be 'auto' or a valid boolean, unable to interpret input (got 'maybe')")]
    assert all(p.line for p in caught.value.problems)
    config = example_dict()
    config["trainer"] = {"precision": "fp16"}  # any value refused says what it got
    with pytest.raises(ConfigError, match=r"trainer.precision .*Input should be 'auto', '32-true', .* \(got 'fp16'\)"):
        load_config(write_yaml(tmp_path / "x.yaml", config))


def test_a_class_given_for_a_class_path_is_told_to_be_an_import_path():
    # From Python, handing the class itself is an easy slip.
    from hpsearch.models.cnn import CNNClassifier

    config = example_dict()
    config["model"]["class_path"] = CNNClassifier
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    [problem] = caught.value.problems
    assert problem.field == "model.class_path" and problem.message == (
        "an import path is needed, a string such as 'hpsearch.models.cnn:CNNClassifier', not the class "
        "CNNClassifier itself"), problem
    # one of the notebook's own: its '__main__:...' path would be refused next, so not offered
    notebook_class = type("NotebookNet", (CNNClassifier,), {"__module__": "__main__"})
    config["model"]["class_path"] = notebook_class
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    [problem] = caught.value.problems
    assert "'__main__:" not in problem.message and "name it 'my_models:NotebookNet'" in problem.message, problem


def test_a_class_of_the_running_script_is_refused_with_where_to_move_it(monkeypatch):
    """A class defined in the script (or notebook) that calls hpsearch passed the checks,
    then the search died in a raw ValueError: trial processes cannot import ``__main__``."""
    import sys

    from hpsearch.models.cnn import CNNClassifier

    class Net(CNNClassifier):
        pass

    monkeypatch.setattr(sys.modules["__main__"], "Net", Net, raising=False)
    config = example_dict()
    config["model"]["class_path"] = "__main__:Net"
    with pytest.raises(ConfigError) as caught:
        check_components(load_config(config))
    [problem] = caught.value.problems
    assert problem.field == "model.class_path" and "move Net into a module file" in problem.message, problem


def test_a_second_check_in_one_session_sees_the_edited_model_file(tmp_path, monkeypatch):
    """A notebook's second search checked (and evaluated) the classes as its first had
    imported them, while its trials ran the edited file: a new argument was refused."""
    package = tmp_path / "editpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    model_file = package / "models.py"
    model_file.write_text("from hpsearch.models.cnn import CNNClassifier\n\n\nclass Net(CNNClassifier):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("editpkg", "editpkg.models"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    config = example_dict()
    config["model"]["class_path"] = "editpkg.models:Net"
    first, _ = check_components(load_config(config))
    again, _ = check_components(load_config(config))
    assert again is first  # an unchanged module is not imported again

    model_file.write_text(model_file.read_text().replace(
        "    pass\n", "    def __init__(self, dropout: float = 0.0, **kwargs):\n        super().__init__(**kwargs)\n"))
    stat = model_file.stat()
    os.utime(model_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # a later edit, however fast
    config["space"]["model.dropout"] = {"type": "float", "low": 0.0, "high": 0.5}
    edited, _ = check_components(load_config(config))
    assert edited is not first and "dropout" in inspect.signature(edited.__init__).parameters


def test_a_second_projects_check_in_one_session_imports_its_own_module_not_the_firsts(tmp_path, monkeypatch):
    """Two projects with a mymodel.py each, searched one after the other in one Python
    session: the second's search checked, shipped to its trials and trained the first's
    class (every trial scored the first project's values; audit 81)."""
    for project in ("a", "b"):
        (tmp_path / project).mkdir()
        (tmp_path / project / "mymodel.py").write_text(
            f"from hpsearch.models.cnn import CNNClassifier\n\n\nclass Net(CNNClassifier):\n    PROJECT = '{project}'\n")
    monkeypatch.setattr(sys, "path", list(sys.path))  # the checks put each project's folder first
    monkeypatch.delitem(sys.modules, "mymodel", raising=False)
    config = example_dict()
    config["model"]["class_path"] = "mymodel:Net"
    found = []
    for project in ("a", "b", "a"):
        monkeypatch.chdir(tmp_path / project)
        model_class, _ = check_components(load_config(config))
        found.append(model_class.PROJECT)
    monkeypatch.delitem(sys.modules, "mymodel", raising=False)
    assert found == ["a", "b", "a"]


def test_exponent_notation_is_a_number_in_the_file_and_in_set(tmp_path):
    """YAML 1.1 (PyYAML) reads ``1e-4`` as a string; the model then got '1e-4' as its
    weight decay and failed in the preflight, blamed on its class."""
    source = open(__import__("conftest").EXAMPLE).read()
    path = tmp_path / "x.yaml"
    path.write_text(source.replace("init_args: {", "init_args: {weight_decay: 1e-4, ", 1))
    assert "weight_decay: 1e-4" in path.read_text()
    assert load_config(path).model.init_args["weight_decay"] == pytest.approx(1e-4)
    config = load_config(path, ["model.init_args.weight_decay=5E-3", "space.model.lr.low=2e-5",
                                "model.init_args.note=1e-4x"])
    assert config.model.init_args["weight_decay"] == pytest.approx(5e-3)
    assert config.space["model.lr"].low == pytest.approx(2e-5)
    assert config.model.init_args["note"] == "1e-4x"  # not a number: stays a string


def test_numbers_are_read_as_yaml_12_reads_them_and_written_to_read_back_the_same():
    """PyYAML (YAML 1.1) read 0755 as octal 493, 1:30 as 90 (base 60), 1_0 as 10 and 0b11 as
    3 without a word (audit 36)."""
    from hpsearch.search.yaml_io import dump_yaml, load_yaml

    read = {text: load_yaml(f"a: {text}")["a"] for text in (
        "0755", "010", "0o17", "0x1F", "1:30", "1_0", "0b11", "-3", ".5", "5.", "1E5", "-.inf", "2026-12-06")}
    assert read == {"0755": 755, "010": 10, "0o17": 15, "0x1F": 31, "1:30": "1:30", "1_0": "1_0", "0b11": "0b11",
                    "-3": -3, ".5": 0.5, "5.": 5.0, "1E5": 1e5, "-.inf": float("-inf"),
                    "2026-12-06": "2026-12-06"}  # YAML 1.2 has no timestamps: text, as the trials get it
    # a study's own experiment.yaml reads back what hpsearch wrote into it
    for value in [*read.values(), "010", "0x1F", "1e3", "0o7", "5.", "3e41508", "08", "+.5", 1e-5, float("nan")]:
        back = load_yaml(dump_yaml({"a": value}), stored=True)["a"]
        assert back == value or (value != value and back != back), (value, back)
    with pytest.raises(ConfigError, match=r"search.time_budget_s.*a number is needed \(got '1:30'\)"):
        load_config(example_dict(), ["search.time_budget_s=1:30"])
    # it said "remove the quotes" of a number that had none (audit 38)
    with pytest.raises(ConfigError, match=r"scheduler.max_epochs.*YAML reads 1_0 as text: write it without the "
                                          r"underscores \(got '1_0'\)"):
        load_config(example_dict(), ["scheduler.max_epochs=1_0"])


def test_a_studys_experiment_yaml_written_before_yaml_12_numbers_reads_back_as_written(tmp_path):
    """The writer left strings bare that YAML 1.1 reads as strings and 1.2 as numbers
    (``08``, ``0o17``, ``+.5``): read with 1.2's rules, a study of choices ["08", "09"] was
    refused on resume as if experiment.yaml had been edited (audit 38)."""
    source = open(__import__("conftest").EXAMPLE).read().replace(
        "model.channels: {type: categorical, choices: [8, 16, 32]}",
        "model.channels: {type: categorical, choices: [08, 0o17, +.5]}")
    assert "[08, 0o17, +.5]" in source
    path = tmp_path / "experiment.yaml"
    path.write_text(source)
    assert load_config(path, stored=True).space["model.channels"].choices == ["08", "0o17", "+.5"]
    assert load_config(path).space["model.channels"].choices == [8, 15, 0.5]  # a person's file: YAML 1.2


def test_constructor_errors_from_a_file_carry_the_line(tmp_path):
    data = mutated(_set("space/model.nesterov", {"type": "float", "low": 0.1, "high": 0.9}))
    path = write_yaml(tmp_path / "x.yaml", data)
    line = next(i for i, l in enumerate(path.read_text().splitlines(), 1) if "model.nesterov" in l)
    with pytest.raises(ConfigError) as caught:
        check_components(load_config(path))
    assert caught.value.problems[0].line == line


def test_malformed_yaml_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nmodel: {class_path: cnn\nmetric: val_acc\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "malformed YAML" in str(caught.value) and caught.value.problems[0].line is not None


def test_aliases_that_multiply_are_refused_and_an_anchor_used_twice_is_read(tmp_path):
    """Nine levels of nine aliases took 13 GB and never ended: every check walked every use
    of an anchor (audit 69)."""
    source = open(__import__("conftest").EXAMPLE).read()
    laughs = tmp_path / "laughs.yaml"
    levels = ["x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"] + \
        [f"x{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]" for n in range(1, 9)]
    laughs.write_text(source + "\n".join(levels) + "\n")
    with pytest.raises(ConfigError, match=r"anchors and aliases \(&name, \*name\) expand to more than 100,000"):
        load_config(laughs)
    bomb = "[" + ", ".join(["&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"] + [
        f"&a{n} [{', '.join([f'*a{n - 1}'] * 9)}]" for n in range(1, 6)]) + "]"  # 9 ** 6 values
    plain = tmp_path / "plain.yaml"
    plain.write_text(source)
    with pytest.raises(ConfigError, match=r"model.init_args.extra \(--set\): its value's anchors and aliases .* "
                                          r"more than 100,000 values"):
        load_config(plain, [f"model.init_args.extra={bomb}"])  # (audit 70)
    shared = tmp_path / "shared.yaml"
    shared.write_text(source.replace("trainer:", "trainer: &trainer", 1) + "\nx: *trainer\n")
    with pytest.raises(ConfigError) as caught:
        load_config(shared)
    assert [problem.field for problem in caught.value.problems] == ["x"]  # an unknown key, as any other


def test_files_that_are_not_utf8_or_nest_too_deeply_or_come_from_a_pipe_are_read_or_refused_cleanly(tmp_path):
    """Each gave a traceback and exit 1, or called the pipe missing (audit 36)."""
    source = open(__import__("conftest").EXAMPLE).read()
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(source.encode() + "# mod\u00e8le\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 0xe8 at offset \d+\); save it as UTF-8") as caught:
        load_config(latin)
    assert caught.value.problems[0].line == source.count("\n") + 1
    utf16 = tmp_path / "utf16.yaml"
    utf16.write_text(source, encoding="utf-16")
    with pytest.raises(ConfigError, match=r"it is UTF-16 \(as Windows PowerShell's '>' writes\)"):
        load_config(utf16)
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 10000 + "]" * 10000 + "\n")
    with pytest.raises(ConfigError, match="nests too deeply"):
        load_config(deep)
    plain = tmp_path / "plain.yaml"
    plain.write_text(source)
    with pytest.raises(ConfigError, match=r"a\.b \(--set\): its value nests too deeply"):  # (audit 73)
        load_config(plain, ["a.b=" + "[" * 10000 + "]" * 10000])
    read, write = os.pipe()
    os.write(write, source.encode())
    os.close(write)
    try:
        assert load_config(f"/dev/fd/{read}").name == "digits-cnn"  # bash's <(cat exp.yaml)
    finally:
        os.close(read)


def test_python_values_are_taken_as_experiment_yaml_gives_them_back_or_refused_naming_the_argument(tmp_path):
    """numpy numbers were refused as "not a valid integer" or, in init_args, broke writing
    experiment.yaml after Ray had started; a lambda did the same (audit 36)."""
    np = pytest.importorskip("numpy")
    config = load_config(example_dict(), {"model.init_args.channels": np.int64(8), "search.num_trials": np.int64(2),
                                          "model.init_args.sizes": (np.float32(0.5), 2)},
                         options={"storage": tmp_path / "runs"})
    assert config.model.init_args == {"channels": 8, "sizes": [0.5, 2]} and config.search.num_trials == 2
    assert type(config.model.init_args["channels"]) is int and config.storage == str(tmp_path / "runs")
    assert load_config({**example_dict(), "storage": tmp_path}).storage == str(tmp_path)  # a Path in the dict too
    # a value under a key that is not a string was not looked at (audit 38)
    with pytest.raises(ConfigError, match=r"model.init_args.extra.*a object cannot be kept"):
        load_config(example_dict(), {"model.init_args.extra": {1: object()}})
    with pytest.raises(ConfigError) as caught:
        load_config(example_dict(), {"data.init_args.transform": {"resize": lambda image: image}})
    assert [(p.field, p.message) for p in caught.value.problems] == [(
        "data.init_args.transform", "a function cannot be kept in experiment.yaml, which resume reads back: give "
        "plain values (null, true/false, numbers, strings, lists and mappings of them) and build objects in the "
        "class's constructor")]


def test_a_reduction_factor_near_1_that_ray_builds_at_once_is_taken():
    """1.005 with 200 epochs builds 1,062 rungs in a millisecond; a limit of 1,000 refused it,
    and with it an older study's resume (audit 38)."""
    config = load_config(mutated(lambda c: c["scheduler"].update(reduction_factor=1.005, max_epochs=200)))
    assert config.scheduler.reduction_factor == 1.005


def test_a_storage_path_expands_environment_variables_as_it_does_home(monkeypatch, tmp_path):
    """``storage: $HOME/runs`` made a folder named '$HOME' in the current directory (audit 36)."""
    from hpsearch.search.storage import local_path

    monkeypatch.setenv("HPSEARCH_TEST_BASE", str(tmp_path))
    config = load_config(mutated(_set("storage", "$HPSEARCH_TEST_BASE/runs")))
    assert local_path(config.storage) == tmp_path.resolve() / "runs"
    assert local_path("file:///srv/runs") == Path("/srv/runs").resolve()
    # file://$VAR/runs: the variable's path follows the slashes once expanded (audit 38)
    config = load_config(mutated(_set("storage", "file://$HPSEARCH_TEST_BASE/runs")))
    assert local_path(config.storage) == tmp_path.resolve() / "runs"


def test_a_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="is a directory; give the experiment's YAML file"):
        load_config(tmp_path)


def test_a_key_given_twice_is_an_error_naming_both_lines(tmp_path):
    """YAML keeps the last of two equal keys: a second ``mode:`` flipped the search unseen."""
    source = open(__import__("conftest").EXAMPLE).read()
    first = next(i for i, l in enumerate(source.splitlines(), 1) if l.startswith("mode:"))
    path = tmp_path / "x.yaml"
    path.write_text(source + "mode: min\n")
    last = len(path.read_text().splitlines())
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    [problem] = caught.value.problems
    assert problem.field == "mode" and problem.line == last
    assert f"given twice, on lines {first} and {last}" in problem.message


def test_all_problems_are_reported_at_once():
    config = mutated(lambda c: (c["search"].update(num_trials=0), c.update(mode="up")))
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert {p.field for p in caught.value.problems} == {"search.num_trials", "mode"}


def test_overrides_reach_nested_and_dotted_keys(example_config):
    config = load_config(example_config, ["search.num_trials=4", "space.model.lr.high=0.5", "trainer.precision=bf16-mixed"])
    assert config.search.num_trials == 4
    assert config.space["model.lr"].high == 0.5
    assert config.trainer.precision == "bf16-mixed"


def test_override_errors_name_the_key_and_say_it_came_from_set(example_config):
    with pytest.raises(ConfigError) as caught:
        load_config(example_config, ["search.num_trials=-1"])
    [problem] = caught.value.problems
    assert problem.field == "search.num_trials" and problem.source == "--set"


def test_a_bad_name_or_storage_option_is_blamed_on_that_option_not_on_set(example_config):
    with pytest.raises(ConfigError) as caught:
        load_config(example_config, [], {"name": "../x"})
    [problem] = caught.value.problems
    assert problem.field == "name" and problem.source == "--name" and problem.line is None
    with pytest.raises(ConfigError) as caught:
        load_config(example_config, ["name=../x"])
    assert caught.value.problems[0].source == "--set"
    # The option wins over the file and over --set, as on the command line.
    config = load_config(example_config, ["name=from-set"], {"name": "from-option"})
    assert config.name == "from-option"
    assert config.problem("name", "taken").source == "--name"


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["search.num_trials"])


def test_apply_override_reaches_space_keys_which_hold_a_dot():
    tree = {"space": {"model.lr": {"low": 1}}}
    apply_override(tree, "space.model.lr.low", 2)
    apply_override(tree, "search.seed", 5)
    apply_override(tree, "space.model.channels", {"type": "categorical", "choices": [8, 16]})  # a new one
    assert tree == {"space": {"model.lr": {"low": 2}, "model.channels": {"type": "categorical", "choices": [8, 16]}},
                    "search": {"seed": 5}}


def test_a_mapping_override_merges_into_its_section_but_replaces_a_parameter(tmp_path):
    path = write_yaml(tmp_path / "x.yaml", {**example_dict(), "search": {"num_trials": 2, "sampler": "random", "seed": 7}})
    config = load_config(path, {"search": {"num_trials": 3}, "model.init_args": {"dropout": 0.2}})
    assert (config.search.num_trials, config.search.sampler, config.search.seed) == (3, "random", 7)
    assert config.model.init_args == {**example_dict()["model"]["init_args"], "dropout": 0.2}
    # A parameter's keys depend on its type: a new definition replaces the old whole.
    replaced = load_config(path, ["space.model.lr={type: categorical, choices: [0.01, 0.1]}"])
    assert replaced.space["model.lr"].choices == [0.01, 0.1]
    # An error inside what a mapping override set is blamed on it, not on the file's line,
    # and by the API's name for it (a mapping is never a command line's --set).
    with pytest.raises(ConfigError) as caught:
        load_config(path, {"search": {"num_trials": 0}})
    assert [(p.field, p.source) for p in caught.value.problems] == [("search.num_trials", "overrides")]
    with pytest.raises(ConfigError) as caught:
        load_config(path, ["search.num_trials=0"])
    assert [(p.field, p.source) for p in caught.value.problems] == [("search.num_trials", "--set")]



def test_null_removes_a_search_space_parameter(tmp_path):
    """One file for a model without one of the searched arguments: ``--set space.X=null``
    was refused ("Input should be a valid dictionary") and the file had to be copied (audit 23)."""
    path = write_yaml(tmp_path / "x.yaml", example_dict())
    searched = set(load_config(path).space)
    assert "model.lr" in searched
    assert set(load_config(path, ["space.model.lr=null"]).space) == searched - {"model.lr"}
    assert set(load_config(path, {"space": {"model.lr": None}}).space) == searched - {"model.lr"}
    with pytest.raises(ConfigError, match="the space has no parameter 'model.lrr' to remove"):
        load_config(path, ["space.model.lrr=null"])

def test_trainer_params_are_validated_when_applied(example_config):
    config = load_config(example_config)
    assert config.with_trainer_params({"trainer.gradient_clip_val": 0.5}).gradient_clip_val == 0.5
    with pytest.raises(Exception):
        config.with_trainer_params({"trainer.accumulate_grad_batches": 0})


@pytest.mark.parametrize("param, said", [
    ({"type": "int", "low": 0, "high": 4}, "0 can be sampled"),
    ({"type": "int", "low": 1, "high": 9, "step": 4}, None),  # its grid ends at 9
    ({"type": "categorical", "choices": [1, 2, -3]}, "-3 can be sampled"),
])
def test_a_searched_trainer_setting_is_checked_at_every_value_it_can_take(example_config, param, said):
    example_config["space"]["trainer.accumulate_grad_batches"] = param
    if said is None:
        assert load_config(example_config).space["trainer.accumulate_grad_batches"].edge_values() == [1, 9]
        return
    with pytest.raises(ConfigError) as caught:
        load_config(example_config)
    [problem] = caught.value.problems
    assert problem.field == "space.trainer.accumulate_grad_batches" and said in problem.message


def test_limit_batches_take_a_fraction_up_to_one_or_a_whole_count(example_config):
    """Lightning refuses a float above 1.0 in every trial; an int counts batches; None,
    Lightning's default, is all of them (it was refused as "not a valid number": audit 66)."""
    for value in (0.25, 1.0, 3):
        example_config["trainer"]["limit_train_batches"] = value
        limit = load_config(example_config).trainer.limit_train_batches
        assert limit == value and type(limit) is type(value)
    assert load_config(example_config, ["trainer.limit_train_batches=null"]).trainer.limit_train_batches == 1.0
    example_config["trainer"]["limit_train_batches"] = 1.5
    with pytest.raises(ConfigError, match="must be at most 1.0") as caught:
        load_config(example_config)
    assert caught.value.problems[0].field == "trainer.limit_train_batches"
    assert caught.value.problems[0].message.count("(got 1.5)") == 1  # said twice (audit 21)
    # Zero or less is said once, not once per member of the union ("greater than 0 or greater than 0").
    for value in (0, -0.5):
        example_config["trainer"]["limit_train_batches"] = value
        with pytest.raises(ConfigError) as caught:
            load_config(example_config)
        [problem] = caught.value.problems
        assert problem.field == "trainer.limit_train_batches" and problem.message.count("above 0") == 1, problem
        assert " or greater than 0" not in problem.message
    # A float range that crosses 1.0 is caught at its top.
    example_config["trainer"]["limit_train_batches"] = 1.0
    example_config["space"]["trainer.limit_val_batches"] = {"type": "float", "low": 0.5, "high": 2.0}
    with pytest.raises(ConfigError, match="2.0 can be sampled") as caught:
        load_config(example_config)
    assert caught.value.problems[0].field == "space.trainer.limit_val_batches"


def test_a_range_s_edge_values_are_what_a_sampler_can_reach():
    from hpsearch.search.config import FloatParam, IntParam

    assert FloatParam(type="float", low=0.1, high=1.0, step=0.2).edge_values() == [0.1, 0.9]
    assert FloatParam(type="float", low=1e-4, high=1e-1, log=True).edge_values() == [1e-4, 1e-1]
    assert IntParam(type="int", low=2, high=2).edge_values() == [2]
    assert IntParam(type="int", low=32, high=250, step=16).edge_values() == [32, 240]


def test_loading_does_not_mutate_the_callers_dict(example_config):
    before = copy.deepcopy(example_config)
    load_config(example_config, ["search.num_trials=2"])
    assert example_config == before


def test_a_set_that_breaks_a_field_of_the_file_is_blamed_on_the_set(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text(open(__import__("conftest").EXAMPLE).read())
    with pytest.raises(ConfigError) as caught:
        load_config(path, ["space.model.lr.high=-1"])
    [problem] = caught.value.problems
    assert problem.field == "space.model.lr" and "(--set)" in str(problem) and str(path) not in str(problem)
    with pytest.raises(ConfigError) as caught:
        load_config(path, ["space.model.dropout.type=float"])  # a new parameter, given only its type
    assert {(p.field, p.source, p.message) for p in caught.value.problems} == {
        ("space.model.dropout.low", "--set", "required key is missing"),
        ("space.model.dropout.high", "--set", "required key is missing")}, caught.value


def test_the_api_s_arguments_of_the_wrong_kind_are_named(example_config):
    # From Python: a single "key=value" string is one override, not one per character,
    # and a wrong kind of argument says which, instead of failing deep inside.
    config = load_config(example_config, "search.num_trials=3")
    assert config.search.num_trials == 3
    with pytest.raises(TypeError, match="the experiment must be a YAML file's path or a mapping, not int"):
        load_config(42)
    with pytest.raises(TypeError, match="overrides must be a mapping or a list of 'key=value' strings, not NoneType"):
        load_config(example_config, None)


def test_resume_says_which_settings_it_changes(example_config, tmp_path):
    """Settings outside the study's history may change on resume, but not silently: a
    paused trial continues with them (another precision, say)."""
    from hpsearch.search.api import say_what_resume_changes

    stored = load_config(example_config)
    changed = load_config(example_config, ["search.sampler=random", "trainer.precision=bf16-mixed",
                                           "search.num_trials=40", "search.time_budget_s=60", f"storage={tmp_path}"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        say_what_resume_changes(stored, changed, tmp_path / "study")
        say_what_resume_changes(stored, load_config(example_config, ["search.num_trials=40"]), tmp_path / "study")
        say_what_resume_changes(stored, load_config(example_config, ["search.seed=5"]), tmp_path / "study")
        say_what_resume_changes(stored, load_config(example_config, ["search.keep_checkpoints=5"]), tmp_path / "s")
        on_a_grid = ["search.sampler=grid", "space={model.lr: {type: categorical, choices: [0.001, 0.01]}}",
                     "space.data.batch_size={type: categorical, choices: [32, 64]}"]
        grid = load_config(example_config, on_a_grid)
        say_what_resume_changes(grid, load_config(example_config, [*on_a_grid, "search.seed=5"]), tmp_path)
    messages = [str(w.message) for w in caught]
    # a paused trial trains on with a changed trainer setting, but keeps its sampled values (audit 24)
    assert messages == [
        "resume changes trainer.precision ('auto' -> 'bf16-mixed'): trials from now on use it, paused trials "
        "included",
        "resume changes search.sampler ('tpe' -> 'random'): the trials sampled from now on are sampled so "
        "(paused trials keep their values)",
        f"storage is ignored on resume: the study stays in {tmp_path / 'study'}",
        "resume changes search.seed (0 -> 5): the trials sampled from now on are sampled so (paused trials keep "
        "their values); trials started from now on also train with seeds drawn from the new seed (each started "
        "trial keeps its own: trials.csv's seed column)",  # it said nothing of training (audit 28)
        # it said "trials from now on use it", and removed the checkpoints of those already ended (audit 40)
        "resume changes search.keep_checkpoints (None -> 5): as the session starts, the trials already ended keep "
        "their best.ckpt only if among the best 5 (or the study's best); the others' are removed",
        # a grid's order is not sampled anew (audit 66: it said "the trials sampled from now on are sampled so")
        "resume changes search.seed (0 -> 5): only the seeds trials started from now on train with (each started "
        "trial keeps its own: trials.csv's seed column); the grid keeps the order of the seed it began with"], messages


def test_a_name_yaml_reads_as_a_number_is_told_to_be_quoted(example_config):
    with pytest.raises(ConfigError) as caught:
        load_config(example_config, ["name=1e3"])
    [problem] = caught.value.problems
    assert problem.field == "name" and "YAML read 1000.0 as a float: put it in quotes" in problem.message, problem


def test_a_module_in_the_search_folder_imported_in_place_of_pythons_own_is_named(example_config, tmp_path,
                                                                                  monkeypatch):
    """A queue.py beside the experiment, which the user's model imported in place of
    Python's queue: the check said "cannot import name 'Queue' from 'queue'" (audit 81)."""
    for stack in ("hpsearch.models.cnn", "hpsearch.models.digits"):  # imported first, with Python's own modules
        importlib.import_module(stack)

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "tabnanny", raising=False)  # Python's own, which the model below imports
    (tmp_path / "tabnanny.py").write_text("")
    (tmp_path / "shadowed_model.py").write_text("from tabnanny import check\nfrom hpsearch.models.cnn import "
                                                "CNNClassifier as Net\n")
    monkeypatch.delitem(sys.modules, "shadowed_model", raising=False)
    example_config["model"]["class_path"] = "shadowed_model:Net"
    try:
        with pytest.raises(ConfigError) as caught:
            check_components(load_config(example_config))
    finally:
        sys.modules.pop("tabnanny", None)
        sys.modules.pop("shadowed_model", None)
    first = caught.value.problems[0].message
    assert first == "tabnanny.py in the current folder is imported in place of Python's own module tabnanny: rename it"
    # one that works is the user's affair: a wave.py of a project's own was refused (audit 84)
    (tmp_path / "tabnanny.py").write_text("def check(path):\n    return path\n")
    try:
        model_class, _ = check_components(load_config(example_config))
    finally:
        sys.modules.pop("tabnanny", None)
        sys.modules.pop("shadowed_model", None)
    assert model_class.__name__ == "CNNClassifier"


def test_a_module_in_the_search_folder_named_as_one_a_trial_imports_is_refused(example_config, tmp_path, monkeypatch):
    """Ray's workers import the search's folder first: a launcher script named hpsearch.py
    failed every trial ('hpsearch' is not a package) while check passed (audit 32)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hpsearch.py").write_text("print('my launcher')\n")
    (tmp_path / "numpy").mkdir()
    (tmp_path / "numpy" / "__init__.py").write_text("")
    (tmp_path / "torch").mkdir()  # a folder of files (no package): imported after the real one
    # libraries the stack imports that hpsearch does not name (Ray Tune's pandas, Ray's
    # pydantic): every trial failed in words that named no file (audit 81)
    (tmp_path / "pandas.py").write_text("X = 1\n")
    (tmp_path / "pydantic.py").write_text("raise ImportError('mine')\n")
    for own in ("utils", "data", "models", "config"):  # the user's own, which no library of the stack is
        (tmp_path / f"{own}.py").write_text("")
    with pytest.raises(ConfigError) as caught:
        check_components(load_config(example_config))
    messages = sorted(problem.message for problem in caught.value.problems)
    assert len(messages) == 4, messages
    assert messages[2] == ("pandas.py in the current folder would be imported by every trial in place of pandas "
                           "(Ray's workers import the search's folder first): rename it"), messages
    assert messages[3].startswith("pydantic.py in the current folder would be imported"), messages
    (tmp_path / "pandas.py").unlink()
    (tmp_path / "pydantic.py").unlink()
    importlib.invalidate_caches()  # the folder's listing, which may be cached from within the same second
    assert messages[0].startswith("hpsearch.py in the current folder would be imported by every trial in place of "
                                  "hpsearch (Ray's workers import the search's folder first): rename it"), messages
    assert messages[1].startswith("numpy/ in the current folder would be imported by every trial in place of numpy")
    (tmp_path / "hpsearch.py").unlink()
    (tmp_path / "numpy" / "__init__.py").unlink()
    (tmp_path / "hpsearch").mkdir()  # hpsearch's own checkout has one: the package itself
    (tmp_path / "hpsearch" / "__init__.py").write_text("")
    check_components(load_config(example_config))


def test_init_args_too_deep_for_experiment_yaml_are_refused_naming_the_argument(example_config):
    """Nested 300 deep, a value passed the check and broke the writing of experiment.yaml
    (pydantic's serialization depth) after Ray had started (audit 38); 100 still passes."""
    from hpsearch.search.yaml_io import dump_yaml, load_yaml

    def nested(depth):
        value = []
        for _ in range(depth - 1):
            value = [value]
        return value

    example_config["model"]["init_args"]["extra"] = nested(300)
    with pytest.raises(ConfigError) as caught:
        load_config(example_config)
    [problem] = caught.value.problems
    assert problem.field == "model.init_args.extra" and "nests 300 levels deep" in problem.message, problem
    example_config["model"]["init_args"]["extra"] = nested(100)
    kept = load_config(example_config).model_dump(mode="json")
    assert load_yaml(dump_yaml(kept), stored=True)["model"]["init_args"]["extra"] == nested(100)


@pytest.mark.parametrize("metric, mode, warned", [
    ("val_loss", "max", "mode: max searches for the highest val_loss, which is usually minimized; set mode: min"),
    ("val/acc", "min", "mode: min searches for the lowest val/acc, which is usually maximized; set mode: max"),
    ("val_loss", "min", None), ("val_acc", "max", None), ("val_score", "min", None),
    ("val_neg_loss", "max", None), ("val_1-acc", "min", None),  # turned around (audit 46)
    ("val_loss/dataloader_idx_1", "max", "mode: max searches for the highest val_loss/dataloader_idx_1, which is "
                                         "usually minimized; set mode: min"),  # not turned (audit 47)
    ("val/acc@1", "min", "mode: min searches for the lowest val/acc@1, which is usually maximized; set mode: max"),
    # regression's and generation's names (audit 74)
    ("val_r2", "min", "mode: min searches for the lowest val_r2, which is usually maximized; set mode: max"),
    ("val_psnr", "min", "mode: min searches for the lowest val_psnr, which is usually maximized; set mode: max"),
    ("val_mape", "max", "mode: max searches for the highest val_mape, which is usually minimized; set mode: min"),
    ("val_r2", "max", None), ("val_smape", "min", None),
    # a loss or an error word says it, wherever it stands (audits 76 and 79)
    ("val_top1_err", "max",
     "mode: max searches for the highest val_top1_err, which is usually minimized; set mode: min"),
    ("val_r2_loss", "max", "mode: max searches for the highest val_r2_loss, which is usually minimized; set mode: min"),
    ("val/decode.loss_dice", "min", None), ("val_err_top1", "min", None), ("val_loss_iou", "min", None),
])
def test_a_mode_against_the_metrics_name_is_warned_of_before_the_study_starts(example_config, metric, mode, warned):
    """``mode: max`` with ``val_loss`` kept the worst trials, and a study's mode cannot
    change on resume (audit 45)."""
    import warnings

    from hpsearch.search.api import _run_config

    example_config.update(metric=metric, mode=mode)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run_config(example_config, {}, None, None)
    said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert said == ([f"{warned} unless that is meant"] if warned else []), said


def test_a_validated_config_given_back_is_taken(example_config):
    """What ``check`` returns, given back to ``check`` or ``run`` (with overrides too), was
    refused: "the experiment must be a YAML file's path or a mapping" (audit 51)."""
    config = load_config(example_config)
    assert load_config(config) == config
    assert load_config(config, {"search.num_trials": 3}).search.num_trials == 3


@pytest.mark.parametrize("overrides, field, message", [
    # 'nan' is text to YAML: "remove the quotes" was said of a value with none
    (["search.num_trials=nan"], "search.num_trials", "a finite number is needed (got 'nan')"),
    (["search..num_trials=4"], "--set",
     "'search..num_trials' has an empty part: two dots in a row, or a dot at an end"),
    ({"search.": 4}, "--set", "'search.' has an empty part: two dots in a row, or a dot at an end"),
    (["space.model.lr={Type: float, low: 0.1, high: 0.2}"], "space.model.lr",
     "needs a 'type' (lowercase; it has 'Type'): 'float', 'int' or 'categorical'"),
])
def test_mistakes_in_overrides_are_told_as_they_are(overrides, field, message):
    """Each was named by another field, or told a fix that did not apply (audit 69)."""
    with pytest.raises(ConfigError) as caught:
        load_config(example_dict(), overrides)
    [problem] = caught.value.problems
    assert (problem.field, problem.message) == (field, message)


def test_a_tab_that_yaml_refuses_is_told_to_be_spaces(tmp_path):
    path = tmp_path / "tabs.yaml"
    path.write_text("name: x\nmodel:\n\tclass_path: cnn\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    [problem] = caught.value.problems
    assert problem.line == 3 and problem.message.endswith(": indent with spaces, YAML refuses tabs there"), problem
