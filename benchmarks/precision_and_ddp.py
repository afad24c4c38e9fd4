"""GPU paths benchmark (issue 3): mixed-precision speed-up and DDP scaling, one table.

    python benchmarks/precision_and_ddp.py            # on a GPU machine: all rows
    python benchmarks/precision_and_ddp.py --quick    # a CPU smoke run (bf16 vs 32 on CPU)

Rows: samples/s of the built-in CNN on synthetic images for each precision on one
device (a plain Lightning Trainer), then the same through one hpsearch trial on 1 GPU
(as a search runs it: Ray Tune, hpsearch's trial set-up and telemetry) and, where the
machine has N > 1 GPUs, DDP through hpsearch's Ray Train path on N. Ratios are against
32-true of the same kind of row, and DDP's against the 1-GPU bf16-mixed trial, all
measured in the same run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import pytorch_lightning as pl
import torch

from hpsearch.models.cnn import CNNClassifier
from hpsearch.models.synthetic import SyntheticImagesDataModule


def samples_per_second(precision: str, accelerator: str, image_size: int, samples: int, channels: int,
                       cudnn_benchmark: bool = False) -> float:
    data = SyntheticImagesDataModule(num_samples=samples, image_size=image_size, channels=3, batch_size=256,
                                     pin_memory=accelerator == "gpu")
    model = CNNClassifier(input_shape=data.input_shape, num_classes=data.num_classes, channels=channels)
    trainer = pl.Trainer(accelerator=accelerator, devices=1, precision=precision, max_epochs=2, logger=False,
                         benchmark=cudnn_benchmark,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=data)  # 2 epochs warm up kernels and autotuning
    started = time.perf_counter()
    trainer.fit_loop.max_epochs = 3
    trainer.fit(model, datamodule=data)
    return int(samples * 0.7) / (time.perf_counter() - started)


def hpsearch_samples_per_second(workers: int, precision: str, image_size: int, samples: int, channels: int) -> float:
    """One trial through hpsearch (Ray Tune, its trial set-up and telemetry) on ``workers`` GPUs."""
    import hpsearch

    with tempfile.TemporaryDirectory() as storage:
        result = hpsearch.run({
            "name": f"gpu-{workers}-{precision}", "storage": storage,
            "model": {"class_path": "cnn", "init_args": {"channels": channels}},
            "data": {"class_path": "synthetic-images",
                     "init_args": {"num_samples": samples, "image_size": image_size, "batch_size": 256}},
            "space": {"model.lr": {"type": "float", "low": 1e-3, "high": 1e-3}},
            "metric": "val_acc", "mode": "max",
            "search": {"num_trials": 1, "max_concurrent": 1, "preflight": False},
            "scheduler": {"type": "none", "max_epochs": 3},
            "trainer": {"precision": precision},
            "resources": {"workers_per_trial": workers, "cpus_per_worker": 2, "gpus_per_worker": 1},
        })
        trial = result.trials[0]
        if not trial.get("samples_per_s"):
            print(f"hpsearch trial on {workers} GPU(s), {precision}: no samples/s ({trial.get('state')}: "
                  f"{trial.get('error') or trial.get('reason')})")
            return float("nan")
        return float(trial["samples_per_s"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small CPU run that checks the script works")
    parser.add_argument("--image-size", type=int, help="default: 64 on GPU, 16 on CPU")
    parser.add_argument("--channels", type=int, help="the CNN's first conv width; default: 64 on GPU, 16 on CPU")
    parser.add_argument("--samples", type=int, help="default: 20000 on GPU, 2000 on CPU")
    args = parser.parse_args()
    gpu = torch.cuda.is_available() and not args.quick
    accelerator = "gpu" if gpu else "cpu"
    size, samples, channels = (64, 20000, 64) if gpu else (16, 2000, 16)
    size, samples, channels = args.image_size or size, args.samples or samples, args.channels or channels
    print(f"the CNN ({channels}/{2 * channels}/{2 * channels} channels) on {samples} synthetic "
          f"{size}x{size} images, batch 256, 70% for training")
    rows = []
    precisions = ["32-true", "16-mixed", "bf16-mixed"] if gpu else ["32-true", "bf16-mixed"]
    base = None
    for precision in precisions:
        rate = samples_per_second(precision, accelerator, size, samples, channels)
        base = base or rate
        rows.append((f"{accelerator} {precision}", rate, rate / base))
    if gpu:  # Lightning's benchmark=True: cuDNN times its algorithms for each new input shape
        rate = samples_per_second("bf16-mixed", accelerator, size, samples, channels, cudnn_benchmark=True)
        rows.append(("gpu bf16-mixed cudnn.bench", rate, rate / base))
        base = None
        for precision in precisions:
            rate = hpsearch_samples_per_second(1, precision, size, samples, channels)
            base = base or rate
            rows.append((f"hpsearch trial 1 gpu {precision}", rate, rate / base))
            one = rate  # the last: bf16-mixed, DDP's per-GPU baseline
        if torch.cuda.device_count() > 1:
            workers = torch.cuda.device_count()
            rate = hpsearch_samples_per_second(workers, "bf16-mixed", size, samples, channels)
            rows.append((f"hpsearch ddp {workers} gpus bf16-mixed", rate, rate / one))
    print(f"{'configuration':<28}{'samples/s':>12}{'ratio':>8}")
    for name, rate, ratio in rows:
        print(f"{name:<28}{rate:>12.0f}{ratio:>8.2f}")
    print("ratios: " + ", ".join(f"{name}={ratio:.2f}x" for name, _, ratio in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
