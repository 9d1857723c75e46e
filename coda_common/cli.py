"""Shared CLI plumbing for ``coda-slurm`` and ``coda-node``.

Library code raises :class:`CliError` (or a domain error the CLI translates); only ``main()``
turns it into ``<prog>: <what> (<why>)`` on stderr and an exit code.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

_CONF_DEFAULT = "default: $CODA_CONF, else coda.conf beside $SLURM_CONF, else /etc/slurm/coda.conf"


def conf_option(reads: str | None = None, *, dest: str = "conf_path") -> Callable[[Any], Any]:
    """The ``--conf`` option every command that reads coda.conf takes; ``reads`` names the
    keys it reads (for the help text)."""
    what = f"coda.conf to read {reads} from" if reads else "coda.conf"
    return click.option(
        "--conf",
        dest,
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help=f"{what} ({_CONF_DEFAULT}).",
    )


def store_option() -> Callable[[Any], Any]:
    """``--store``: a profile store directory instead of coda.conf's ``ProfileStore=``."""
    return click.option(
        "--store",
        "store_path",
        type=click.Path(path_type=Path, file_okay=False),
        help="Profile store directory (default: ProfileStore= from coda.conf).",
    )


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that refuses NaN (every comparison with NaN is false: it passes the
    range check)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number.", param, ctx)
        return number


class CliError(click.ClickException):
    """An error the user can act on: printed as ``<prog>: <what> (<why>)``, exit code 1."""

    exit_code = 1

    def __init__(self, what: str, why: str | None = None) -> None:
        self.what = what
        self.why = why
        super().__init__(f"{what} ({why})" if why else what)


def emit_json(data: Any) -> None:
    """Print ``data`` as stable, sorted JSON on stdout."""
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def run_cli(group: click.Group, prog: str, argv: list[str] | None = None) -> int:
    """Run a click group and return its exit code instead of exiting.

    One error handler for the whole CLI: click's own usage errors keep their message,
    :class:`CliError` prints ``<prog>: <what> (<why>)``, a closed pipe is quiet.
    """
    try:
        rv = group.main(args=argv, prog_name=prog, standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.Abort:
        click.echo(f"{prog}: aborted", err=True)
        return 130
    except CliError as exc:
        click.echo(f"{prog}: {exc.format_message()}", err=True)
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except BrokenPipeError:
        # Quiet on a closed pipe (`coda-slurm profiles list | head`): point stdout at
        # /dev/null so the interpreter's final flush does not complain again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    return rv if isinstance(rv, int) else 0
