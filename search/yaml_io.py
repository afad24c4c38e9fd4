"""YAML as experiments are read and written: numbers as YAML 1.2 (and Python, and JSON)
read them, and written so that they read back the same. Kept apart from the config
loader so that the commands that only read a study (``status``) need no more than PyYAML."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml


class ExperimentLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``1e-4`` as the float it is in YAML 1.2 (and in
    Python, JSON and every config a user has written). PyYAML follows YAML 1.1, which
    wants a dot (``1.0e-4``) and otherwise keeps a string: ``weight_decay: 1e-4`` in
    ``init_args`` reached the model as ``'1e-4'`` and failed in the preflight, blamed on
    the class rather than the value."""


class ExperimentDumper(yaml.SafeDumper):
    """PyYAML's safe dumper, writing what ``ExperimentLoader`` reads back the same: a
    string it would read as a float (``"1e3"``, a commit hash such as ``"3e41508"``) is
    quoted. Under YAML 1.1's rules it was written bare, read back as a float, and the
    study's resume refused as if experiment.yaml had been edited."""


for _yaml_class in (ExperimentLoader, ExperimentDumper):
    _yaml_class.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )


def dump_yaml(data: Mapping[str, Any]) -> str:
    """``data`` as YAML that ``load_yaml`` (and the config loader) read back to the same values, in its order."""
    return yaml.dump(dict(data), Dumper=ExperimentDumper, sort_keys=False, allow_unicode=True)


def load_yaml(text: str) -> Any:
    """What ``text`` holds, read as experiments are (``ExperimentLoader``)."""
    return yaml.load(text, Loader=ExperimentLoader)
