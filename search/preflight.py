"""The preflight: one validation batch in the driver, before Ray starts.

It builds the DataModule and model exactly as a trial would (with a representative
value of every searched parameter) and runs one validation batch on the CPU. A
constructor that raises, data that cannot load, or a metric the model never logs is
then a config error reported in seconds, with no experiment directory created.
"""

from __future__ import annotations

import tempfile
import warnings
from typing import Any

from .components import build_datamodule, build_model, raised_by
from .config import CategoricalParam, ExperimentConfig, FloatParam, IntParam
from .devices import loader_options
from .errors import ConfigError
from .lightning_trainer import ctrl_c_interrupts, quiet_lightning


def representative_params(config: ExperimentConfig) -> dict[str, Any]:
    """A valid value for every searched parameter: the middle of its range, the first choice."""
    values: dict[str, Any] = {}
    for key, param in config.space.items():
        if isinstance(param, CategoricalParam):
            values[key] = param.choices[0]
        elif isinstance(param, IntParam):
            values[key] = param.low
        elif isinstance(param, FloatParam):
            values[key] = (param.low * param.high) ** 0.5 if param.log else param.low
    return values


def run_preflight(config: ExperimentConfig, model_class: type, data_class: type) -> list[str]:
    """Validate one batch; return the metrics the model logged. Raises ``ConfigError``."""
    import pytorch_lightning as pl

    params = representative_params(config)
    # The trials' own options, with no loader processes to start for one batch.
    loader = loader_options(config.loader.model_copy(update={"num_workers": 0, "pin_memory": False}),
                            config.resources, on_gpu=False)
    try:
        datamodule = build_datamodule(config, data_class, params, loader)
    except Exception as exc:
        raise ConfigError([config.problem("data.init_args", f"{data_class.__name__}(...) raised {type(exc).__name__}: {exc}")]) from None
    try:
        model = build_model(config, model_class, params, datamodule)
    except Exception as exc:
        raise ConfigError([config.problem("model.init_args", f"{model_class.__name__}(...) raised {type(exc).__name__}: {exc}")]) from None
    quiet_lightning()
    with tempfile.TemporaryDirectory(prefix="hpsearch-preflight-") as scratch, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, limit_val_batches=1,
                             default_root_dir=scratch)
        try:
            with ctrl_c_interrupts():
                trainer.validate(model, datamodule=datamodule, verbose=False)
        except Exception as exc:
            # Name the class at fault: a DataModule's setup or loader raises here too.
            field = "data.class_path" if raised_by(exc, model_class, data_class) is data_class else "model.class_path"
            raise ConfigError([config.problem(field, f"one validation batch failed: {type(exc).__name__}: {exc}")]) from None
    logged = sorted(trainer.callback_metrics)
    if config.metric not in logged:
        raise ConfigError([config.problem(
            "metric",
            f"{config.metric!r} is never logged at validation; {model_class.__name__} logs: "
            f"{', '.join(logged) or 'nothing'}",
        )])
    return logged
