"""hpsearch: fast hyperparameter search for PyTorch Lightning models on Ray Tune.

The public API is ``run``, ``resume`` and ``check`` (see ``hpsearch.search.api``), the
exceptions and warnings they raise and the types they return, ``load_trial`` (a finished trial's trained model; see
``hpsearch.search.trained``), and, for your DataModules, ``once_per_worker`` (see
``hpsearch.search.worker_data``). They are imported lazily so that ``import hpsearch`` (and
the CLI's fast paths) stay cheap.
"""

import os as _os

__version__ = "0.1.0"

# In the source checkout this folder holds only this file: search/ and models/ sit beside it
# and become hpsearch.search and hpsearch.models when installed. A process that imports
# hpsearch from the checkout anyway (Ray starts its workers in the driver's working
# directory, ahead of site-packages) finds them there, instead of failing every trial with
# "No module named 'hpsearch.search'" under a non-editable install run from the checkout.
if not _os.path.isdir(_os.path.join(__path__[0], "search")):
    _checkout = _os.path.dirname(_os.path.abspath(__path__[0]))
    if _os.path.isfile(_os.path.join(_checkout, "search", "__init__.py")):
        __path__.append(_checkout)

__all__ = ["run", "resume", "check", "load_config", "load_trial", "once_per_worker", "__version__",
           "SearchResult", "LoadedTrial", "HpsearchError", "ConfigError", "ExperimentError", "ResourceError",
           "ClusterError", "StorageError", "DiskFullError", "Interrupted", "CallbackError", "UnreadableDataFile",
           "NoResultWarning", "StoppedEarlyWarning"]

# where each exception and warning the API raises, and each type it returns, is defined
# (audits 32 and 51: named by the README, or raised by resume and load_trial, they could
# not be imported from hpsearch)
_RAISED = {"HpsearchError": "errors", "ConfigError": "errors", "ExperimentError": "errors",
           "ResourceError": "errors", "ClusterError": "cluster_join", "StorageError": "storage",
           "DiskFullError": "errors", "Interrupted": "errors", "CallbackError": "errors",
           "UnreadableDataFile": "errors", "NoResultWarning": "api", "StoppedEarlyWarning": "api",
           "SearchResult": "api", "LoadedTrial": "trained"}


def __getattr__(name: str):
    if name in ("run", "resume", "check"):
        from .search import api

        return getattr(api, name)
    if name == "once_per_worker":
        from .search.worker_data import once_per_worker

        return once_per_worker
    if name in _RAISED:
        import importlib

        return getattr(importlib.import_module(f".search.{_RAISED[name]}", __name__), name)
    if name == "load_trial":
        from .search.trained import load_trial

        return load_trial
    if name == "load_config":
        from .search.config_loading import load_config

        return load_config
    raise AttributeError(f"module 'hpsearch' has no attribute {name!r}")
