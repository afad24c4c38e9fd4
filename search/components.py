"""The user's classes: finding them, checking their constructors, and building them.

A ``class_path`` is a built-in name (``cnn``, ``digits``) or ``package.module:Class``.
Sampled values reach the classes as constructor keyword arguments, merged over
``init_args``. Two kinds of argument are filled in by hpsearch when the constructor
takes them and the user did not set them:

* model arguments the DataModule knows (``DATA_TO_MODEL_ARGS``: ``input_shape``,
  ``num_classes``), read from the DataModule's attributes of the same name;
* DataLoader options (``LOADER_ARGS``), sized to the trial's resources.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import re
import socket
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import ComponentConfig, ExperimentConfig
from .errors import ConfigError, Problem, warn_user

DATA_TO_MODEL_ARGS = ("input_shape", "num_classes")
LOADER_ARGS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")


def builtin_paths(section: str) -> dict[str, str]:
    from hpsearch.models import BUILTIN_DATA, BUILTIN_MODELS

    return BUILTIN_MODELS if section == "model" else BUILTIN_DATA


def import_path(section: str, class_path: str) -> str:
    """The ``module:Class`` a ``class_path`` stands for (built-in names expanded)."""
    return builtin_paths(section).get(class_path, class_path)


def resolve_class(section: str, class_path: str) -> type:
    """Import the class; a ``ConfigError`` naming ``<section>.class_path`` if that fails.

    On the driver, ``check_components`` has made the current directory importable first;
    in a Ray worker, the user's modules come as the search shipped them
    (``shipped_code_first``), never from the worker's own directory.
    """
    field = f"{section}.class_path"
    path = import_path(section, class_path)
    if ":" not in path:
        known = ", ".join(sorted(builtin_paths(section)))
        module, dot, name = path.rpartition(".")
        hint = f"; did you mean '{module}:{name}'?" if dot and module and name else ""
        other = "data" if section == "model" else "model"
        if class_path in builtin_paths(other):  # model: {class_path: digits} (audit 36)
            hint = f"; {class_path!r} is a built-in {other} class: it goes under {other}.class_path"
        raise ConfigError.single(field, f"{class_path!r} is neither a built-in ({known}) nor 'package.module:Class'"
                                        f"{hint}")
    module_name, _, attr = path.partition(":")
    if module_name.partition(".")[0] in ("__main__", "__mp_main__"):
        raise ConfigError.single(field, f"{class_path!r} is defined in the running script or notebook, which trial "
                                        f"processes cannot import: move {attr} into a module file beside it "
                                        f"(say my_models.py) and name it 'my_models:{attr}'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        top = module_name.partition(".")[0]
        hint = (f" (looked for in the current directory {os.getcwd()} and the installed packages: run hpsearch "
                f"from the folder that holds {top!r}, or add that folder to PYTHONPATH)"
                if isinstance(exc, ModuleNotFoundError) and exc.name == top else "")
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").partition(".")[0] == "lightning":
            hint = ("; hpsearch runs pytorch_lightning, not the 'lightning' package: import from pytorch_lightning "
                    "(import pytorch_lightning as pl; lightning.pytorch's classes are pl's), as the two cannot be "
                    "mixed")  # (audit 45)
        raise ConfigError.single(field, f"cannot import module {module_name!r}: {exc}{hint}") from None
    except Exception as exc:  # the user's module raised while importing
        raise ConfigError.single(field, f"importing {module_name!r} raised {type(exc).__name__}: {exc}") from None
    try:
        cls = getattr(module, attr)
    except AttributeError:
        raise ConfigError.single(field, f"module {module_name!r} has no attribute {attr!r}") from None
    if not inspect.isclass(cls):
        raise ConfigError.single(field, f"{path!r} is not a class")
    return cls


def _make_cwd_importable() -> None:
    """On the driver, user packages beside the experiment import as with ``python -m``
    (cwd first). Not in a Ray worker: a node's own directory may hold a stray module of the
    same name as the user's, which used to shadow the shipped one there. First even where
    an earlier search of the session put it further down: a second project's folder, put
    first since, found its module of the same name (audit 81)."""
    cwd = os.getcwd()
    if sys.path[:1] != [cwd]:
        sys.path[:] = [cwd] + [entry for entry in sys.path if entry != cwd]


# The driver's host name, which every Ray process of a search gets (``tuner.ray_settings``).
DRIVER_HOST_ENV = "HPSEARCH_DRIVER_HOST"


def shipped_code_first() -> None:
    """In a Ray worker on another machine than the driver's, the user's modules as the
    search shipped them (``py_modules``, see ``user_code_roots``) come first on ``sys.path``.
    Ray puts the driver's working directory ahead of them, and that path on another machine
    may hold an older copy of the same code (a project baked into the nodes' image, say),
    which would shadow the code the driver checked. On the driver's machine that path holds
    the user's code itself, as a notebook's next search sees it after an edit (a local Ray
    stays up between searches, with what its first search shipped), so Ray's order stays.
    No-op outside Ray, where nothing was shipped, and where the driver's host is unknown
    (a Ray the user started, which ships nothing)."""
    import ray

    if os.environ.get(DRIVER_HOST_ENV) in (None, socket.gethostname()) or not ray.is_initialized():
        return
    uris = ray.get_runtime_context().runtime_env.get("py_modules") or []
    names = {Path(uri.partition("://")[2]).stem for uri in uris}  # gcs://_ray_pkg_<hash>.zip, unpacked by name
    shipped = [entry for entry in sys.path if Path(entry).name in names]
    if shipped:
        sys.path[:] = shipped + [entry for entry in sys.path if entry not in shipped]


@dataclass(frozen=True)
class Signature:
    """What a constructor accepts: its named arguments, which are required, and ``**kwargs``."""

    names: frozenset[str]
    required: frozenset[str]
    takes_any_keyword: bool

    @classmethod
    def of(cls, klass: type) -> "Signature":
        params = list(inspect.signature(klass.__init__).parameters.values())[1:]
        named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        return cls(
            names=frozenset(p.name for p in named),
            required=frozenset(p.name for p in named if p.default is p.empty),
            takes_any_keyword=any(p.kind is p.VAR_KEYWORD for p in params),
        )

    def accepts(self, name: str) -> bool:
        return name in self.names or self.takes_any_keyword


def check_components(config: ExperimentConfig) -> tuple[type, type]:
    """Resolve both classes and check every argument the file gives them; raise all problems at once."""
    _make_cwd_importable()
    _forget_user_modules(Path.cwd())
    problems: list[Problem] = [Problem("", message) for message in _stack_shadowed_in(Path.cwd())]
    if problems:  # importing the classes would import the shadowing module, and fail on it
        raise ConfigError(problems)
    classes: dict[str, type] = {}
    for section in ("model", "data"):
        component: ComponentConfig = getattr(config, section)
        try:
            classes[section] = resolve_class(section, component.class_path)
        except ConfigError as exc:
            problems += [config.problem(p.field, p.message) for p in exc.problems]
            continue
        kind = _kind_problem(section, classes[section])
        if kind:
            problems.append(config.problem(f"{section}.class_path", kind))
            continue
        problems += _argument_problems(config, section, classes[section])
    # A module here named as one of Python's own that the classes' imports took in its place
    # ("cannot import name 'Queue' from 'queue'", the user's queue.py): the cause first, where
    # there is a failure to explain (a wave.py of the user's own, which the stack never
    # imports, works, and was refused: audit 84)
    if problems:
        problems[:0] = [Problem("", message) for message in _standard_modules_shadowed_in(Path.cwd())]
    if not problems:
        problems += _loader_problems(config, classes["model"], classes["data"])
    _remember_user_sources(Path.cwd())
    if problems:
        raise ConfigError(problems)
    _warn_of_loader_settings_not_taken(config, classes["data"])
    return classes["model"], classes["data"]


def _stack_shadowed_in(directory: Path) -> list[str]:
    """A module in the search's folder named as one a trial imports: Ray's workers import
    that folder first, so every trial got it instead, and failed ('No module named
    hpsearch.search; hpsearch is not a package' for a launcher script named hpsearch.py)
    while the checks here passed (audit 32). The names are those of every installed
    library hpsearch depends on, directly or not (a pandas.py passed the checks, and the
    search failed in Ray Tune's import of pandas: audit 81). A folder named hpsearch is
    left alone: it is the package itself when the search runs from hpsearch's own checkout."""
    here = _top_level_modules_in(directory)
    if not here:
        return []
    from importlib import metadata

    installed = metadata.packages_distributions()  # top-level names -> distributions (0.2 s here)
    named_so = {name: installed[name] for name in here if name in installed}
    if not named_so:
        return []
    stack = _stack_distributions()
    found = []
    for name, path in sorted(here.items()):
        libraries = [dist for dist in named_so.get(name, []) if _canonical(dist) in stack]
        if libraries and not (name == "hpsearch" and path.is_dir()):
            shown = path.name if path.is_file() else f"{name}/"
            of = "" if _canonical(libraries[0]) == _canonical(name) else f" (of {libraries[0]})"
            found.append(f"{shown} in the current folder would be imported by every trial in place of {name}{of} "
                         f"(Ray's workers import the search's folder first): rename it")
    return found


def _standard_modules_shadowed_in(directory: Path) -> list[str]:
    """A module in the search's folder that this process imported in place of Python's own
    module of that name (queue.py, profile.py): what imported it then failed on it, in
    words that named no file (audit 81)."""
    found = []
    for name, path in sorted(_top_level_modules_in(directory).items()):
        module = sys.modules.get(name)
        if name in sys.stdlib_module_names and module is not None and getattr(module, "__file__", None) \
                and Path(module.__file__).resolve().is_relative_to(path.resolve()):
            shown = path.name if path.is_file() else f"{name}/"
            found.append(f"{shown} in the current folder is imported in place of Python's own module {name}: "
                         f"rename it")
    return found


def _top_level_modules_in(directory: Path) -> dict[str, Path]:
    """The modules (``name.py``) and packages (``name/__init__.py``) a folder holds, by name."""
    try:
        entries = list(directory.iterdir())
    except OSError:
        return {}
    found = {}
    for entry in entries:
        if entry.suffix == ".py" and entry.stem.isidentifier() and entry.is_file():
            found[entry.stem] = entry
        elif entry.name.isidentifier() and (entry / "__init__.py").is_file():
            found[entry.name] = entry
    return found


def _stack_distributions() -> set[str]:
    """hpsearch's installed distribution and those it requires, directly or not, with the
    extras asked for (ray[tune]'s pandas), by canonical name."""
    from importlib import metadata

    from packaging.requirements import Requirement

    found: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [("hpsearch", frozenset())]
    while todo:
        name, extras = todo.pop()
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        found.add(_canonical(name))
        for line in requires:
            requirement = Requirement(line)
            wanted = requirement.marker is None or any(requirement.marker.evaluate({"extra": extra})
                                                       for extra in (extras or {""}))
            if wanted and _canonical(requirement.name) not in found:
                todo.append((requirement.name, frozenset(requirement.extras)))
    return found


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _warn_of_loader_settings_not_taken(config: ExperimentConfig, data_class: type) -> None:
    """hpsearch hands its ``loader`` options to the DataModule as constructor arguments of
    the same names; one the file changes from its default that the DataModule has no
    argument for (or that its ``init_args`` set) changes nothing, and is said so."""
    from .config import LoaderConfig

    signature, defaults = Signature.of(data_class), LoaderConfig()
    for name in LOADER_ARGS:
        if getattr(config.loader, name) == getattr(defaults, name):
            continue
        if name not in signature.names:
            # hpsearch passes its loader options to arguments of their names only, never into
            # **kwargs, which may go anywhere; "takes no argument" was wrong for such a class
            what = f"names no argument {name!r} (its **kwargs get none of hpsearch's loader options)" \
                if signature.takes_any_keyword else f"takes no argument {name!r}"
            warn_user(f"loader.{name} is not passed on: {data_class.__name__} {what}, so its own "
                      "DataLoaders decide (trials.csv's num_workers and pin_memory show what they used)")
        elif name in config.data.init_args:
            warn_user(f"loader.{name} is not passed on: data.init_args sets {name}, which wins")


def _loader_problems(config: ExperimentConfig, model_class: type, data_class: type) -> list[Problem]:
    """A trial trains and validates every epoch (validation scores it for the search), so
    one of the two classes must define each loader. Found here, it is the DataModule's
    fault, not the model's, and it is found with the preflight off too."""
    import pytorch_lightning as pl

    problems = []
    for hook, why in (("train_dataloader", "to train on"), ("val_dataloader", "to score each epoch by")):
        defined = [klass for klass, base in ((data_class, pl.LightningDataModule), (model_class, pl.LightningModule))
                   if getattr(klass, hook, None) is not getattr(base, hook)]
        if not defined:
            problems.append(config.problem("data.class_path", f"{data_class.__name__} defines no {hook}() (nor does "
                                           f"{model_class.__name__}): hpsearch needs one {why}"))
    return problems


def _kind_problem(section: str, klass: type) -> str | None:
    """Why ``klass`` cannot be the ``section``'s class: not a pytorch_lightning
    LightningModule (model) or LightningDataModule (data). A class built on the
    ``lightning`` package's classes gets its own explanation: the two packages look the
    same and cannot be mixed in one Trainer."""
    import pytorch_lightning as pl

    base = pl.LightningModule if section == "model" else pl.LightningDataModule
    if issubclass(klass, base):
        return None
    other = next((c for c in klass.__mro__ if c.__module__.split(".")[0] == "lightning"), None)
    if other is not None:
        return (f"{klass.__name__} is built on {other.__module__}.{other.__name__} (the 'lightning' package); "
                f"hpsearch runs pytorch_lightning: import {base.__name__} from pytorch_lightning instead "
                "(the two packages cannot be mixed)")
    return f"{klass.__name__} is not a pytorch_lightning.{base.__name__}"


def _argument_problems(config: ExperimentConfig, section: str, klass: type) -> list[Problem]:
    signature = Signature.of(klass)
    component: ComponentConfig = getattr(config, section)
    searched_params = config.params_for(section, config.space)
    searched = set(searched_params)
    filled = set(DATA_TO_MODEL_ARGS if section == "model" else LOADER_ARGS)
    known = ", ".join(sorted(signature.names)) or "none"
    problems = [
        config.problem(f"{section}.init_args.{name}", f"{klass.__name__} takes no argument {name!r} (it takes: {known})")
        for name in component.init_args if not signature.accepts(name)
    ]
    problems += [
        config.problem(f"space.{section}.{name}", f"{klass.__name__} takes no argument {name!r} (it takes: {known})")
        for name in sorted(searched) if not signature.accepts(name)
    ]
    missing = signature.required - set(component.init_args) - searched - filled
    problems += [
        config.problem(f"{section}.init_args", f"{klass.__name__} needs argument {name!r}; set it in init_args or space")
        for name in sorted(missing)
    ]
    hints = _type_hints(klass)
    for name, value in component.init_args.items():
        # a conditional argument's too, which takes it where its condition is not met (a raw
        # TypeError in the preflight; audit 69); not an argument the space always gives, whose
        # value there is never used (a study holding one, ``lr: null``, was locked out; audit 72)
        field = f"{section}.init_args.{name}"
        if name in hints and (name not in searched or searched_params[name].when) \
                and (wrong := _wrong_type(klass, name, hints[name], value, config.read_as_yaml(field))):
            problems.append(config.problem(field, wrong))
    for name, param in sorted(searched_params.items()):
        field = f"space.{section}.{name}"
        as_yaml = config.read_as_yaml(field)
        if name in hints and (wrong := _sampled_wrong_type(klass, name, hints[name], param, as_yaml)):
            problems.append(config.problem(field, wrong))
    return problems


def check_split_not_searched(config: ExperimentConfig, data_class: type) -> None:
    """Refuse a new study that searches an argument its DataModule names as deciding the
    splits (``SPLIT_ARGUMENTS``): each trial would be scored on other validation samples,
    and their values compared as if alike (audit 71). Not a study's own config on resume or
    ``load_trial``: one begun before this check would be locked out (audit 73)."""
    searched = config.params_for("data", config.space)
    problems = [
        config.problem(f"space.data.{name}", f"{data_class.__name__}'s {name} decides which samples each split "
                                             f"holds: searched, each trial would be scored on other validation "
                                             f"samples, and their values could not be compared; set it in "
                                             f"data.init_args")
        for name in sorted(searched) if name in getattr(data_class, "SPLIT_ARGUMENTS", ())]
    if problems:
        raise ConfigError(problems)


def _type_hints(klass: type) -> dict[str, Any]:
    """The constructor's annotated argument types; an argument whose default is None also
    takes None (``x: int = None``, which Python no longer reads as Optional)."""
    import typing

    try:
        defaults = {name: parameter.default for name, parameter in inspect.signature(klass.__init__).parameters.items()}
    except (TypeError, ValueError):  # a constructor with no signature to read (built in C)
        defaults = {}
    return {name: typing.Optional[hint] if defaults.get(name, inspect.Parameter.empty) is None else hint
            for name, hint in _annotations(klass.__init__).items()}


def _annotations(init) -> dict[str, Any]:
    """A constructor's annotations, each resolved on its own when they cannot all be: one
    that does not evaluate here (a name imported under ``TYPE_CHECKING``) leaves out only
    itself."""
    import typing

    try:
        return typing.get_type_hints(init)
    except Exception:
        pass
    hints = {}
    for name, annotation in getattr(init, "__annotations__", {}).items():
        if isinstance(annotation, str):  # as get_type_hints evaluates it, in the constructor's module
            try:
                annotation = eval(annotation, getattr(init, "__globals__", {}))  # noqa: S307
            except Exception:  # a name that does not evaluate here
                continue
        hints[name] = annotation
    return hints


def _wrong_type(klass: type, name: str, annotation: Any, value: Any, as_yaml: bool = True) -> str | None:
    """Why ``value`` (set in init_args, or one the space can sample) does not suit the
    argument's annotated type, or None. Judged for annotations of plain values only
    (``_plain_annotation``). A value pydantic would convert counts as fitting, except a
    string where the type takes none (``weight_decay: "1e-4"``, quoted) and a float where
    it takes an int (``16.0``): the constructor would get it as it is, and fail later, in
    the preflight, blamed on the class. So is a boolean where it takes none: YAML reads
    ``off``, ``no``, ``on`` and ``yes`` as booleans, and ``augment: off`` for a
    ``Literal["off", "light"]`` gave the model ``False``. The advice on quotes is for a value
    written as YAML (``as_yaml``); a Python caller is told the type to pass."""
    from pydantic import TypeAdapter, ValidationError

    if not _plain_annotation(annotation):
        return None
    expected = _type_name(annotation)
    if isinstance(value, bool):
        if _fits_as_it_is(annotation, value):
            return None
        said = f"{value!r} is a boolean, and {klass.__name__}'s {name} takes {expected}"
        return (f"{said} (YAML reads true/false, yes/no and on/off as booleans): if you meant the word, put it in "
                f"quotes") if as_yaml else said
    try:
        TypeAdapter(annotation).validate_python(value)
    except ValidationError as exc:
        if isinstance(value, (int, float)) and _fits_as_it_is(annotation, str(value)):
            fix = f"put it in quotes ('{value}')" if as_yaml else f"pass the string '{value}'"
            return f"{value!r} is a number, and {klass.__name__}'s {name} takes {expected}: {fix}"
        return f"{value!r} does not suit {klass.__name__}'s {name}: {expected} ({exc.errors()[0]['msg']})"
    if _fits_as_it_is(annotation, value):
        return None
    if isinstance(value, str):
        return f"{value!r} is a string, and {klass.__name__}'s {name} takes {expected}: " + \
            ("write it without quotes" if as_yaml else "pass a number")
    if isinstance(value, float):
        return f"{value!r} is a float, and {klass.__name__}'s {name} takes {expected}: write {int(value)}"
    return None


def _sampled_wrong_type(klass: type, name: str, annotation: Any, param, as_yaml: bool = True) -> str | None:
    """Why values a space parameter can sample do not suit the argument's annotated type,
    or None: each choice, or each end of a range, as an ``init_args`` value is judged; a
    float range for an argument that takes ints is said as such (``type: float`` gives
    ``16.0`` to ``hidden: int``, which e.g. ``torch.empty`` refuses, blamed on the class)."""
    from .config import FloatParam

    for value in param.edge_values():
        if isinstance(param, FloatParam) and _fits_as_it_is(annotation, int(value)) \
                and not _fits_as_it_is(annotation, value):
            return (f"type: float samples floats such as {value!r}, and {klass.__name__}'s {name} takes "
                    f"{_type_name(annotation)}: use type: int")
        if wrong := _wrong_type(klass, name, annotation, value, as_yaml):
            return wrong
    return None


def _fits_as_it_is(annotation: Any, value: Any) -> bool:
    """Whether ``value`` suits a plain annotation with no conversion (pydantic's strict
    mode: an int passes for a float, a float never for an int); True for other annotations."""
    from pydantic import TypeAdapter, ValidationError

    if not _plain_annotation(annotation):
        return True
    try:
        TypeAdapter(annotation).validate_python(value, strict=True)
    except ValidationError:
        return False
    return True


_PLAIN_TYPES = (int, float, bool, str, type(None))


def _plain_annotation(annotation: Any) -> bool:
    """Whether an annotation is made of int, float, bool, str, None and Literals only
    (``Optional[int]``, ``int | float``, ``Literal["relu", "gelu"]``): what a value from
    the file or the space is. Others (``Path``, an ``Enum``, ``Sequence[int]``,
    ``torch.dtype``, ``np.float32``) are left to the constructor, which may convert what
    it gets or map a name to a value, as the README advises for lists."""
    import types
    import typing

    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return True
    if origin is typing.Annotated:
        return _plain_annotation(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return all(_plain_annotation(member) for member in typing.get_args(annotation))
    return annotation in _PLAIN_TYPES


def _type_name(annotation: Any) -> str:
    return annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")


def build_datamodule(config: ExperimentConfig, data_class: type, params: dict[str, Any], loader_options: dict[str, Any]):
    """The DataModule for one trial: init_args and the sampled values, then hpsearch's
    loader options it accepts that those leave unset. Persistent workers and prefetching
    follow the worker count the DataModule gets, the user's own included (off for 0), and
    are left to the DataModule where that count is its own affair (no ``num_workers``
    argument): given on while its ``init_args`` set ``num_workers: 0``, they failed every
    trial, after a preflight that loads without workers had passed (audit 31)."""
    from .devices import WORKER_DEPENDENT_OPTIONS, worker_dependent_options

    signature = Signature.of(data_class)
    kwargs = {**config.data.init_args, **config.params_for("data", params)}
    workers = kwargs.get("num_workers", loader_options["num_workers"] if "num_workers" in signature.names else None)
    dependent = worker_dependent_options(config.loader, workers) if isinstance(workers, int) else None
    for name, value in loader_options.items():
        if name not in signature.names or name in kwargs:
            continue
        if name in WORKER_DEPENDENT_OPTIONS:
            if dependent is None:
                continue  # the DataModule's own worker count, unknown here: its own values stand
            value = dependent[name]
        kwargs[name] = value
    datamodule = data_class(**kwargs)
    _prepare_data_one_at_a_time(datamodule)
    return datamodule


class _OnePerNode:
    """A DataModule's ``prepare_data`` run under a lock held by one process of this node
    at a time. It is where data is downloaded, once per node by Lightning's design; but
    a search runs many trials on a node at once, and two downloading the same files into
    the same directory would each find the other's half-written files. Ray's docs give
    the same fix (a ``FileLock`` around the download); this applies it to every
    DataModule. ``__wrapped__`` lets Lightning still see the method as overridden."""

    def __init__(self, prepare_data, lock_path: str) -> None:
        self.__wrapped__, self.lock_path = prepare_data, lock_path

    def __call__(self, *args, **kwargs):
        from filelock import FileLock

        with FileLock(self.lock_path):
            return self.__wrapped__(*args, **kwargs)


def _prepare_data_one_at_a_time(datamodule) -> None:
    """Serialize the DataModule's own ``prepare_data`` (if it has one) across this node's
    trials, per DataModule class (see ``_OnePerNode``)."""
    from pytorch_lightning.utilities.model_helpers import is_overridden

    if not is_overridden("prepare_data", datamodule):
        return
    klass = type(datamodule)
    lock_path = Path(tempfile.gettempdir()) / f"hpsearch-prepare-data-{klass.__module__}.{klass.__qualname__}.lock"
    datamodule.prepare_data = _OnePerNode(datamodule.prepare_data, str(lock_path))


def build_model(config: ExperimentConfig, model_class: type, params: dict[str, Any], datamodule):
    """The LightningModule for one trial, with arguments the DataModule knows filled in."""
    signature = Signature.of(model_class)
    kwargs = dict(config.model.init_args)
    kwargs.update(config.params_for("model", params))
    wanted = [name for name in DATA_TO_MODEL_ARGS if name in signature.names and name not in kwargs]
    if any(not hasattr(datamodule, name) for name in wanted):
        datamodule.prepare_data()
        datamodule.setup("fit")
    for name in wanted:
        if hasattr(datamodule, name):
            kwargs[name] = getattr(datamodule, name)
    return model_class(**kwargs)


def user_code_roots(config: ExperimentConfig) -> list[str]:
    """Directories or files of user modules that Ray workers cannot import on their own.

    A module found outside any installed location (site-packages) is user code living
    beside the experiment; it is shipped to workers with Ray's ``py_modules`` so that
    imports resolve on every node and a stray module of the same name in a worker's
    directory cannot shadow it. So are the current directory's other packages that the
    classes imported (``_imported_from``).
    """
    roots: list[str] = []
    _make_cwd_importable()
    for section in ("model", "data"):
        path = import_path(section, getattr(config, section).class_path)
        top = path.partition(":")[0].split(".")[0]
        if top == "hpsearch":
            continue
        spec = importlib.util.find_spec(top)
        if spec is None or spec.origin in (None, "built-in", "frozen"):
            continue
        location = Path(spec.origin).parent if spec.submodule_search_locations else Path(spec.origin)
        if any(part in ("site-packages", "dist-packages") for part in location.parts):
            continue
        if str(location) not in roots:
            roots.append(str(location))
    return roots + [root for root in _imported_from(Path.cwd()) if root not in roots]


def _imported_from(directory: Path) -> list[str]:
    """The top-level packages and modules of ``directory`` that this process has imported:
    besides the classes' own packages, those they import (a helper package beside them),
    which a worker on another machine would not find either. Called once the classes are
    imported (``check_components``); hpsearch itself is not user code."""
    return sorted(_user_modules_of(directory).values())


def _user_modules_of(directory: Path) -> dict[str, str]:
    """The names of the top-level modules this process imported from ``directory``, with
    where each lives (the package's folder, or the module's file)."""
    directory = directory.resolve()
    found = {}
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        # the script itself, also under its multiprocessing alias, whose file may be none
        # ("<stdin>" for `python - <<EOF`: Ray refused to ship it, with a traceback; audit 26)
        if "." in name or name in ("hpsearch", "__main__", "__mp_main__") or not origin \
                or not os.path.exists(origin):
            continue
        location = Path(origin).resolve()
        location = location.parent if location.name == "__init__.py" else location
        if location.parent == directory:
            found[name] = str(location)
    return found


# The user's module files as the driver's last check imported them: path -> mtime (ns).
_checked_sources: dict[str, int] = {}


def _forget_user_modules(directory: Path) -> None:
    """Before a search checks the user's classes: a package or module of ``directory`` (see
    ``_imported_from``) whose files changed since this process last checked them is
    imported anew, as the search's trials import it. A Python session's second search
    otherwise checked, and evaluated on the test split, the classes as they were at its
    first, while its trials ran the edited files (wrong test metrics, or a checkpoint that
    did not fit the old class). Unchanged ones stay, so a module that registers itself
    somewhere at import is not imported twice for nothing."""
    modules = _user_modules_with_submodules(directory)
    changed = {name.partition(".")[0] for name, module in modules.items()
               if _source_changed(getattr(module, "__file__", None))}
    # A module of this folder that the process imported from another folder, as user code:
    # a Python session's search of a second project checked, shipped to the trials,
    # trained and loaded the first project's module of the same name (audit 81).
    elsewhere = _held_here_imported_from_elsewhere(directory)
    modules.update({name: module for name, module in list(sys.modules.items()) if name.partition(".")[0] in elsewhere})
    changed |= elsewhere
    for name in [name for name in modules if name.partition(".")[0] in changed]:
        del sys.modules[name]
    if changed:
        importlib.invalidate_caches()


def _held_here_imported_from_elsewhere(directory: Path) -> set[str]:
    """The names of top-level modules ``directory`` holds (``name.py``, ``name/__init__.py``)
    that this process imported from another folder outside the installed packages and the
    standard library (which a module here of that name would shadow: see ``_stack_shadowed_in``)."""
    import sysconfig

    directory = directory.resolve()
    installed = {Path(sysconfig.get_paths()[key]).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    found = set()
    for name in _top_level_modules_in(directory):
        origin = getattr(sys.modules.get(name), "__file__", None)
        if name in ("hpsearch", "__main__", "__mp_main__") or not origin:
            continue
        location = Path(origin).resolve()
        location = location.parent if location.name == "__init__.py" else location
        if location.parent != directory and not any(root in location.parents for root in installed):
            found.add(name)
    return found


def _source_changed(path: str | None) -> bool:
    if path is None or path not in _checked_sources:
        return False
    try:
        return os.stat(path).st_mtime_ns != _checked_sources[path]
    except OSError:
        return True


def _remember_user_sources(directory: Path) -> None:
    for module in _user_modules_with_submodules(directory).values():
        path = getattr(module, "__file__", None)
        if path:
            with contextlib.suppress(OSError):
                _checked_sources[path] = os.stat(path).st_mtime_ns


def _user_modules_with_submodules(directory: Path) -> dict[str, Any]:
    """Every imported module of the top-level ones ``_user_modules_of`` finds, by name."""
    tops = set(_user_modules_of(directory))
    return {name: module for name, module in list(sys.modules.items()) if name.partition(".")[0] in tops}


def raised_by(exc: BaseException, *classes: type) -> type | None:
    """Which of the user's ``classes`` raised ``exc``: the one with a method (its own or an
    inherited one defined outside Lightning and torch) nearest the raise in the traceback."""
    import traceback

    def own_names(klass: type) -> set[str]:
        return {c.__name__ for c in klass.__mro__
                if c.__module__.split(".")[0] not in ("pytorch_lightning", "lightning", "torch", "builtins")}

    frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]
    for frame in reversed(frames):
        enclosing = getattr(frame.f_code, "co_qualname", "").split(".")[:-1]  # "Cls.method" -> ["Cls"]
        for klass in classes:
            if own_names(klass).intersection(enclosing):
                return klass
    return None


def raised_at(exc: BaseException) -> str | None:
    """'file:line in function' of the innermost frame outside Python, torch, Lightning,
    Ray and hpsearch: the user's code that raised, or None if none of it did."""
    import traceback

    return innermost_user_frame((frame.filename, frame.lineno, frame.name)
                                for frame in traceback.extract_tb(exc.__traceback__))


def innermost_user_frame(frames: Iterable[tuple[str, int | None, str]]) -> str | None:
    """Of a traceback's (file, line, function) frames, outermost first, the innermost
    outside Python, torch, Lightning, Ray, TensorBoard and hpsearch, as 'file:line in
    function'. (TensorBoard's writer thread waits in every hung trial's stacks: a rank
    hung in a collective, with no frame of the user's, was said to hang there; audit 62.)"""
    import sysconfig

    import pytorch_lightning
    import torch

    libraries = tuple(str(Path(p).resolve()) + os.sep for p in (
        sysconfig.get_paths()["stdlib"], Path(torch.__file__).parent, Path(pytorch_lightning.__file__).parent,
        Path(__file__).parent, *_package_dirs("lightning_fabric", "ray", "tensorboard")))
    for filename, lineno, name in reversed(list(frames)):
        # '<frozen os>': a standard module Python keeps frozen in itself (os.environ's lookup)
        if not filename.startswith("<frozen ") and not str(Path(filename).resolve()).startswith(libraries):
            return f"{filename}:{lineno} in {name}"
    return None


def _package_dirs(*names: str) -> list[Path]:
    specs = (importlib.util.find_spec(name) for name in names)
    return [Path(spec.origin).parent for spec in specs if spec is not None and spec.origin]
