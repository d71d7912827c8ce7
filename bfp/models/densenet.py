"""DenseNet-BC for 32x32 inputs (Huang et al. 2017; kuangliu/pytorch-cifar layout).

Names: ``conv1, dense1..dense4, trans1..trans3, bn, linear``; a dense block is a
``Sequential`` of ``Bottleneck(bn1, conv1, bn2, conv2)``, a transition is
``Transition(bn, conv)``.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._variant import variant


class Bottleneck(nn.Module):
    def __init__(self, in_planes: int, growth_rate: int):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, 4 * growth_rate, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(4 * growth_rate)
        self.conv2 = nn.Conv2d(4 * growth_rate, growth_rate, 3, padding=1, bias=False)

    def forward(self, x):
        out = self.conv1(F.relu(self.bn1(x)))
        out = self.conv2(F.relu(self.bn2(out)))
        return torch.cat([out, x], 1)


class Transition(nn.Module):
    def __init__(self, in_planes: int, out_planes: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(in_planes)
        self.conv = nn.Conv2d(in_planes, out_planes, 1, bias=False)

    def forward(self, x):
        return F.avg_pool2d(self.conv(F.relu(self.bn(x))), 2)


class DenseNet(nn.Module):
    def __init__(self, nblocks, growth_rate: int = 12, reduction: float = 0.5,
                 num_classes: int = 10, in_channels: int = 3):
        super().__init__()
        if not 0 < reduction <= 1:
            raise ValueError(f"DenseNet reduction must be in (0, 1], got {reduction!r}")
        self.growth_rate = growth_rate
        planes = 2 * growth_rate
        self.conv1 = nn.Conv2d(in_channels, planes, 3, padding=1, bias=False)
        for i, n in enumerate(nblocks, start=1):
            setattr(self, f"dense{i}", self._make_dense(planes, n))
            planes += n * growth_rate
            if i < len(nblocks):
                out_planes = int(math.floor(planes * reduction))
                setattr(self, f"trans{i}", Transition(planes, out_planes))
                planes = out_planes
        self.bn = nn.BatchNorm2d(planes)
        self.linear = nn.Linear(planes, num_classes)

    def _make_dense(self, planes: int, n: int) -> nn.Sequential:
        layers = []
        for _ in range(n):
            layers.append(Bottleneck(planes, self.growth_rate))
            planes += self.growth_rate
        return nn.Sequential(*layers)

    def forward(self, x):
        out = self.conv1(x)
        out = self.trans1(self.dense1(out))
        out = self.trans2(self.dense2(out))
        out = self.trans3(self.dense3(out))
        out = self.dense4(out)
        out = F.adaptive_avg_pool2d(F.relu(self.bn(out)), 1).flatten(1)
        return self.linear(out)


DenseNet121 = variant("DenseNet121", DenseNet, nblocks=(6, 12, 24, 16), growth_rate=32)
DenseNet161 = variant("DenseNet161", DenseNet, nblocks=(6, 12, 36, 24), growth_rate=48)
DenseNet169 = variant("DenseNet169", DenseNet, nblocks=(6, 12, 32, 32), growth_rate=32)
DenseNet201 = variant("DenseNet201", DenseNet, nblocks=(6, 12, 48, 32), growth_rate=32)
DenseNetCifar = variant("DenseNetCifar", DenseNet, "Small DenseNet-BC (growth 12), about 1M parameters.",
                        nblocks=(6, 12, 24, 16), growth_rate=12)
