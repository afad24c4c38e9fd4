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
def seeded_as_its_trial(seed: int | None) -> Iterator[None]:
    """Python's, NumPy's and torch's global generators seeded as trial ``seed`` seeded them
    (``seed_everything``; nothing done for None, an unseeded study), and the caller's own
    states and Lightning's seed variables put back after. Rebuilt so (the test evaluation,
    ``load_trial``), a DataModule that splits its data with the global generator splits it
    as its trial did: otherwise its test split held the trial's training samples."""
    import pytorch_lightning as pl
    from pytorch_lightning.utilities.seed import isolate_rng

    variables = {name: os.environ.get(name) for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")}
    with isolate_rng():
        try:
            if seed is not None:
                pl.seed_everything(seed, workers=True, verbose=False)
            yield
        finally:
            for name, value in variables.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
