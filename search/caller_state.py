"""What a search changes in the process that calls it, put back when it returns: a Python
session (a notebook, a script) goes on after ``hpsearch.run`` or ``resume`` as before it.
The preflight keeps the generators it seeds itself (``preflight.run_preflight``)."""

from __future__ import annotations

import logging
import os
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

# hpsearch quiets these for a search (``tuner._quiet_tune_logs``), to this level; Optuna's
# to WARNING (``searcher``)
QUIETED_LOGGERS = ("ray.tune", "ray.train", "ray.air")
QUIET_LEVEL = logging.ERROR
# set by ray.init to Ray's own debugger, for a Ray the process may go on using: a later
# breakpoint() in the session then opened no pdb, and went on past it
BREAKPOINT_HOOK = "PYTHONBREAKPOINT"


@contextmanager
def caller_state_kept(loggers_quieted: bool = True) -> Iterator[None]:
    """Python's and NumPy's global generators (Ray Tune's driver shuffles with Python's,
    ASHA draws with NumPy's: a notebook's seeded draws came out otherwise after a search),
    the levels of the loggers a search quiets, Optuna's verbosity and Python's
    ``breakpoint()`` hook, as they were before, once this is left (audit 51).

    A search in a thread other than the main one leaves the generators as they are: the
    main thread may draw from them meanwhile, and would draw its numbers again (audit 53).
    A logger, Optuna's verbosity or the hook is put back only where it is at the value a
    search sets (a logger only where ``loggers_quieted``: a verbose search leaves them, and
    one the caller set to ERROR meanwhile stays so; audit 54). Optuna's is set again by each
    opening of the study, so a verbosity the caller sets while a search runs does not last."""
    import random

    import numpy

    in_main_thread = threading.current_thread() is threading.main_thread()
    generators = random.getstate(), numpy.random.get_state()
    levels = {name: logging.getLogger(name).level for name in QUIETED_LOGGERS}
    verbosity = sys.modules["optuna"].logging.get_verbosity() if "optuna" in sys.modules else logging.INFO
    hook = os.environ.get(BREAKPOINT_HOOK)
    try:
        yield
    finally:
        if in_main_thread:
            random.setstate(generators[0])
            numpy.random.set_state(generators[1])
        for name, level in levels.items():
            if loggers_quieted and logging.getLogger(name).level == QUIET_LEVEL:
                logging.getLogger(name).setLevel(level)
        # INFO, Optuna's own default, where it was not imported before
        if "optuna" in sys.modules and sys.modules["optuna"].logging.get_verbosity() == logging.WARNING:
            sys.modules["optuna"].logging.set_verbosity(verbosity)
        if os.environ.get(BREAKPOINT_HOOK, "").startswith("ray."):  # Ray's debugger, which ray.init set
            if hook is None:
                os.environ.pop(BREAKPOINT_HOOK, None)
            else:
                os.environ[BREAKPOINT_HOOK] = hook
