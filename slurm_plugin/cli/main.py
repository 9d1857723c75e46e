"""``coda-slurm``: controller-side admin commands."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from coda_common.cli import CliError, conf_option, emit_json, run_cli
from slurm_plugin import __version__
from slurm_plugin.cli.collect import collect_cmd
from slurm_plugin.cli.colocate import colocate_cmd
from slurm_plugin.cli.job import job_cmd
from slurm_plugin.cli.model import model
from slurm_plugin.cli.profiles import profiles
from slurm_plugin.cli.report import report_cmd
from slurm_plugin.cli.reserve import reserve_cmd
from slurm_plugin.cli.simulate import simulate_cmd
from slurm_plugin.cli.status import status
from slurm_plugin.hook.install import PluginNotBuilt, built_plugin, install_plugin

if TYPE_CHECKING:
    from slurm_plugin.hook.guard import GuardResult


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
cli.add_command(report_cmd)


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


def _guard_options(command: Callable[..., None]) -> Callable[..., None]:
    """The inputs `plugin guard` and `plugin check` share."""
    for option in reversed(
        (
            click.option(
                "--slurm-conf",
                type=click.Path(dir_okay=False, path_type=Path),
                default=None,
                help="slurm.conf to read JobSubmitPlugins and PluginDir from "
                "(default: $SLURM_CONF, else /etc/slurm/slurm.conf).",
            ),
            click.option(
                "--slurmctld",
                type=click.Path(dir_okay=False, path_type=Path),
                default=None,
                help="The slurmctld about to start (default: the one on PATH, "
                "else /usr/sbin/slurmctld).",
            ),
            click.option(
                "--source",
                type=click.Path(file_okay=False, path_type=Path),
                default=None,
                help="Directory with build_plugin.py and the plugin's C sources (default: "
                "/usr/share/coda-slurm/plugin-src, else the checkout's csrc/).",
            ),
            click.option(
                "--passthrough",
                type=click.Path(dir_okay=False, path_type=Path),
                default=None,
                help="The passthrough plugin to install when no rebuild is possible (default: "
                "/usr/lib/coda-slurm/job_submit_coda_passthrough.so, else one beside the "
                "package, else one compiled now).",
            ),
            click.option("--json", "as_json", is_flag=True, help="Machine-readable output."),
        )
    ):
        command = option(command)
    return command


def _run_guard(change: bool, as_json: bool, **inputs: Path | None) -> GuardResult:
    from slurm_plugin.hook.guard import guard

    result = guard(change=change, **inputs)
    if as_json:
        emit_json(result.as_json())
    else:
        for line in result.lines:
            click.echo(line, err=True)
    return result


@plugin.command("guard")
@_guard_options
def plugin_guard(as_json: bool, **inputs: Path | None) -> None:
    """Make job_submit/coda loadable by the slurmctld about to start (its ExecStartPre).

    Rebuilds the plugin when it was built for another Slurm or Python and this host can
    build it; otherwise installs the passthrough (jobs are not changed by coda) and says
    what to install. Exits 0 whatever it found: slurmctld must start.
    """
    _run_guard(True, as_json, **inputs)


@plugin.command("check")
@_guard_options
def plugin_check(as_json: bool, **inputs: Path | None) -> None:
    """Say whether slurmctld will load the real job_submit/coda; change nothing.

    Exits 1 when it would not (missing, built for another Slurm or Python, or the
    passthrough).
    """
    result = _run_guard(False, as_json, **inputs)
    if not result.ok:
        raise click.exceptions.Exit(1)


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
    if result["src"]:
        click.echo(f"source:     {result['src']}")
    click.echo(
        f"cpus/tres:  {result['cpus_per_tres_before'] or '-'} -> "
        f"{result['cpus_per_tres_after'] or '(unchanged)'}"
    )
    if result["cpus_per_task_after"] is not None:
        click.echo(
            f"cpus/task:  {result['cpus_per_task_before']} -> {result['cpus_per_task_after']}"
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
