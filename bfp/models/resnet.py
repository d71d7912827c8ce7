"""ResNet for 32x32 inputs in the classic CIFAR layout (He et al. 2016; kuangliu/pytorch-cifar).

Module names are an interface: network configs in ``conf_net/`` address
layers as ``net.conv1``, ``net.layer2.0.shortcut.0``, ``net.linear``.
Keep ``conv1, bn1, layer1..layer4, linear`` and, in blocks, ``conv1, bn1,
conv2, bn2[, conv3, bn3], shortcut`` (``shortcut`` = ``Sequential(conv, bn)``
when the shape changes, else an empty ``Sequential``).
"""
from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from ._variant import variant


def _shortcut(in_planes: int, planes: int, stride: int) -> nn.Sequential:
    if stride == 1 and in_planes == planes:
        return nn.Sequential()
    return nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                         nn.BatchNorm2d(planes))


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = _shortcut(in_planes, planes * self.expansion, stride)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.shortcut = _shortcut(in_planes, planes * self.expansion, stride)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """``width`` is the channel count of ``layer1`` (64 in the paper); stages double it."""

    def __init__(self, block, num_blocks, num_classes: int = 10, in_channels: int = 3,
                 width: int = 64):
        super().__init__()
        self.in_planes = width
        self.conv1 = nn.Conv2d(in_channels, width, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.layer1 = self._make_layer(block, width, num_blocks[0], 1)
        self.layer2 = self._make_layer(block, 2 * width, num_blocks[1], 2)
        self.layer3 = self._make_layer(block, 4 * width, num_blocks[2], 2)
        self.layer4 = self._make_layer(block, 8 * width, num_blocks[3], 2)
        self.linear = nn.Linear(8 * width * block.expansion, num_classes)

    def _make_layer(self, block, planes, num_blocks, stride):
        layers = []
        for s in [stride] + [1] * (num_blocks - 1):
            layers.append(block(self.in_planes, planes, s))
            self.in_planes = planes * block.expansion
        return nn.Sequential(*layers)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        # 4x4 for 32x32 inputs, as the classic avg_pool2d(out, 4); adaptive for other sizes.
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


ResNet10 = variant("ResNet10", ResNet, block=BasicBlock, num_blocks=(1, 1, 1, 1))
ResNet18 = variant("ResNet18", ResNet, block=BasicBlock, num_blocks=(2, 2, 2, 2))
ResNet34 = variant("ResNet34", ResNet, block=BasicBlock, num_blocks=(3, 4, 6, 3))
ResNet50 = variant("ResNet50", ResNet, block=Bottleneck, num_blocks=(3, 4, 6, 3))
ResNet101 = variant("ResNet101", ResNet, block=Bottleneck, num_blocks=(3, 4, 23, 3))
ResNet152 = variant("ResNet152", ResNet, block=Bottleneck, num_blocks=(3, 8, 36, 3))
