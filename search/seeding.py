"""The seeds a study draws from its one ``search.seed``: its sampler's in each session, and
each trial's training seed. Each is drawn from the seed and the other numbers by a hash,
not added to the seed: seed plus a number is another seed's stream, so studies of seeds
0-4, run to measure the spread of results, shared trials' weights and shuffling (trial k
of seed s trained as trial k-1 of seed s+1) and sampled alike once one was resumed."""

from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from typing import Iterator


def resumed_seed(seed: int, trials_before: int) -> int:
    """The sampler's seed for a session that finds ``trials_before`` trials in its study:
    the study's own seed for its first session; after it, one drawn from both numbers, so
    a resumed session neither replays the first one's draws nor another seed's (audit 22)."""
    if trials_before == 0:
        return seed
    return _drawn(f"hpsearch resumed sampler {seed} {trials_before}")


def training_seed(seed: int | None, trial: int) -> int | None:
    """The seed trial number ``trial`` trains with (weights, shuffling, dropout, the loader
    workers' seeds: ``pytorch_lightning.seed_everything(..., workers=True)``); None, an
    unseeded trial, for a study without a seed. trials.csv and best.json record it, so
    that a trial can be trained again outside the search."""
    return None if seed is None else _drawn(f"hpsearch trial {seed} {trial}")


def _drawn(text: str) -> int:
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:4], "little")  # what numpy's generators take: below 2**32


@contextmanager
def generators_kept() -> Iterator[None]:
    """Python's, NumPy's and torch's global generators, and Lightning's seed variables, as
    they were before, once this is left: work done for the caller (the preflight's batches,
    a test evaluation, ``load_trial``) does not move its generators. torch's CUDA
    generators too, where the process has started CUDA: asking for their state starts it,
    which a driver without CUDA work (a CPU study, a notebook) must not (audit 44)."""
    import random

    import numpy

    # taken before torch and Lightning are imported, which may be their first import here
    python_state, numpy_state = random.getstate(), numpy.random.get_state()
    import torch
    from pytorch_lightning.utilities.seed import isolate_rng

    variables = {name: os.environ.get(name) for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")}
    try:
        with isolate_rng(include_cuda=torch.cuda.is_initialized()):
            yield
    finally:
        random.setstate(python_state)
        numpy.random.set_state(numpy_state)
        for name, value in variables.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def seeded_as_its_trial(seed: int | None) -> Iterator[None]:
    """The global generators seeded as trial ``seed`` seeded them (``seed_everything``;
    nothing done for None, an unseeded study), and the caller's own put back after
    (``generators_kept``). Rebuilt so (the test evaluation, ``load_trial``), a DataModule
    that splits its data with the global generator splits it as its trial did: otherwise
    its test split held the trial's training samples."""
    import pytorch_lightning as pl

    with generators_kept():
        if seed is not None:
            pl.seed_everything(seed, workers=True, verbose=False)
        yield
