"""hpsearch: fast hyperparameter search for PyTorch Lightning models on Ray Tune.

The public API is ``run``, ``resume`` and ``check`` (see ``hpsearch.search.api``), and, for
your DataModules, ``once_per_worker`` (see ``hpsearch.search.worker_data``). They are
imported lazily so that ``import hpsearch`` (and the CLI's fast paths) stay cheap.
"""

__version__ = "0.1.0"
__all__ = ["run", "resume", "check", "load_config", "once_per_worker", "__version__"]


def __getattr__(name: str):
    if name in ("run", "resume", "check"):
        from .search import api

        return getattr(api, name)
    if name == "once_per_worker":
        from .search.worker_data import once_per_worker

        return once_per_worker
    if name == "load_config":
        from .search.config import load_config

        return load_config
    raise AttributeError(f"module 'hpsearch' has no attribute {name!r}")
