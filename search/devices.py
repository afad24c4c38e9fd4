"""What one trial runs on: accelerator, precision and DataLoader options from its resources.

Decided inside the trial's worker, because only there is it known whether a GPU is
visible. Each choice is reported with the trial's results.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .config import LoaderConfig, ResourcesConfig, TrainerConfig
from .errors import warn_user


@dataclass(frozen=True)
class TrialDevice:
    accelerator: str  # "gpu" or "cpu"
    precision: str  # the precision actually used
    loader_options: dict

    @property
    def on_gpu(self) -> bool:
        return self.accelerator == "gpu"


def resolve_precision(requested: str, on_gpu: bool) -> str:
    """The precision a trial uses. 'auto', the default, is mixed precision where it is the
    proven gain, a GPU (bf16-mixed, or 16-mixed on one without bf16), and 32-true on a CPU,
    where bf16's speed depends on the processor's bf16 instructions (1.3-1.9x on this
    project's machine, slower on many laptops). float16 autocast is for GPUs, so a CPU trial
    runs '16-mixed' as 'bf16-mixed'; a GPU without bf16 runs 'bf16-*' as '16-mixed'. The
    trial records what it used; the driver warns once (``precision_fallback_warning``)."""
    requested = without_auto(requested, on_gpu)
    if not on_gpu and requested == "16-mixed":
        return "bf16-mixed"
    if on_gpu and requested.startswith("bf16") and not torch.cuda.is_bf16_supported():
        return "16-mixed"
    return requested


def without_auto(requested: str, on_gpu: bool) -> str:
    """'auto' as the precision it stands for, before any device's own limits apply."""
    if requested == "auto":
        return "bf16-mixed" if on_gpu else "32-true"
    return requested


def precision_fallback_warning(trainer: TrainerConfig, resources: ResourcesConfig,
                               space: Mapping[str, Any] | None = None) -> None:
    """One warning, in the driver, when CPU trials cannot use the requested precision, or
    one that the search can sample (``space``)."""
    if resources.worker_gpus > 0:
        return
    if trainer.precision == "16-mixed":
        warn_user("trainer.precision '16-mixed' needs a GPU and these trials run on CPU: they use 'bf16-mixed' instead")
    if "16-mixed" in getattr((space or {}).get("trainer.precision"), "choices", ()):
        warn_user("space.trainer.precision: '16-mixed' needs a GPU and these trials run on CPU: a trial that samples "
                  "it uses 'bf16-mixed', so the two choices train alike")


def loader_setting_warnings(loader: LoaderConfig, resources: ResourcesConfig,
                            data_workers: Mapping[str, int] | None = None, data_class: type | None = None) -> None:
    """Warn, in the driver, of ``loader`` settings that cannot do what they ask for these
    trials: pinned memory for trials without a GPU (torch pins only for an accelerator),
    and more loader workers than the CPUs a trial worker holds (they share those CPUs),
    by the loader setting or by the DataModule's own ``num_workers`` (``data_workers``:
    the most each field that sets it can give, e.g. ``data.init_args.num_workers``); or
    any, for a DataModule that declares ``loads_in_main_process`` (in-memory data)."""
    if loader.pin_memory is True and resources.worker_gpus == 0:
        warn_user("loader.pin_memory: true does nothing for these trials: they run on CPU, and memory is "
                  "pinned only for a GPU")
    cpus = resources.worker_cpus
    asked = {**({} if loader.num_workers == "auto" else {"loader.num_workers": loader.num_workers}),
             **(data_workers or {})}
    in_process = getattr(data_class, "loads_in_main_process", False) is True
    for field, workers in asked.items():
        if in_process and workers > 0:
            warn_user(f"{field}: {workers} loader processes are asked for, but {data_class.__name__} loads its "
                      f"in-memory data in the trial's own process: none run")
        elif workers > cpus:
            up_to = "up to " if field.startswith("space.") else ""
            warn_user(f"{field}: {up_to}{workers} loader processes share the {cpus:g} CPU(s) each trial worker "
                      f"holds (resources.cpus_per_{'worker' if resources.workers_per_trial > 1 else 'trial'})")


def training_loaders(loaders: Any) -> list:
    """The DataLoaders among a trial's training loaders as Lightning holds them (one, or a
    list or mapping of them, or a CombinedLoader)."""
    from pytorch_lightning.utilities import CombinedLoader
    from torch.utils.data import DataLoader

    combined = loaders if isinstance(loaders, CombinedLoader) else CombinedLoader(loaders)  # Lightning's flattening
    return [leaf for leaf in combined.flattened if isinstance(leaf, DataLoader)]


def loader_in_use(loaders: Any) -> dict[str, Any]:
    """What the trial's training DataLoaders actually use, for trials.csv: the worker count
    of one (the most any has: a DataModule passing its ``num_workers`` on gives each as many,
    and their sum put in best.json's config gave a retraining twice the workers, other seeds),
    and whether batches are pinned (torch pins only where an accelerator exists). hpsearch's
    own options may not be what ran: a DataModule may fix its own ``num_workers``, or not
    pass hpsearch's on."""
    found = training_loaders(loaders)
    if not found:
        return {}
    return {"hps_num_workers": max(int(dl.num_workers) for dl in found),
            "hps_pin_memory": any(dl.pin_memory for dl in found) and _pinning_possible()}


def _pinning_possible() -> bool:
    """Torch's own rule for whether a DataLoader with ``pin_memory=True`` pins."""
    accelerator = getattr(torch, "accelerator", None)
    return bool(accelerator.is_available()) if accelerator is not None else torch.cuda.is_available()


def loader_options(loader: LoaderConfig, resources: ResourcesConfig, on_gpu: bool) -> dict:
    """DataLoader options: workers from the CPUs of one trial worker, pinned memory only on GPU.

    On CPU the main process trains, so one of the trial's CPUs is left to it; on GPU
    every CPU the trial holds can decode data. With no worker processes, persistent
    workers and prefetching do not apply and are given as off: a user's DataModule that
    passes them straight to ``DataLoader`` would otherwise fail every trial (torch
    refuses both when ``num_workers`` is 0).
    """
    cpus = int(resources.worker_cpus)
    workers = loader.num_workers
    if workers == "auto":
        workers = cpus if on_gpu else max(0, cpus - 1)
    pin = on_gpu if loader.pin_memory == "auto" else loader.pin_memory
    workers = int(workers)
    return {"num_workers": workers, "pin_memory": bool(pin), **worker_dependent_options(loader, workers)}


WORKER_DEPENDENT_OPTIONS = ("persistent_workers", "prefetch_factor")


def worker_dependent_options(loader: LoaderConfig, workers: int) -> dict:
    """Persistent workers and prefetching for a DataLoader of ``workers`` processes: as
    ``loader`` asks, or off without workers (torch refuses both when num_workers is 0)."""
    return {"persistent_workers": loader.persistent_workers and workers > 0,
            "prefetch_factor": loader.prefetch_factor if workers > 0 else None}


def datamodule_worker_counts(data_init_args: Mapping[str, Any], space: Mapping[str, Any]) -> dict[str, int]:
    """The most loader workers a DataModule's own ``num_workers`` can get, by the field that
    sets it: its ``init_args``, or the search space (which wins); for ``loader_setting_warnings``."""
    searched, set_by_hand = space.get("data.num_workers"), data_init_args.get("num_workers")
    if searched is not None:
        counts = [value for value in searched.edge_values() if isinstance(value, int) and not isinstance(value, bool)]
        return {"space.data.num_workers": max(counts)} if counts else {}
    if isinstance(set_by_hand, int) and not isinstance(set_by_hand, bool):
        return {"data.init_args.num_workers": set_by_hand}
    return {}


def use_sharing_strategy(loader: LoaderConfig) -> str:
    """Make this process's DataLoader workers hand batches over by shared-memory file name
    ('file_system') rather than torch's Linux default, a file descriptor sent over a socket
    for every tensor ('file_descriptor'): on 2 CPUs the default's per-batch cost in the
    trial process measured 4-10 points of the loader's efficiency (``benchmarks/loader.py``).
    Process-wide, so it is set in the trial's own worker process; returns the strategy in use
    (the platform's own where the requested one does not exist, e.g. on macOS)."""
    import torch.multiprocessing as torch_mp

    if loader.sharing_strategy in torch_mp.get_all_sharing_strategies():
        torch_mp.set_sharing_strategy(loader.sharing_strategy)
    return torch_mp.get_sharing_strategy()


def trial_device(trainer: TrainerConfig, loader: LoaderConfig, resources: ResourcesConfig) -> TrialDevice:
    on_gpu = resources.worker_gpus > 0 and torch.cuda.is_available()
    return TrialDevice(
        accelerator="gpu" if on_gpu else "cpu",
        precision=resolve_precision(trainer.precision, on_gpu),
        loader_options=loader_options(loader, resources, on_gpu),
    )
