"""Lightning strategies whose ranks and devices come from Ray Train (``pytorch_lightning`` only).

Ray Train has already created the processes and the torch process group (gloo on
CPU, NCCL on GPU); Lightning sees that the group exists and joins it as is.
"""

from __future__ import annotations

from typing import Any

import ray.train
import ray.train.torch
import torch
from pytorch_lightning.plugins.environments import LightningEnvironment
from pytorch_lightning.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy


class RayTrainEnvironment(LightningEnvironment):
    """World size and ranks as Ray Train assigned them; Lightning must not reassign them."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    def world_size(self) -> int:
        return ray.train.get_context().get_world_size()

    def global_rank(self) -> int:
        return ray.train.get_context().get_world_rank()

    def local_rank(self) -> int:
        return ray.train.get_context().get_local_rank()

    def node_rank(self) -> int:
        return ray.train.get_context().get_node_rank()

    def set_world_size(self, size: int) -> None:
        pass

    def set_global_rank(self, rank: int) -> None:
        pass

    def teardown(self) -> None:
        pass


class _RayDevice:
    """The device Ray Train gave this rank, and a sampler that shards by Ray's ranks."""

    @property
    def root_device(self) -> torch.device:
        return ray.train.torch.get_device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}


class RayDDPStrategy(_RayDevice, DDPStrategy):
    pass


class RayFSDPStrategy(_RayDevice, FSDPStrategy):
    pass


class RayDeepSpeedStrategy(_RayDevice, DeepSpeedStrategy):
    pass
