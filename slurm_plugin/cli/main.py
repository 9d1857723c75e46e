"""``coda-slurm``: controller-side admin commands."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from coda_common.cli import CliError, conf_option, emit_json, run_cli
from slurm_plugin import __version__
from slurm_plugin.cli.collect import collect_cmd
from slurm_plugin.cli.colocate import colocate_cmd
from slurm_plugin.cli.job import job_cmd
from slurm_plugin.cli.model import model
from slurm_plugin.cli.profiles import profiles
from slurm_plugin.cli.reserve import reserve_cmd
from slurm_plugin.cli.simulate import simulate_cmd
from slurm_plugin.cli.status import status
from slurm_plugin.hook.install import PluginNotBuilt, built_plugin, install_plugin


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="coda-slurm")
def cli() -> None:
    """CODA for Slurm: right-size the CPU cores of GPU jobs at submission."""


cli.add_command(model)
profiles.add_command(collect_cmd)
cli.add_command(profiles)
cli.add_command(status)
cli.add_command(simulate_cmd)
cli.add_command(colocate_cmd)
cli.add_command(reserve_cmd)
cli.add_command(job_cmd)


@cli.group()
def plugin() -> None:
    """The job_submit/coda shared object."""


@plugin.command("path")
def plugin_path() -> None:
    """Print where the built job_submit_coda shared object is."""
    try:
        click.echo(built_plugin())
    except PluginNotBuilt as exc:
        raise CliError("plugin not built", str(exc)) from exc


@plugin.command("install")
@click.option(
    "--plugin-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="A directory listed in slurm.conf's PluginDir.",
)
def plugin_install(plugin_dir: Path) -> None:
    """Install job_submit_coda.so (atomic rename; safe while slurmctld runs)."""
    try:
        dest = install_plugin(plugin_dir)
    except PluginNotBuilt as exc:
        raise CliError("plugin not built", str(exc)) from exc
    except OSError as exc:
        raise CliError(f"cannot install into {plugin_dir}", exc.strerror or str(exc)) from exc
    click.echo(f"installed {dest}; restart slurmctld to load it")


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@conf_option(dest="conf_file")
@click.option("--uid", type=int, help="Predict for this uid (default: yours).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def predict(conf_file: Path | None, uid: int | None, as_json: bool, args: tuple[str, ...]) -> None:
    """Show what job_submit/coda would do with `sbatch [OPTIONS] SCRIPT`, without submitting.

    Pass the sbatch options exactly as you would to sbatch, then the script.
    """
    from slurm_plugin.cli.predict import predict_submission

    if not args:
        raise CliError("no script given", "usage: coda-slurm predict [SBATCH OPTIONS] SCRIPT")
    result = predict_submission(list(args[:-1]), Path(args[-1]), conf_file=conf_file, uid=uid)
    if as_json:
        emit_json(result)
        return
    click.echo(f"workload:   {result['workload']}  ({result['signature']})")
    click.echo(f"GPU job:    {result['gpu_job']}")
    click.echo(f"action:     {result['action']}")
    click.echo(
        f"cpus/tres:  {result['cpus_per_tres_before'] or '-'} -> "
        f"{result['cpus_per_tres_after'] or '(unchanged)'}"
    )
    # Placement: shown only where the hook would change the field.
    for label, key in (
        ("partition", "partition"),
        ("tres/node", "tres_per_node"),
        ("prefer", "prefer"),
    ):
        after = result[f"{key}_after"]
        if after is not None:
            click.echo(f"{label + ':':<11} {result[f'{key}_before'] or '-'} -> {after}")
    click.echo(f"reason:     {result['reason']}")
    if result["user_msg"]:
        click.echo(f"sbatch says: {result['user_msg']}")


def main(argv: list[str] | None = None) -> int:
    return run_cli(cli, "coda-slurm", argv)


if __name__ == "__main__":
    sys.exit(main())
