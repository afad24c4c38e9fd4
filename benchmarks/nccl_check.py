"""NCCL on this machine: one rank per GPU, and two ranks on one GPU.

    python benchmarks/nccl_check.py

Prints, per case, whether an all-reduce over NCCL gave the right sum, or the error NCCL
raised. The second case answers whether DDP ranks may share a GPU (Ray packs fractional
``gpus_per_worker`` requests onto one device), which only a GPU machine can tell.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_main(rank: int, world_size: int, devices: list[int], port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        torch.cuda.set_device(devices[rank])
        dist.init_process_group("nccl", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=30),
                                device_id=torch.device("cuda", devices[rank]))
        value = torch.full((4,), float(rank + 1), device="cuda")
        dist.all_reduce(value)
        torch.cuda.synchronize()
        expected = world_size * (world_size + 1) / 2
        results.put((rank, "ok" if bool((value == expected).all()) else f"wrong sum {value.tolist()}"))
        dist.destroy_process_group()
    except Exception as error:  # noqa: BLE001 - the error is the finding
        last = traceback.format_exception_only(type(error), error)[-1].strip()
        results.put((rank, f"error: {last[:300]}"))
        if dist.is_initialized():
            dist.destroy_process_group()


def run_case(devices: list[int]) -> str:
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [context.Process(target=rank_main, args=(rank, len(devices), devices, port, results))
                 for rank in range(len(devices))]
    for process in processes:
        process.start()
    deadline = time.monotonic() + 40  # one deadline for all ranks, so the step's limit holds every case
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
    outcomes = {}
    while not results.empty():
        rank, outcome = results.get()
        outcomes[rank] = outcome
    return "; ".join(f"rank {rank}: {outcomes.get(rank, 'no answer (hung or died)')}" for rank in range(len(devices)))


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA: nothing to check")
        return 0
    print(f"torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
          f"{torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}")
    cases = [("one rank, GPU 0", [0]), ("two ranks, both on GPU 0", [0, 0])]
    if torch.cuda.device_count() >= 2:
        cases.append(("two ranks, GPUs 0 and 1", [0, 1]))
    for name, devices in cases:
        print(f"{name}: {run_case(devices)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
