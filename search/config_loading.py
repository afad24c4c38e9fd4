"""Reading an experiment file: YAML with line numbers, ``--set`` overrides, schema errors.

``load_config`` is the single entry point. Every error it raises is a ``ConfigError``
whose problems name the dotted field and, where the value came from the file, the
YAML line; nothing here touches the filesystem beyond reading the file.
"""

from __future__ import annotations

import copy
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .config import SET, ExperimentConfig, FieldValueError, split_field, written_as_yaml
from .errors import ConfigError, Problem
from .yaml_io import ExperimentLoader, StoredLoader, load_yaml

# Where each key came from: its line in the file, or the command-line option that set it
# ("--set", "--name", "--storage"), so that an error blames what the user typed.
LineMap = dict[tuple[str, ...], int | str]


def load_config(
    source: str | Path | Mapping[str, Any],
    overrides: Iterable[str] | Mapping[str, Any] = (),
    options: Mapping[str, Any] | None = None,
    stored: bool = False,
) -> ExperimentConfig:
    """Parse, override and validate an experiment from a YAML path, a plain dict or a
    validated config (``check``'s).

    ``options`` are top-level fields given by command-line options of the same name
    (``{"name": ...}`` for ``--name``); they apply last and errors blame the option.
    ``stored``: the path is a study's own experiment.yaml (see ``yaml_io``).
    """
    if isinstance(overrides, str):
        overrides = [overrides]  # one key=value, not a sequence of its characters
    if isinstance(source, ExperimentConfig):  # what check() returns, given back (audit 51: refused)
        source = source.model_dump(mode="json")
    if not isinstance(source, (str, Path, Mapping)):
        raise TypeError(f"the experiment must be a YAML file's path or a mapping, not {type(source).__name__}")
    if not isinstance(overrides, (Mapping, Iterable)):
        raise TypeError(f"overrides must be a mapping or a list of 'key=value' strings, "
                        f"not {type(overrides).__name__}")
    if isinstance(source, Mapping):
        raw, lines, origin = copy.deepcopy(dict(source)), {}, "<dict>"
    else:
        origin = str(source)
        raw, lines = read_yaml(Path(source), StoredLoader if stored else ExperimentLoader)
    # A mapping comes from the Python API (run/check/resume's ``overrides``), key=value
    # strings from the command line's --set (or the same syntax given to the API).
    overrides_label = "overrides" if isinstance(overrides, Mapping) else SET
    for key, value in parse_overrides(overrides):
        if value is None and _is_first_trial(split_field(key)):
            lines = _first_trial_taken_out(raw, lines, key, overrides_label)
            continue
        paths = apply_override(raw, key, value, overrides_label)
        lines = _lines_replaced(lines, raw, paths)
        for path in paths:
            lines[path] = overrides_label
    for key, value in (options or {}).items():
        raw[key] = value  # storage=Path(...) is a path: _as_yaml_reads_it
        lines[(key,)] = f"--{key}"
    return validate(raw, lines, origin)


