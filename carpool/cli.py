"""The `carpool` console script: one entry point, a subcommand per component.

Subcommands are imported lazily so that `carpool operator` does not import torch and
`carpool model-server` does not import kopf.
"""

from __future__ import annotations

import importlib

import click

# subcommand name -> "module:attribute" of a click.Command
SUBCOMMANDS: dict[str, str] = {
    "model-server": "carpool.model_server.main:command",
    "sidecar": "carpool.sidecar.main:command",
    "serve": "carpool.serve:command",
    "operator": "carpool.operator.main:command",
    "render": "carpool.operator.render_cli:command",
    "bench": "carpool.loadgen.main:command",
    "infer": "carpool.infer_cli:command",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, _, attribute = target.partition(":")
        command = getattr(importlib.import_module(module_name), attribute)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup)
@click.version_option(package_name="carpool")
def main() -> None:
    """carpool: dynamic request batching for PyTorch model serving."""
