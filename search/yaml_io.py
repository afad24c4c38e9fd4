"""YAML as experiments are read and written. Kept apart from the config loader so that
the commands that only read a study (``status``) need no more than PyYAML.

Two sets of rules:

- an experiment file a person writes, and ``--set``, are read with YAML 1.2's numbers
  (as Python and JSON read them): ``1e-4`` is a float, ``0755`` is 755, ``1:30`` a string;
- a study's own experiment.yaml, which hpsearch writes and reads back, keeps the rules
  every study has been written with: PyYAML's YAML 1.1 with ``1e-4`` read as a float. A
  study written before the file's rules changed left ``08`` unquoted (a string to YAML
  1.1), which 1.2 reads as 8, and its resume was refused as if the file had been edited
  (audit 38). Each pair of loader and dumper reads back what it wrote.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

INT, FLOAT, TIMESTAMP = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp"


class StoredLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``1e-4`` as the float it is in YAML 1.2 (and in
    Python, JSON and every config a user has written). PyYAML follows YAML 1.1, which
    wants a dot (``1.0e-4``) and otherwise keeps a string: ``weight_decay: 1e-4`` in
    ``init_args`` reached the model as ``'1e-4'`` and failed in the preflight, blamed on
    the class rather than the value."""


class StoredDumper(yaml.SafeDumper):
    """PyYAML's safe dumper, writing what ``StoredLoader`` reads back the same: a string it
    would read as a float (``"1e3"``, a commit hash such as ``"3e41508"``) is quoted.
    Under YAML 1.1's rules it was written bare, read back as a float, and the study's
    resume refused as if experiment.yaml had been edited."""


for _yaml_class in (StoredLoader, StoredDumper):
    _yaml_class.add_implicit_resolver(
        FLOAT, re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


class ExperimentLoader(yaml.SafeLoader):
    """Numbers as YAML 1.2's core schema reads them. YAML 1.1's rules, PyYAML's, also read
    0755 as octal 493, 1:30 as 90 (base 60), 1_0 as 10 and 0b11 as 3, without a word
    (audit 36)."""


YAML12_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
YAML12_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                          r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")


def _yaml12_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    if text.startswith(("0o", "0x")):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text)  # decimal, leading zeros and all: 010 is 10


# YAML 1.2's core schema has no timestamps either: 2026-12-06 is text, as the trials get it
# (they get the experiment as JSON); the preflight got a date (audit 38).
ExperimentLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (INT, FLOAT, TIMESTAMP)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
ExperimentLoader.add_implicit_resolver(INT, YAML12_INT, list("-+0123456789"))
ExperimentLoader.add_implicit_resolver(FLOAT, YAML12_FLOAT, list("-+0123456789."))
ExperimentLoader.add_constructor(INT, _yaml12_int)


def dump_yaml(data: Mapping[str, Any]) -> str:
    """``data`` as a study's experiment.yaml, which ``load_yaml(..., stored=True)`` reads back
    to the same values, in its order."""
    return yaml.dump(dict(data), Dumper=StoredDumper, sort_keys=False, allow_unicode=True)


def load_yaml(text: str, stored: bool = False) -> Any:
    """What ``text`` holds: a person's YAML (``--set``'s values), or a study's own
    experiment.yaml (``stored``)."""
    return yaml.load(text, Loader=StoredLoader if stored else ExperimentLoader)
