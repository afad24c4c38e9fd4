"""The class names a study's data had when the study began, kept with the study.

A DataModule that names its classes (``classes``: a list of names, as the built-in
``image-folder`` and torchvision's ``ImageFolder`` have, in label order) gives each label a
meaning. Renaming, adding or removing a class folder between sessions shifted every label
with no word: a resumed study trained new trials on other labels beside the old ones, and
re-scored the best trial at 0 (audit 71). The first session's preflight records the names;
a later session's and ``load_trial`` compare them.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import ConfigError, Problem
from .experiment import ExperimentDir, write_json


def classes_of(datamodule: Any) -> list[str] | None:
    """The DataModule's class names in label order, if it names them."""
    classes = getattr(datamodule, "classes", None)
    if isinstance(classes, (list, tuple)) and classes and all(isinstance(name, str) for name in classes):
        return list(classes)
    return None


def stored_classes(exp: ExperimentDir) -> list[str] | None:
    """The names the study recorded (None for a study that recorded none)."""
    try:
        return json.loads(exp.data_json.read_text(encoding="utf-8"))["classes"]
    except (FileNotFoundError, KeyError, TypeError, ValueError):  # (TypeError: a file holding no mapping)
        return None


def keep_classes(exp: ExperimentDir, classes: list[str] | None) -> None:
    """Record the names, unless the study has them or the data names none."""
    if classes is not None and stored_classes(exp) is None:
        write_json(exp.data_json, {"classes": classes})


def changed_classes(exp: ExperimentDir, classes: list[str] | None) -> str | None:
    """What changed since the study recorded its class names (None if nothing did)."""
    stored = stored_classes(exp)
    if stored is None or classes is None or stored == classes:
        return None
    gone, new = [name for name in stored if name not in classes], [name for name in classes if name not in stored]
    what = "; ".join(filter(None, (f"gone: {', '.join(map(repr, gone))}" if gone else "",
                                   f"new: {', '.join(map(repr, new))}" if new else ""))) or "their order"
    lists = f" (it had {stored}, the data now has {classes})" if len(stored) + len(classes) <= 40 else ""
    return (f"the data's classes changed since the study began ({what}): its labels would now name other classes "
            f"than its trials learned{lists}; put the data back as it was, or start a new experiment")


def check_classes(exp: ExperimentDir, classes: list[str] | None) -> None:
    """Refuse a session on data whose class names changed; record them if the study has none."""
    changed = changed_classes(exp, classes)
    if changed is not None:
        raise ConfigError([Problem("data", changed)])
    keep_classes(exp, classes)
