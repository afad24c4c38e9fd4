"""GPU-only paths: NCCL DDP, float16 autocast, pinned memory. Skipped without CUDA."""

from __future__ import annotations

import csv

import pytest
import torch

from conftest import run_cli, shrunk_example, write_yaml

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.e2e, pytest.mark.skipif(not CUDA, reason="needs CUDA")]


def search(tmp_path, **overrides) -> list[dict]:
    config = shrunk_example(tmp_path / "runs", **{"search/num_trials": 2, "scheduler/type": "none",
                                                  "scheduler/max_epochs": 2, **overrides})
    path = write_yaml(tmp_path / "exp.yaml", config)
    result = run_cli("run", str(path), cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return list(csv.DictReader((tmp_path / "runs" / config["name"] / "trials.csv").open()))


def test_fp16_autocast_and_pinned_memory_on_one_gpu(tmp_path):
    rows = search(tmp_path, **{"trainer/precision": "16-mixed",
                               "resources/gpus_per_trial": 1, "resources/cpus_per_trial": 2})
    assert {(r["device"], r["precision"], r["state"], r["pin_memory"]) for r in rows} == {
        ("gpu", "16-mixed", "COMPLETE", "True")}


def test_fractional_gpus_share_one_device(tmp_path):
    rows = search(tmp_path, **{"resources/gpus_per_trial": 0.5, "search/max_concurrent": 2})
    assert {r["device"] for r in rows} == {"gpu"}


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL DDP needs two GPUs")
def test_nccl_ddp_over_two_gpus(tmp_path):
    rows = search(tmp_path, **{"resources/workers_per_trial": 2, "resources/gpus_per_worker": 1,
                               "resources/cpus_per_worker": 1, "trainer/precision": "bf16-mixed"})
    assert {(r["world_size"], r["strategy"], r["device"]) for r in rows} == {("2", "ddp", "gpu")}


def test_batch_slots_copy_out_straight_into_pinned_memory(monkeypatch):
    """With pinning, a batch leaves its slot once, into pinned memory that the
    DataLoader's own pinning keeps as it is."""
    from torch.utils.data import DataLoader, default_collate

    from hpsearch.models._batch_slots import BatchSlots

    copied_to = []
    take = BatchSlots.take

    def recording_take(self, slot, count):
        copied_to.append(take(self, slot, count))
        return copied_to[-1]

    monkeypatch.setattr(BatchSlots, "take", recording_take)
    dataset = [torch.full((3, 4, 4), i, dtype=torch.uint8) for i in range(8)]
    slots = BatchSlots(2, 3, (4, 3, 4, 4), torch.uint8, pin_memory=True)
    batches = list(DataLoader(dataset, batch_size=4, num_workers=2, pin_memory=True, collate_fn=slots.stack))
    assert all(batch.is_pinned() for batch in batches)
    assert [b.data_ptr() for b in batches] == [b.data_ptr() for b in copied_to]  # no second copy
    assert all(torch.equal(b, default_collate(dataset[i * 4:i * 4 + 4])) for i, b in enumerate(batches))
