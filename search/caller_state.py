"""What a search changes in the process that calls it, put back when it returns: a Python
session (a notebook, a script) goes on after ``hpsearch.run`` or ``resume`` as before it.
The preflight keeps the generators it seeds itself (``preflight.run_preflight``)."""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from typing import Iterator

# hpsearch quiets these for a search (``tuner._quiet_tune_logs``); Optuna's too (``searcher``)
QUIETED_LOGGERS = ("ray.tune", "ray.train", "ray.air")
# set by ray.init to Ray's own debugger, for a Ray the process may go on using: a later
# breakpoint() in the session then opened no pdb, and went on past it
BREAKPOINT_HOOK = "PYTHONBREAKPOINT"


@contextmanager
def caller_state_kept() -> Iterator[None]:
    """Python's and NumPy's global generators (Ray Tune's driver shuffles with Python's,
    ASHA draws with NumPy's: a notebook's seeded draws came out otherwise after a search),
    the levels of the loggers a search quiets, Optuna's verbosity and Python's
    ``breakpoint()`` hook, as they were before, once this is left (audit 51)."""
    import random

    import numpy

    generators = random.getstate(), numpy.random.get_state()
    levels = {name: logging.getLogger(name).level for name in QUIETED_LOGGERS}
    verbosity = sys.modules["optuna"].logging.get_verbosity() if "optuna" in sys.modules else logging.INFO
    hook = os.environ.get(BREAKPOINT_HOOK)
    try:
        yield
    finally:
        random.setstate(generators[0])
        numpy.random.set_state(generators[1])
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        if "optuna" in sys.modules:  # INFO, Optuna's own default, where it was not imported before
            sys.modules["optuna"].logging.set_verbosity(verbosity)
        if hook is None:
            os.environ.pop(BREAKPOINT_HOOK, None)
        else:
            os.environ[BREAKPOINT_HOOK] = hook
