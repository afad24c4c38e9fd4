"""Class-conditional generated images of any size and count, for benchmarks and tests."""

from __future__ import annotations

import torch

from .tensor_data import InMemoryImageDataModule


class SyntheticImagesDataModule(InMemoryImageDataModule):
    """Each class is a fixed random prototype image; a sample is its prototype plus noise.

    ``noise`` sets how hard the task is (0 is trivially separable). Generation is
    deterministic in ``data_seed``, so every trial and every worker sees the same data.
    """

    def __init__(
        self,
        num_samples: int = 2048,
        image_size: int = 16,
        channels: int = 3,
        num_classes: int = 10,
        noise: float = 1.0,
        data_seed: int = 0,
        **loader_args,
    ) -> None:
        if num_samples < 3 or image_size < 1 or channels < 1 or num_classes < 2:
            raise ValueError(
                "synthetic-images needs num_samples >= 3, image_size >= 1, channels >= 1 "
                f"and num_classes >= 2 (got {num_samples}, {image_size}, {channels}, {num_classes})"
            )
        if num_classes > num_samples:  # the classes were counted from the labels drawn: fewer, unsaid (audit 48)
            raise ValueError(f"num_classes ({num_classes}) is more than num_samples ({num_samples}): "
                             "some classes would have no sample")
        self.num_samples, self.image_size, self.channels = int(num_samples), int(image_size), int(channels)
        self._num_classes, self.noise, self.data_seed = int(num_classes), float(noise), int(data_seed)
        super().__init__(**loader_args)

    def build_tensors(self):
        generator = torch.Generator().manual_seed(self.data_seed)
        shape = (self.channels, self.image_size, self.image_size)
        prototypes = torch.randn((self._num_classes, *shape), generator=generator)
        labels = torch.arange(self.num_samples) % self._num_classes
        labels = labels[torch.randperm(self.num_samples, generator=generator)]
        images = prototypes[labels] + self.noise * torch.randn((self.num_samples, *shape), generator=generator)
        return images.float(), labels.long()

    def tensor_key(self):
        return self.num_samples, self.image_size, self.channels, self._num_classes, self.noise, self.data_seed
