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


INT, FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
# YAML 1.2's core schema. YAML 1.1's, PyYAML's, also read 0755 as octal 493, 1:30 as 90
# (base 60), 1_0 as 10 and 0b11 as 3, without a word (audit 36).
YAML12_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
YAML12_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                          r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")


def _yaml12_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    if text.startswith(("0o", "0x")):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text)  # decimal, leading zeros and all: 010 is 10


for _yaml_class in (ExperimentLoader, ExperimentDumper):
    _yaml_class.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in (INT, FLOAT)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    _yaml_class.add_implicit_resolver(INT, YAML12_INT, list("-+0123456789"))
    _yaml_class.add_implicit_resolver(FLOAT, YAML12_FLOAT, list("-+0123456789."))
ExperimentLoader.add_constructor(INT, _yaml12_int)


def dump_yaml(data: Mapping[str, Any]) -> str:
    """``data`` as YAML that ``load_yaml`` (and the config loader) read back to the same values, in its order."""
    return yaml.dump(dict(data), Dumper=ExperimentDumper, sort_keys=False, allow_unicode=True)


def load_yaml(text: str) -> Any:
    """What ``text`` holds, read as experiments are (``ExperimentLoader``)."""
    return yaml.load(text, Loader=ExperimentLoader)
