"""Write the packaged /etc/slurm/coda.conf to stdout: every key, commented out, with its
default and its help, from the one table of keys (coda_common.config.codaconf.CONFIG_KEYS).

Run from the source tree by debian/rules (``PYTHONPATH=. python3 debian/coda-conf.py``).
The file is checked before it is written: as shipped it reads as all defaults with no
warning, and with every key uncommented it still does, so the defaults shown are the
defaults in force.
"""

from __future__ import annotations

import re
import sys
import textwrap

from coda_common.config.codaconf import CONFIG_KEYS, CodaConfig, parse_config

HEADER = """\
# coda.conf: CODA for Slurm, read by job_submit/coda inside slurmctld, by coda-slurm and
# by coda-node. Slurm's syntax (Key=Value, keys case-insensitive, # starts a comment).
# Every key below is commented out and shows its default; uncomment a line to change it.
# The reference of every key: /usr/share/doc/coda-slurm/config.md.gz on a controller.
# Changes are picked up within ReloadIntervalS, without restarting slurmctld."""


def _value(default: str) -> str:
    """The default as the file would spell it: quoted when it has blanks or a ``#``."""
    if re.search(r'[\s#"]', default):
        return '"' + default.replace('"', '\\"') + '"'
    return default


def render() -> str:
    lines = [HEADER]
    for spec in CONFIG_KEYS.values():
        lines.append("")
        help_text = f"{spec.name} ({spec.type}): {spec.help}"
        lines.extend(
            textwrap.wrap(help_text, width=88, initial_indent="# ", subsequent_indent="# ")
        )
        lines.append(f"#{spec.name}={_value(spec.default)}")
    return "\n".join(lines) + "\n"


def _check(text: str) -> None:
    defaults = CodaConfig()
    uncommented = re.sub(r"^#(?=[A-Za-z]+=)", "", text, flags=re.M)
    for name, body in (("as shipped", text), ("uncommented", uncommented)):
        cfg, warnings = parse_config(body, f"coda.conf ({name})")
        if warnings or cfg != defaults:
            raise SystemExit(
                f"debian/coda-conf.py: coda.conf {name} is not the defaults: {warnings}"
            )


def main() -> int:
    text = render()
    _check(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
