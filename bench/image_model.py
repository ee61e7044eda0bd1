"""A ResNet-18-shaped image classifier with random weights, for `compare.py --model resnet18`.

Built from a transformers config with a fixed seed and saved as a user's folder would be
(`save_pretrained`), so every variant loads the same network through the
image-classification handler; nothing is downloaded. Random weights cost what trained ones
do: the benchmark measures time, not labels.
"""

from __future__ import annotations

from pathlib import Path

import torch

# ResNet-18: basic blocks, two per stage, 64 to 512 channels, 1000 ImageNet classes.
RESNET18 = {
    "embedding_size": 64,
    "hidden_sizes": [64, 128, 256, 512],
    "depths": [2, 2, 2, 2],
    "layer_type": "basic",
    "downsample_in_first_stage": False,
    "num_labels": 1000,
}
# Each item: pixels prepared as the model takes them (input=fp32), 3 x 224 x 224.
ITEM_SHAPE = (3, 224, 224)


def resnet18(folder: Path, seed: int = 0) -> Path:
    """The model's folder, built on first use."""
    if (folder / "config.json").is_file():
        return folder
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(seed)
    ResNetForImageClassification(ResNetConfig(**RESNET18)).save_pretrained(folder)
    return folder
