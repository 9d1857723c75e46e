"""Write a section 1 manual page for a click command to stdout: its help, then the help of
every subcommand, as ``--help`` prints it, so the page says what the installed command says.

Run from the source tree by debian/rules::

    PYTHONPATH=. python3 debian/manpage.py slurm_plugin.cli.main:cli coda-slurm VERSION
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator

import click


def _roff(text: str) -> str:
    """``text`` safe in a roff no-fill block: backslashes escaped, and no line read as a
    request (a leading ``.`` or ``'``)."""
    lines = []
    for line in text.replace("\\", "\\e").splitlines():
        lines.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(lines)


def _context(cmd: click.Command, name: str, parent: click.Context | None) -> click.Context:
    """The context ``NAME --help`` would print in (the command's own context_settings,
    inherited ones, an 80-column page), without running anything."""
    return cmd.make_context(
        name, [], parent=parent, resilient_parsing=True, terminal_width=80, max_content_width=80
    )


def _commands(
    cmd: click.Command, ctx: click.Context
) -> Iterator[tuple[click.Command, click.Context]]:
    yield cmd, ctx
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _commands(sub, _context(sub, name, ctx))


def render(cli: click.Command, prog: str, version: str) -> str:
    root = _context(cli, prog, None)
    summary = (cli.help or "").strip().splitlines()[0].rstrip(".")
    out = [
        f'.TH {prog.upper()} 1 "" "{prog} {version}" "CODA for Slurm"',
        ".SH NAME",
        f"{prog} \\- {_roff(summary)}",
        ".SH SYNOPSIS",
        f".B {prog}",
        "[\\fIOPTIONS\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR]...",
        ".SH COMMANDS",
    ]
    for cmd, ctx in _commands(cli, root):
        with ctx:
            out += [f'.SS "{ctx.command_path}"', ".nf", _roff(cmd.get_help(ctx)), ".fi"]
    out += [
        ".SH SEE ALSO",
        "coda-slurm(1), coda-node(1), /etc/slurm/coda.conf;"
        " the admin guide and the coda.conf reference in /usr/share/doc/coda-slurm.",
    ]
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    target, prog, version = argv[1:4]
    module, _, attr = target.partition(":")
    cli = getattr(importlib.import_module(module), attr)
    sys.stdout.write(render(cli, prog, version))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
