"""VGG with batch norm for 32x32 inputs (kuangliu/pytorch-cifar layout: ``features``, ``classifier``)."""
from __future__ import annotations

import torch.nn as nn

from ._variant import variant

CFG = {
    "VGG11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "VGG13": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "VGG16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
              512, 512, 512, "M"],
    "VGG19": [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
              512, 512, 512, 512, "M"],
}


class VGG(nn.Module):
    def __init__(self, name: str, num_classes: int = 10, in_channels: int = 3):
        super().__init__()
        layers: list[nn.Module] = []
        c = in_channels
        for v in CFG[name]:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
                c = v
        layers.append(nn.AdaptiveAvgPool2d(1))  # 1x1 already for 32x32 inputs
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(512, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


VGG11 = variant("VGG11", VGG, name="VGG11")
VGG13 = variant("VGG13", VGG, name="VGG13")
VGG16 = variant("VGG16", VGG, name="VGG16")
VGG19 = variant("VGG19", VGG, name="VGG19")
