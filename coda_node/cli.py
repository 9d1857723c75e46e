"""``coda-node``: the node-side command."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from coda_node import __version__
from coda_node.check import probe_all
from coda_node.paths import SystemRoot
from slurm_plugin.cli_common import emit_json, run_cli


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="coda-node")
def cli() -> None:
    """CODA for Slurm on a GPU node."""


@cli.command()
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/"),
    show_default=True,
    help="System root (a fixture tree in tests).",
)
@click.option("--json", "as_json", is_flag=True)
def check(root: Path, as_json: bool) -> None:
    """Which capabilities (cpusets, CPU quota, RDT, uncore PMUs, NVML) are usable here."""
    caps = probe_all(SystemRoot(root))
    if as_json:
        emit_json([c.to_dict() for c in caps])
        return
    width = max(len(c.name) for c in caps)
    for c in caps:
        state = "available" if c.available else "unavailable"
        click.echo(f"{c.name:<{width}}  {state:<11}  {c.detail}")


def main(argv: list[str] | None = None) -> int:
    return run_cli(cli, "coda-node", argv)


if __name__ == "__main__":
    sys.exit(main())