def read_yaml(path: Path, loader: type = ExperimentLoader) -> tuple[dict[str, Any], LineMap]:
    """The file's mapping and the line of every key in it."""
    if path.is_dir():
        raise ConfigError.single("", f"{str(path)!r} is a directory; give the experiment's YAML file")
    if not path.exists():  # a pipe (``<(...)``) is not a file, but can be read (audit 36)
        raise ConfigError.single("", f"experiment file {str(path)!r} does not exist")
    try:
        content = path.read_bytes()
    except OSError as exc:
        raise ConfigError.single("", f"experiment file {str(path)!r} cannot be read: {exc.strerror}") from None
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        # A Latin-1 comment, or the UTF-16 that Windows PowerShell's ``>`` writes (audit 36).
        line = content[:exc.start].count(b"\n") + 1
        what = ("it is UTF-16 (as Windows PowerShell's '>' writes)" if content[:2] in (b"\xff\xfe", b"\xfe\xff")
                else f"byte {content[exc.start]:#04x} at offset {exc.start}")
        raise ConfigError.single("", f"the file is not UTF-8 text ({what}); save it as UTF-8", line,
                                 str(path)) from None
    try:
        node = yaml.compose(text, Loader=loader)
        data = yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        reason = getattr(exc, "problem", None) or str(exc)
        if "'\\t'" in reason:  # "found character '\t' that cannot start any token" (audit 69)
            reason += ": indent with spaces, YAML refuses tabs there"
        raise ConfigError.single("", f"malformed YAML: {reason}", line, str(path)) from None
    except RecursionError:
        raise ConfigError.single("", "the YAML nests too deeply to be read", None, str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError.single("", "the file must be a YAML mapping of settings", 1, str(path))
    _refuse_multiplied_aliases(node, "", "its", str(path))
    lines: LineMap = {}
    _collect_lines(node, (), lines, str(path))
    return data, lines


# An experiment file holds hundreds of values; aliases nested in aliases multiply (nine
# levels of nine took 13 GB and never ended: audit 69), and every check walks them all.
MAX_VALUES_READ = 100_000


def _refuse_multiplied_aliases(node: yaml.Node, field: str, whose: str, source: str) -> None:
    """Refuse a document (a file's, a ``--set`` value's) whose aliases expand too far."""
    if _values_read(node) > MAX_VALUES_READ:
        raise ConfigError.single(field, f"{whose} anchors and aliases (&name, *name) expand to more than "
                                        f"{MAX_VALUES_READ:,} values; write the values out", None, source)


def _values_read(node: yaml.Node, sizes: dict[int, int] | None = None) -> int:
    """How many values the document holds once each alias stands for what it names: an
    aliased node is one object, counted once and added wherever it is used."""
    sizes = {} if sizes is None else sizes
    if id(node) not in sizes:
        sizes[id(node)] = 1  # (a node cannot hold itself: the composer refuses that alias)
        if isinstance(node, yaml.MappingNode):
            sizes[id(node)] += sum(_values_read(key, sizes) + _values_read(value, sizes) for key, value in node.value)
        elif isinstance(node, yaml.SequenceNode):
            sizes[id(node)] += sum(_values_read(item, sizes) for item in node.value)
    return sizes[id(node)]


def _collect_lines(node: yaml.Node, prefix: tuple[str, ...], lines: LineMap, origin: str) -> None:
    """Every key's line; a key given twice in one mapping is an error (YAML would keep the
    last silently: a second ``mode:`` flipped the search's direction unseen)."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = prefix + (str(key_node.value),)
            line = key_node.start_mark.line + 1
            if path in lines:
                raise ConfigError.single(".".join(path), f"given twice, on lines {lines[path]} and {line}",
                                         line, origin)
            lines[path] = line
            _collect_lines(value_node, path, lines, origin)
    elif isinstance(node, yaml.SequenceNode):  # an item is named by its place: search.first_trials.0
        for index, item_node in enumerate(node.value):
            path = prefix + (str(index),)
            lines[path] = item_node.start_mark.line + 1
            _collect_lines(item_node, path, lines, origin)


def parse_overrides(overrides: Iterable[str] | Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``["a.b=1"]`` or ``{"a.b": 1}`` to (key, value) pairs in the order given, a key given
    twice twice (taking a first trial out moves the later ones: the order matters, audit 47);
    values are parsed as YAML scalars."""
    parsed: list[tuple[str, Any]] = []
    if isinstance(overrides, Mapping):
        parsed = list(overrides.items())
    for item in () if isinstance(overrides, Mapping) else overrides:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError.single("--set", f"{item!r} is not of the form key=value")
        try:
            if value.strip():
                _refuse_multiplied_aliases(yaml.compose(value, Loader=ExperimentLoader), key.strip(), "its value's",
                                           "--set")
            parsed.append((key.strip(), load_yaml(value) if value.strip() else None))
        except yaml.YAMLError:
            raise ConfigError.single(key.strip(), f"value {value!r} is not valid YAML", source="--set") from None
        except RecursionError:  # as the file's (audit 73)
            raise ConfigError.single(key.strip(), "its value nests too deeply to be read", source="--set") from None
    for key, _ in parsed:
        if isinstance(key, str) and "" in key.split("."):  # search..num_trials was named 'search.' (audit 69)
            raise ConfigError.single("--set", f"{key!r} has an empty part: two dots in a row, or a dot at an end")
    return parsed


def apply_override(tree: dict[str, Any], dotted_key: str, value: Any, source: str = SET) -> list[tuple[str, ...]]:
    """Set ``dotted_key`` in ``tree``; return the paths it set, for blaming errors on it.

    ``space.model.lr.high`` reaches ``tree["space"]["model.lr"]["high"]`` (space keys
    hold a dot). A mapping merges into the mapping already there, key by key, as YAML
    users expect of ``{"search": {"num_trials": 3}}``: replacing the section would drop
    the file's other settings unseen. A search-space parameter is the exception: a new
    definition replaces the old one whole (its keys depend on its type), and ``null``
    removes it (one file then serves a model without that argument). A number reaches
    into a list by place (``search.first_trials.1.model.lr``); the next place adds an
    item, and a value given for a whole item replaces it (``null`` for a whole first trial
    takes it out: ``_first_trial_taken_out``). ``null`` for a first trial's parameter takes
    it out of the trial, which then samples it. ``source`` names the override in errors
    (``--set``, or the API's ``overrides``).
    """
    *parents, last = split_field(dotted_key)
    node, created = tree, []
    for index, key in enumerate(parents):
        path = tuple(parents[:index + 1])
        if isinstance(node, list):
            place = _place_in(node, key, dotted_key, path[:-1], source)
            if place == len(node):
                node.append({})
                created.append(path)
            child = node[place]
        else:
            child = node.get(key)
            if child is None:
                child = node[key] = [] if _starts_a_list(path, [*parents, last][index + 1]) else {}
                created.append(path)
        if not isinstance(child, (dict, list)):
            raise ConfigError.single(dotted_key, f"cannot descend into {'.'.join(path)!r}, which is not a "
                                                 "mapping or a list", source=source)
        node = child
    path = (*parents, last)
    if isinstance(node, list):
        place = _place_in(node, last, dotted_key, tuple(parents), source)
        if place == len(node):
            node.append(None)
        node[place] = copy.deepcopy(value)  # an item is replaced whole, as a parameter is
        return [*created, path, *_leaf_paths(value, path)]
    if value is None and _is_space_parameter(path):
        if node.pop(last, None) is None:
            raise ConfigError.single(dotted_key, f"the space has no parameter {last!r} to remove "
                                                 f"(it has {', '.join(map(repr, node)) or 'none'})", source=source)
        return [*created, path]  # an error about the space is the removal's (audit 66: it named the file's line)
    if value is None and len(path) == 4 and _is_first_trial(path[:3]):
        node.pop(last, None)  # sampled, as a parameter the trial leaves out
        return created
    node[last] = _merged(node.get(last), value, path)
    return [*created, path, *_leaf_paths(value, path)]


def _is_first_trial(path: tuple[str, ...]) -> bool:
    return len(path) == 3 and path[:2] == ("search", "first_trials")


def _first_trial_taken_out(raw: dict[str, Any], lines: LineMap, dotted_key: str, source: str) -> LineMap:
    """``--set search.first_trials.1=null``: the first trial taken out of the list, those
    after it a place up, and their lines in the file with them (an error in one of them
    still names its line, audit 47)."""
    *path, key = split_field(dotted_key)
    search = raw.get("search")
    items = search.get("first_trials") if isinstance(search, dict) else None
    items = items if isinstance(items, list) else []
    place = _place_in(items, key, dotted_key, tuple(path), source)
    if place == len(items):
        raise ConfigError.single(dotted_key, f"there is no {dotted_key} to take out", source=source)
    del items[place]
    depth = len(path)
    moved: LineMap = {}
    for where, line in lines.items():
        if tuple(where[:depth]) == tuple(path) and len(where) > depth and where[depth].isdigit():
            number = int(where[depth])
            if number == place:
                continue
            where = (*where[:depth], str(number - 1), *where[depth + 1:]) if number > place else where
        moved[where] = line
    return moved


def _place_in(items: list[Any], key: str, dotted_key: str, path: tuple[str, ...], source: str) -> int:
    """The place ``key`` names in the list at ``path``: one of its items, or the next (a new one)."""
    if key.isdigit() and int(key) <= len(items):
        return int(key)
    field = ".".join(path)
    held = ("it is empty; " if not items else f"its item is {field}.0, and " if len(items) == 1 else
            f"its items are {field}.0 to {field}.{len(items) - 1}, and ")
    raise ConfigError.single(dotted_key, f"{field} is a list: {held}{field}.{len(items)} adds one", source=source)


def _starts_a_list(path: tuple[str, ...], next_key: str) -> bool:
    """Whether a key the tree lacks is a list's: the key after it is a place, or the schema
    has a list there (so a place that is no number is said to be one)."""
    return next_key.isdigit() or path == ("search", "first_trials")


def _lines_replaced(lines: LineMap, raw: dict[str, Any], paths: list[tuple[str, ...]]) -> LineMap:
    """``lines`` without the file's lines inside a value an override replaced whole (a list,
    a search-space parameter), which would name a line that no longer holds the fault; a
    mapping it merged keeps those of the keys it left."""
    def value_at(path: tuple[str, ...]) -> Any:
        node: Any = raw
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        return node

    # (an item of a list is not a dict here, so one replaced whole counts as replaced)
    replaced = [path for path in paths if not isinstance(value_at(path), dict) or _is_space_parameter(path)]
    return {path: line for path, line in lines.items()
            if not any(len(path) > len(whole) and path[:len(whole)] == whole for whole in replaced)}


def _merged(old: Any, new: Any, path: tuple[str, ...]) -> Any:
    if not (isinstance(new, Mapping) and isinstance(old, dict)) or _is_space_parameter(path):
        return copy.deepcopy(new)
    merged = dict(old)
    for key, value in new.items():
        if value is None and _is_space_parameter((*path, str(key))):
            merged.pop(key, None)  # removed, as by --set space.<key>=null
            continue
        merged[key] = _merged(old.get(key), value, (*path, str(key)))
    return merged


def _is_space_parameter(path: tuple[str, ...]) -> bool:
    return len(path) == 2 and path[0] == "space"


def _leaf_paths(value: Any, path: tuple[str, ...]) -> list[tuple[str, ...]]:
    if not isinstance(value, Mapping):
        return []
    paths = []
    for key, child in value.items():
        child_path = (*path, str(key))
        paths += [child_path, *_leaf_paths(child, child_path)]
    return paths


def validate(raw: dict[str, Any], lines: LineMap, origin: str) -> ExperimentConfig:
    try:
        config = ExperimentConfig.model_validate(_as_yaml_reads_it(raw))
    except ValidationError as exc:
        raise ConfigError(_union_members_merged([_to_problem(error, lines, origin) for error in exc.errors()],
                                                exc.errors())) from None
    config._lines, config._origin = dict(lines), origin
    return config


def _as_yaml_reads_it(value: Any) -> Any:
    """Values given through the Python API as experiment.yaml gives them back on resume: a
    tuple as a list, and a numpy number (``np.int64(8)``, what an array's element is) as the
    Python number it holds; it was refused as "not a valid integer", or broke writing
    experiment.yaml after Ray had started (audit 36). Told by its module: numpy is not imported."""
    if isinstance(value, dict):
        return {key: _as_yaml_reads_it(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_yaml_reads_it(item) for item in value]
    if isinstance(value, os.PathLike):  # storage: Path(...) in a dict or the overrides
        return os.fspath(value)
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return value.item()
    return value


# How pydantic names the member of a union (``'auto' | int``) a value failed, in the
# error's location: not a key of the file.
UNION_MEMBER = re.compile(
    r"(literal|list|dict|tuple|function-\w+)\[.*\]|constrained-\w+|bool|int|float|str|none")


def _union_members_merged(problems: list[Problem], errors: list[Mapping[str, Any]]) -> list[Problem]:
    """One problem per field: a value that fits no member of a union (``num_workers: -1``
    for ``'auto' | int >= 0``) gets one error per member from pydantic, each located under
    the member's name (``loader.num_workers.literal['auto']``). They become one line that
    says what the field takes and what it got."""
    merged: dict[tuple[str, int | str | None], tuple[Problem, list[str], Any]] = {}
    for problem, error in zip(problems, errors):
        last = str(error["loc"][-1]) if error["loc"] else ""
        member = bool(UNION_MEMBER.fullmatch(last)) and problem.field.endswith(f".{last}")
        field = problem.field.removesuffix(f".{last}") if member else problem.field
        key = (field, problem.line or problem.source)
        message = problem.message.removesuffix(_got(error.get("input")))
        if key in merged:
            if message not in merged[key][1]:  # a number for a float or an int member, say
                merged[key][1].append(message.removeprefix("Input should be "))
        else:
            merged[key] = (replace(problem, field=field), [message], error.get("input"))
    return [replace(problem, message=f"{' or '.join(messages)}{'' if '(got ' in ''.join(messages) else _got(given)}")
            for problem, messages, given in merged.values()]


def _is_plain_value(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _got(value: Any) -> str:
    """What a field was given, said after its error (``(got 'fp16')``)."""
    return f" (got {value!r})" if _is_plain_value(value) else ""


def _to_problem(error: Mapping[str, Any], lines: LineMap, origin: str) -> Problem:
    # Discriminated unions add the tag ('float', 'int', ...) to the location; it is
    # not a key of the file, so it is dropped when naming the field.
    loc = [str(part) for part in error["loc"] if not (isinstance(part, str) and part in ("float", "int", "categorical"))]
    message = error["msg"].removeprefix("Value error, ")
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, FieldValueError):
        loc, message = list(split_field(".".join([*loc, cause.field]))), str(cause)
    line = _line_of(tuple(loc), lines)
    as_yaml = written_as_yaml(line, origin)
    if error["type"] == "extra_forbidden":
        meant = meant_key(loc)
        message = (f"unknown key; did you mean {meant}?" if meant else
                   "unknown key (check the spelling; see the README for the allowed keys)")
    elif error["type"] == "missing":
        message = "required key is missing"
    elif error["type"] == "union_tag_invalid":
        message = "type must be one of 'float', 'int', 'categorical'"
    elif error["type"] == "union_tag_not_found":
        message = "needs a 'type': 'float', 'int' or 'categorical' (space keys are 'model.<arg>', 'data.<arg>' or 'trainer.<setting>')"
        given = error.get("input") if isinstance(error.get("input"), dict) else {}
        misspelled = [key for key in given if isinstance(key, str) and key.strip().lower() == "type" and key != "type"]
        if misspelled:  # 'Type: float' was said to lack a type, with no word of its key (audit 69)
            message = f"needs a 'type' (lowercase; it has {misspelled[0]!r}): 'float', 'int' or 'categorical'"
    elif error["type"] == "string_type" and isinstance(error.get("input"), type):
        given = error["input"]
        if given.__module__ in ("__main__", "__mp_main__"):  # its import path would be refused next
            message = (f"an import path is needed, not the class {given.__qualname__} itself; and trial processes "
                       f"cannot import a class of the running script or notebook: move {given.__qualname__} into "
                       f"a module file beside it (say my_models.py) and name it 'my_models:{given.__qualname__}'")
        else:
            message = (f"an import path is needed, a string such as '{given.__module__}:{given.__qualname__}', "
                       f"not the class {given.__qualname__} itself")
    elif error["type"] == "string_type" and isinstance(error.get("input"), (int, float, bool)) and as_yaml:
        message = f"{message}; YAML read {error['input']!r} as a {type(error['input']).__name__}: put it in quotes"
    elif error["type"] == "model_type":  # pydantic: "a valid dictionary or instance of SearchConfig"
        given = error.get("input")
        message = "a section of settings (keys under it) is needed"
        if loc and loc[-1] in ("model", "data") and isinstance(given, str):
            message += f"; the class goes under class_path: {loc[-1]}: {{class_path: {given}}}"
        elif isinstance(given, list):
            message += ", not a list"  # a plain value is said after, as for every field
    elif error["type"] in ("float_type", "int_type") and isinstance(error.get("input"), (str, bool)):
        message = _not_a_number(error["input"], as_yaml)
    elif not isinstance(cause, FieldValueError) and _is_plain_value(error.get("input")):
        message = f"{message}{_got(error['input'])}"
    if isinstance(line, str):
        return Problem(".".join(loc), message, None, line)
    return Problem(".".join(loc), message, line, origin if line else None)


# Lightning's Trainer arguments that hpsearch takes elsewhere, as users write them under trainer
TRAINER_ARGUMENTS_ELSEWHERE = {
    "max_epochs": "scheduler.max_epochs", "max_time": "search.time_budget_s",
    "devices": "resources.gpus_per_trial (or, for DDP, resources.workers_per_trial)",
    "num_nodes": "resources.workers_per_trial", "accelerator": "resources.gpus_per_trial (0: the CPU)",
    "gradient_clip": "trainer.gradient_clip_val", "callbacks": "your LightningModule's configure_callbacks()",
}
# The sections of settings, whose keys are sometimes put in one another (or at the top)
SETTINGS_SECTIONS = ("search", "scheduler", "trainer", "loader", "resources", "failure")


def meant_key(loc: list[str]) -> str | None:
    """The known key an unknown one was probably meant to be: a close spelling in its
    section (``max_concurent``), the same name in another section (``trainer.max_epochs``
    is ``scheduler.max_epochs``), or where hpsearch takes a Lightning Trainer argument."""
    import difflib

    from pydantic import BaseModel

    sections = {name: field.annotation for name, field in ExperimentConfig.model_fields.items()}
    known = {(name,): None for name in sections}
    known.update({(name, inner): None for name, model in sections.items()
                  if isinstance(model, type) and issubclass(model, BaseModel) for inner in model.model_fields})
    *parent, key = loc
    if tuple(parent) == ("trainer",):
        lightning = difflib.get_close_matches(key, TRAINER_ARGUMENTS_ELSEWHERE, n=1, cutoff=0.85)
        if lightning:  # max_epoch too
            return TRAINER_ARGUMENTS_ELSEWHERE[lightning[0]]
    beside = [path[-1] for path in known if list(path[:-1]) == parent]
    close = difflib.get_close_matches(key, beside, n=1, cutoff=0.75)
    containing = [name for name in beside if len(key) > 3 and key in name]  # patience: early_stopping_patience
    if close or len(containing) == 1:
        return ".".join([*parent, (close or containing)[0]])
    if len(parent) > 1:
        return None  # inside a space parameter: no section's key goes there (audit 46: space.model.lr.seed)
    elsewhere = [".".join(path) for path in known if path[-1] == key and list(path[:-1]) != parent
                 and (len(path) == 1 or path[0] in SETTINGS_SECTIONS)]
    if parent in (["model"], ["data"]):  # an argument of the class, or a setting of a section (audit 47)
        argument = f"{parent[0]}.init_args.{key} (an argument of its class)"
        return f"{argument} or {elsewhere[0]}" if len(elsewhere) == 1 else argument
    if parent and parent[0] not in SETTINGS_SECTIONS:
        return None
    return elsewhere[0] if len(elsewhere) == 1 else None


def _not_a_number(given: str | bool, as_yaml: bool = True) -> str:
    """A number field given text or a boolean, which pydantic's lax mode took as a number
    in some fields and refused in others ("Input should be a valid number"). What it was
    given is added after, as for every field. Advice on YAML only for what was written as
    YAML: a Python caller's ``"5"`` has no quotes to remove."""
    if isinstance(given, bool):
        return "a number is needed; YAML reads yes, no, on and off as true and false" if as_yaml else \
            "a number is needed, not a boolean"
    try:
        number = float(given)
    except ValueError:
        return "a number is needed"
    if not math.isfinite(number):  # 'nan' is text to YAML, and no quotes were there to remove (audit 69)
        return "a finite number is needed"
    if not as_yaml:
        return "a number is needed, not a string"
    if "_" in given:  # Python reads 1_000 as a number; YAML 1.2 does not (audit 38)
        return f"a number is needed; YAML reads {given} as text: write it without the underscores"
    return "a number is needed; remove the quotes"


def _line_of(loc: tuple[str, ...], lines: LineMap) -> int | str | None:
    """The line of the field at fault, or the option that changed something inside it
    (``--set space.model.lr.high=-1`` breaks ``space.model.lr``, which the file set)."""
    for key, line in lines.items():
        if isinstance(line, str) and key[:len(loc)] == loc:
            return line
    for end in range(len(loc), 0, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def flat_settings(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """An experiment's settings (or any nested mapping's values) by dotted key."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(flat_settings(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
