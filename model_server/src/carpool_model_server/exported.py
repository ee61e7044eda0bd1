"""`torch.export` packages (`.pt2`) as a function of one batched tensor.

Two kinds of package share the suffix: an `ExportedProgram` saved with `torch.export.save`,
and an AOTInductor package from `torch._inductor.aoti_compile_and_package`, compiled ahead
for one device type (its archive holds `data/aotinductor/`). A program states its input:
exactly one tensor, whose first dimension must have been exported as dynamic (a
`torch.export.Dim`), so that any batch size runs; its other dimensions are the per-item
shape, `-1` where they too are dynamic. A compiled package states nothing readable here, so
its item shape is unknown (None).
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# The program's file in a model folder (the image-classification handler's layout).
EXPORTED_FILE = "model.pt2"
_AOTI_ENTRY = "/data/aotinductor/"


@dataclass(frozen=True, slots=True)
class Exported:
    run: Callable[[torch.Tensor], torch.Tensor]
    # Per item, without the batch dimension; None for a compiled package.
    item_shape: tuple[int, ...] | None
    # The (least, most) each dimension of `item_shape` takes (most None: unbounded), and the
    # largest batch, as the program was exported (a `Dim`'s min and max); outside them it
    # fails. Empty and None for a compiled package.
    item_ranges: tuple[tuple[int, int | None], ...] = ()
    max_batch: int | None = None


def load_exported(path: Path, device: torch.device, dtype: torch.dtype) -> Exported:
    """Load `path` onto `device`; ValueError for a package that cannot serve batches."""
    if _is_compiled(path):
        runner: Any = torch._inductor.aoti_load_package(str(path))
        return Exported(_single_output(runner), None)
    from torch.export.graph_signature import InputKind
    from torch.export.passes import move_to_device_pass

    program = torch.export.load(str(path))
    names = [
        s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT
    ]
    if len(names) != 1:
        raise ValueError(f"{path} takes {len(names)} inputs; carpool serves programs of one tensor")
    (node,) = (n for n in program.graph.nodes if n.op == "placeholder" and n.name == names[0])
    example = node.meta["val"]
    if not isinstance(example.shape[0], torch.SymInt):
        raise ValueError(
            f"{path} was exported for a batch of exactly {example.shape[0]}; export it with "
            "dynamic_shapes={...: {0: torch.export.Dim('batch')}} to serve batches"
        )
    if example.dtype != dtype:
        raise ValueError(
            f"{path} takes {example.dtype}, not {dtype}: export the program in the dtype to "
            "serve, and leave --dtype at it"
        )
    shape = tuple(-1 if isinstance(d, torch.SymInt) else int(d) for d in example.shape[1:])
    ranges = [_range(program, d) for d in example.shape]
    module = move_to_device_pass(program, device).module()
    return Exported(_single_output(module), shape, tuple(ranges[1:]), ranges[0][1])


def check_max_batch(exported: Exported, path: Path, max_batch_size: int) -> None:
    """ValueError where batches of `max_batch_size` would fail in the program."""
    most = exported.max_batch
    if most is not None and max_batch_size > most:
        raise ValueError(
            f"{path} was exported for batches of at most {most}; lower --max-batch-size "
            f"{max_batch_size} to it, or export with a larger Dim('batch', max=...)"
        )


def _range(program: Any, size: int | torch.SymInt) -> tuple[int, int | None]:
    if not isinstance(size, torch.SymInt):
        return int(size), int(size)
    bounds = program.range_constraints.get(size.node.expr)
    if bounds is None:  # a size derived from others: the program checks it
        return 0, None
    return int(bounds.lower), int(bounds.upper) if bounds.upper.is_finite else None


def _is_compiled(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return any(_AOTI_ENTRY in name for name in archive.namelist())
    except zipfile.BadZipFile:
        raise ValueError(f"{path} is not a .pt2 package (not a zip archive)") from None


def _single_output(
    function: Callable[[torch.Tensor], Any],
) -> Callable[[torch.Tensor], torch.Tensor]:
    """`function`, checked to give one tensor (a compiled package gives a list of one)."""

    def run(batch: torch.Tensor) -> torch.Tensor:
        output = function(batch)
        if isinstance(output, list | tuple) and len(output) == 1:
            output = output[0]
        if not isinstance(output, torch.Tensor):
            raise TypeError(f"the exported program returned {type(output).__name__}, not a tensor")
        return output

    return run
