"""The `carpool` console script: one entry point, a subcommand per installed part.

Each part names its subcommands in its own pyproject.toml (entry points of the group
`carpool.commands`), so the core knows none of them: `carpool render` exists where the
operator is installed, `carpool model-server` where the model server is. A subcommand is
imported only when it runs, so that `carpool operator` does not import torch.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

import click

GROUP = "carpool.commands"
# Where each known subcommand comes from, for the message when its part is not installed.
PARTS = {
    "sidecar": "carpool-sidecar",
    "model-server": "carpool-model-server",
    "infer": "carpool-model-server",
    "operator": "carpool-operator",
    "render": "carpool-operator",
}


def _installed() -> dict[str, EntryPoint]:
    return {point.name: point for point in entry_points(group=GROUP)}


class PartsGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_installed())

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        point = _installed().get(cmd_name)
        if point is None:
            part = PARTS.get(cmd_name)
            if part is not None:
                raise click.UsageError(
                    f"'carpool {cmd_name}' comes with {part}, which is not installed"
                )
            return None
        command = point.load()
        assert isinstance(command, click.Command), point.value
        return command


@click.group(cls=PartsGroup)
@click.version_option(package_name="carpool")
def main() -> None:
    """carpool: dynamic request batching for PyTorch model serving."""
