"""A small ResNet for image classification, fed the uint8 `pixels` column of runner.data's image factories.

Its first layer, ImagePreprocess, turns a batch of flattened uint8 pixels into normalised float images and, in
training mode only, applies a random crop (pad, then cut back at a random offset) and a random horizontal flip per
image: batched tensor ops on the model's device, so augmentation costs no per-sample Python and moves to the GPU with
the model. In eval mode (evaluation, export) it only normalises, so the exported model takes raw pixels.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from runner.errors import ConfigError


class ImagePreprocess(nn.Module):
    def __init__(self, channels: int, image_size: int, mean: Sequence[float], std: Sequence[float],
                 crop_padding: int = 0, flip: bool = False):
        super().__init__()
        for key, values in (("mean", mean), ("std", std)):
            if len(values) not in (1, channels):
                raise ConfigError(f"model.{key}", f"has {len(values)} values; give 1 or one per channel ({channels})")
        self.channels, self.size, self.crop_padding, self.flip = channels, image_size, crop_padding, flip
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = pixels.view(-1, self.channels, self.size, self.size).float().div_(255.0)
        if self.training:
            x = self.augment(x)
        return (x - self.mean) / self.std

    def augment(self, x: torch.Tensor) -> torch.Tensor:
        batch, size = x.shape[0], self.size
        if self.crop_padding:
            pad = self.crop_padding
            padded = F.pad(x, (pad, pad, pad, pad))
            top, left = (torch.randint(0, 2 * pad + 1, (2, batch, 1), device=x.device))
            rows = (top + torch.arange(size, device=x.device))[:, None, :, None]  # (batch, 1, size, 1)
            cols = (left + torch.arange(size, device=x.device))[:, None, None, :]  # (batch, 1, 1, size)
            images = torch.arange(batch, device=x.device)[:, None, None, None]
            channels = torch.arange(self.channels, device=x.device)[None, :, None, None]
            x = padded[images, channels, rows, cols]  # one gather: every image cut at its own offset
        if self.flip:
            mirrored = torch.rand(batch, device=x.device) < 0.5
            x = torch.where(mirrored[:, None, None, None], x.flip(-1), x)
        return x


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a shortcut (a 1x1 convolution when the shape changes)."""

    def __init__(self, in_width: int, width: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_width, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.shortcut = nn.Identity()
        if stride != 1 or in_width != width:
            self.shortcut = nn.Sequential(nn.Conv2d(in_width, width, 1, stride, bias=False), nn.BatchNorm2d(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """Preprocess -> 3x3 stem -> one stage per width (`blocks_per_stage` BasicBlocks, stride 2 from the second
    stage on) -> global average pool -> linear classifier. `forward(pixels)` returns logits (batch, num_classes)."""

    def __init__(self, num_classes: int, channels: int = 3, image_size: int = 32, widths: Sequence[int] = (32, 64, 128),
                 blocks_per_stage: int = 1, mean: Sequence[float] = (0.5,), std: Sequence[float] = (0.25,),
                 crop_padding: int = 0, flip: bool = False):
        super().__init__()
        self.preprocess = ImagePreprocess(channels, image_size, mean, std, crop_padding, flip)
        self.stem = nn.Sequential(nn.Conv2d(channels, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU())
        blocks, in_width = [], widths[0]
        for stage, width in enumerate(widths):
            for index in range(blocks_per_stage):
                blocks.append(BasicBlock(in_width, width, 2 if stage > 0 and index == 0 else 1))
                in_width = width
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(in_width, num_classes)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        features = self.blocks(self.stem(self.preprocess(pixels)))
        return self.head(features.mean(dim=(2, 3)))
