"""The best trial's best checkpoint on the test split, without gradients."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

from .components import build_datamodule, build_model
from .config import ExperimentConfig
from .seeding import seeded_as_its_trial
from .storage import Mirror
from .trial import load_training_stack


LOADER_WARNINGS_SAID_BEFORE = (r"This DataLoader will create \d+ worker processes",
                               r"'pin_memory' argument is set as true but no accelerator")


def has_test_split(model, datamodule, test_fraction: float | None = None) -> bool:
    """Whether the model tests and the DataModule has a test split: both override Lightning's
    hooks, and a DataModule that holds one out by ``test_fraction`` (the built-in ones) was
    not built with 0 (its ``test_dataloader`` then refuses: the preflight failed on a valid
    setting). ``test_fraction``: the value for a DataModule class, where it is no attribute."""
    from pytorch_lightning import LightningDataModule, LightningModule
    from pytorch_lightning.utilities.model_helpers import is_overridden

    held_out = getattr(datamodule, "test_fraction", test_fraction)
    return is_overridden("test_step", model, LightningModule) and is_overridden(
        "test_dataloader", datamodule, LightningDataModule) and held_out != 0


# torch's words where a step makes a gradient under inference mode, which keeps none
_GRADIENT_REFUSED = re.compile(r"does not require grad|[Ii]nference tensors? ")


def test_with_fewest_gradients(trainer, model, datamodule, **test_args) -> tuple[list, bool]:
    """``trainer.test`` under ``torch.inference_mode()``; for a test_step that makes
    gradients of its own under ``torch.enable_grad()`` (an input's gradient: saliency,
    adversarial examples, a physics-informed residual), which inference mode refuses,
    again under ``torch.no_grad()``, which lets it. Such a model's validation ran (inside
    ``fit`` Lightning validates under no_grad) and its test failed the search (audit 82).
    Returns the test's outputs and whether inference mode ran it."""
    import torch

    try:
        with torch.inference_mode():
            return trainer.test(model, datamodule=datamodule, **test_args), True
    except RuntimeError as exc:
        if not _GRADIENT_REFUSED.search(str(exc)):
            raise
    trainer.test_loop.inference_mode = False  # the context Lightning runs its test loop in
    with torch.no_grad():
        return trainer.test(model, datamodule=datamodule, **test_args), False


def evaluate_checkpoint(experiment: dict[str, Any], params: dict[str, Any], checkpoint: str,
                        study_uri: str | None = None, seed: int | None = None) -> dict[str, float]:
    """Test metrics of ``checkpoint`` ({} when the model or data has no test split);
    ``study_uri``: fetch the checkpoint from the study's storage if it is not on this node.
    ``seed``: the trial's training seed, which the classes are built with, as the trial
    built them (``seeded_as_its_trial``).

    Runs under ``torch.inference_mode()``: no autograd state is kept, so evaluation is
    cheaper and can use larger batches than training (under ``no_grad`` for a test_step
    that makes gradients: ``test_with_fewest_gradients``).

    On GPU this runs as a Ray task in a new worker: torch and Lightning are imported by
    ``load_training_stack``, not when Ray unpickles this function, so that the import runs
    with the collector paused (see ``gc_pause``).
    """
    config = ExperimentConfig.model_validate(experiment)
    data_class, model_class = load_training_stack(config)
    import pytorch_lightning as pl
    from pytorch_lightning.loggers import TensorBoardLogger

    from .devices import trial_device
    from .checkpoint_callbacks import ModelCheckpointsInTrialDir
    from .checkpoints import model_checkpoint_dir
    from .lightning_trainer import ctrl_c_interrupts, lightning_quieted

    if study_uri is not None and not Path(checkpoint).is_file():
        mirror = Mirror.for_uri(study_uri)
        mirror.pull(str(Path(checkpoint).relative_to(mirror.local)))
    with lightning_quieted(), seeded_as_its_trial(seed):  # the driver may be the user's own Python session
        device = trial_device(config.with_trainer_params(params), config.loader, config.resources)
        datamodule = build_datamodule(config, data_class, params, device.loader_options)
        model = build_model(config, model_class, params, datamodule)
        if not has_test_split(model, datamodule):
            return {}
        if Path(checkpoint).is_dir():  # recorded as the evaluation's test_error, which says what to do
            raise NotImplementedError(
                f"{checkpoint} is a directory of DeepSpeed shards, which the test evaluation cannot load on one "
                f"device: make one file of it with pytorch_lightning.utilities.deepspeed."
                f"convert_zero_checkpoint_to_fp32_state_dict and test that")
        # A logger, as the trials and the preflight have: a test_step that logs through
        # ``self.logger`` (sample predictions, images) passed the preflight and then failed here
        # after the whole search. What it logs lands beside the checkpoint's trial: test/.
        trial_dir = Path(checkpoint).parent.parent
        test_logs = trial_dir / "test"
        # One evaluation's events: each session that evaluated the best trial again (a resume)
        # added a file, and TensorBoard showed its test metrics once per evaluation, all at step 0.
        for earlier in test_logs.glob("events.out.tfevents.*"):
            earlier.unlink(missing_ok=True)
        trainer = pl.Trainer(accelerator=device.accelerator, devices=1, precision=device.precision,
                             logger=TensorBoardLogger(str(test_logs), name="", version="", default_hp_metric=False),
                             default_root_dir=str(test_logs), enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False,
                             # the folder the model's own ModelCheckpoint had in training, as its restored state says
                             callbacks=[ModelCheckpointsInTrialDir(model_checkpoint_dir(trial_dir))])
        with ctrl_c_interrupts(), warnings.catch_warnings():
            # torch's own words for the loader settings the driver warned of at the start
            # (``devices.loader_setting_warnings``), which came again here, twice over
            for said in LOADER_WARNINGS_SAID_BEFORE:
                warnings.filterwarnings("ignore", message=said)
            outputs, _ = test_with_fewest_gradients(trainer, model, datamodule, ckpt_path=checkpoint, verbose=False)
        return {k: float(v) for k, v in (outputs[0] if outputs else {}).items()}
