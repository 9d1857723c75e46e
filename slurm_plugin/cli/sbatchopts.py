"""Turn sbatch options and a batch script into the job_desc fields the hook reads.

Used by ``coda-slurm predict`` to show what job_submit/coda would do without
submitting. The mapping mirrors what sbatch sends (measured on a real slurmctld):
``--gpus-per-node``/``--gres=gpu`` -> ``tres_per_node``, ``--gpus`` -> ``tres_per_job``,
``--gpus-per-task`` -> ``tres_per_task``, ``--cpus-per-gpu`` -> ``cpus_per_tres``, in the
spelling of the installed Slurm: ``gres:gpu:2`` up to 23.02, ``gres/gpu:2`` from 23.11 on,
where ``tres_per_task`` is ``gres/gpu=1`` and also carries ``-c`` as ``cpu=N``
(:func:`local_gres_separator`). Only the options that matter to the decision are read; any
other option must be written ``--name=value`` (or be a flag) so it can be skipped safely.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import replace
from functools import cache

from slurm_plugin.decision.decide import JobRequest

NO_VAL = 0xFFFFFFFE
NO_VAL16 = 0xFFFE

# Short options sbatch (22.05) knows, by long name. The ones that take a value are those
# whose long name is in _TAKES_VALUE; the rest (-H, -k, -O, -Q, -s, -v, -W) are flags.
_SHORT = {
    "-a": "--array",
    "-A": "--account",
    "-b": "--begin",
    "-B": "--extra-node-info",
    "-c": "--cpus-per-task",
    "-C": "--constraint",
    "-d": "--dependency",
    "-D": "--chdir",
    "-e": "--error",
    "-F": "--nodefile",
    "-G": "--gpus",
    "-H": "--hold",
    "-i": "--input",
    "-J": "--job-name",
    "-k": "--no-kill",
    "-L": "--licenses",
    "-m": "--distribution",
    "-M": "--clusters",
    "-n": "--ntasks",
    "-N": "--nodes",
    "-o": "--output",
    "-O": "--overcommit",
    "-p": "--partition",
    "-q": "--qos",
    "-Q": "--quiet",
    "-s": "--oversubscribe",
    "-S": "--core-spec",
    "-t": "--time",
    "-v": "--verbose",
    "-w": "--nodelist",
    "-W": "--wait",
    "-x": "--exclude",
}
# Long options whose value may follow as the next argument (``--time 60``): every sbatch
# option with a required value (``sbatch --help`` of Slurm 22.05, plus --prefer, new in
# 22.05 and missing from its --help). Options with an optional value (--export, --nice,
# --propagate, --exclusive, --wrap) take it only as ``--opt=value``, as in sbatch (getopt).
_TAKES_VALUE = frozenset(
    {
        "--account", "--acctg-freq", "--array", "--batch", "--bb", "--bbf", "--begin",
        "--chdir", "--cluster-constraint", "--clusters", "--comment", "--constraint",
        "--container", "--core-spec", "--cores-per-socket", "--cpu-freq", "--cpus-per-gpu",
        "--cpus-per-task", "--deadline", "--delay-boot", "--dependency", "--distribution",
        "--error", "--exclude", "--export-file", "--extra-node-info", "--gid", "--gpu-bind",
        "--gpu-freq", "--gpus", "--gpus-per-node", "--gpus-per-socket", "--gpus-per-task",
        "--gres", "--gres-flags", "--hint", "--input", "--job-name", "--licenses",
        "--mail-type", "--mail-user", "--mcs-label", "--mem", "--mem-bind", "--mem-per-cpu",
        "--mem-per-gpu", "--mincpus", "--network", "--nodefile", "--nodelist", "--nodes",
        "--ntasks", "--ntasks-per-core", "--ntasks-per-gpu", "--ntasks-per-node",
        "--ntasks-per-socket", "--open-mode", "--output", "--partition", "--power",
        "--prefer", "--priority", "--profile", "--qos", "--reservation", "--signal",
        "--sockets-per-node", "--switches", "--thread-spec", "--threads-per-core", "--time",
        "--time-min", "--tmp", "--uid", "--wckey",
    }
)  # fmt: skip
# The options this tool reads; the others are parsed (to find the script) and ignored.
_KNOWN = {
    "--gpus",
    "--gpus-per-node",
    "--gpus-per-task",
    "--gpus-per-socket",
    "--gres",
    "--cpus-per-gpu",
    "--cpus-per-task",
    "--nodes",
    "--ntasks",
    "--ntasks-per-node",
    "--job-name",
    "--partition",
    "--comment",
    "--prefer",
}
# sbatch stops reading #SBATCH lines at the first command (not comment, not blank).
_SBATCH_LINE = re.compile(r"^#SBATCH\s+(.*)$")


class SbatchOptionError(ValueError):
    """An option this tool needs to read has a missing or unparsable value."""


SLASH_RELEASE = (23, 11)
"""From this Slurm release on, sbatch spells a GRES ``gres/gpu`` (before: ``gres:gpu``)."""


def gres_separator_of(version_text: str) -> str:
    """The GRES separator of the Slurm that printed ``version_text`` (``slurm 24.11.5``,
    ``slurm-wlm 22.05.8``); ``"/"``, the current spelling, when it cannot be read."""
    m = re.search(r"(\d+)\.(\d+)", version_text)
    if m is None:
        return "/"
    return "/" if (int(m.group(1)), int(m.group(2))) >= SLASH_RELEASE else ":"


@cache
def local_gres_separator() -> str:
    """How this host's Slurm spells a GRES: from ``slurmctld -V`` (a controller), else
    ``sbatch --version`` (a configured client); the current spelling when neither answers."""
    for argv in (["slurmctld", "-V"], ["sbatch", "--version"]):
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            continue
        if proc.returncode == 0 and re.search(r"\d+\.\d+", proc.stdout):
            return gres_separator_of(proc.stdout)
    return "/"


def _tres(value: str, sep: str) -> str:
    """``a100:2`` / ``2`` / ``gpu:2,shard:1`` -> Slurm's ``gres<sep>gpu...`` list."""
    items = []
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        items.append(item if item.startswith(("gres:", "gres/")) else f"gres{sep}{item}")
    return ",".join(items)


def _gpu_tres(value: str, sep: str) -> str:
    # --gpus=2 and --gpus=a100:2 name the GPU implicitly.
    if value.startswith(("gpu", "gres:", "gres/")):
        return _tres(value, sep)
    return f"gres{sep}gpu:{value}"


def _task_tres(value: str, sep: str) -> str:
    # From 23.11 on, --gpus-per-task=1 arrives as gres/gpu=1 (the count after "=").
    tres = _gpu_tres(value, sep)
    head, _, count = tres.rpartition(":")
    return f"{head}={count}" if sep == "/" and head and count.isdigit() else tres


_STRTOL = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+")
"""A whole number as sbatch's strtol reads one: ASCII digits after optional blanks and sign."""
_INT_MAX = 2**31 - 1


def _int(option: str, value: str) -> int:
    if _STRTOL.fullmatch(value) is None:
        raise SbatchOptionError(f"{option}={value!r} is not a whole number")
    try:
        n = int(value)
    except ValueError:  # more digits than int() reads
        n = _INT_MAX + 1
    if n > _INT_MAX:
        raise SbatchOptionError(f"{option}={value[:30]!r} is more than {_INT_MAX}")
    if n < 0:
        raise SbatchOptionError(f"{option}={value!r} is negative")
    return n


def split_options(argv: list[str]) -> list[tuple[str, str | None]]:
    """``['-N', '2', '--gpus=1', '--exclusive']`` -> [('--nodes','2'), ('--gpus','1'), ...]."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if eq:
                out.append((name, value))
            elif name in _TAKES_VALUE:
                if i >= len(argv):
                    raise SbatchOptionError(f"{name} needs a value")
                out.append((name, argv[i]))
                i += 1
            else:
                out.append((name, None))
        elif arg.startswith("-") and len(arg) >= 2:
            # Short options run together as getopt reads them: flags (-vQ), then at most
            # one option with a value, attached (-vt60) or as the next argument (-vt 60).
            for j in range(1, len(arg)):
                short = f"-{arg[j]}"
                long = _SHORT.get(short)
                if long is None:
                    raise SbatchOptionError(f"sbatch has no option {short} (in {arg!r})")
                if long not in _TAKES_VALUE:
                    out.append((long, None))
                    continue
                rest = arg[j + 1 :]
                if rest:
                    out.append((long, rest.lstrip("=")))
                else:
                    if i >= len(argv):
                        raise SbatchOptionError(f"{short} needs a value")
                    out.append((long, argv[i]))
                    i += 1
                break
        else:
            raise SbatchOptionError(f"unexpected argument {arg!r} (the script comes last)")
    return out


def script_options(script: str) -> list[str]:
    """The arguments of the leading ``#SBATCH`` lines, split as sbatch splits them."""
    args: list[str] = []
    for n, line in enumerate(script.splitlines()):
        stripped = line.strip()
        if n == 0 and stripped.startswith("#!"):
            continue
        m = _SBATCH_LINE.match(stripped)
        if m:
            args.extend(_sbatch_words(m.group(1), n + 1))
            continue
        if stripped and not stripped.startswith("#"):
            break
    return args


_C_SPACE = frozenset(" \t\n\v\f\r")
"""What C's isspace() takes for a blank (sbatch splits on these, not on Unicode spaces)."""


def _sbatch_words(text: str, line_no: int) -> list[str]:
    """The words of one ``#SBATCH`` line as sbatch reads them: blanks separate words outside
    single or double quotes, the quotes are dropped, a backslash takes the next character as
    it is, and an unquoted ``#`` ends the line. SbatchOptionError for an unmatched quote
    (sbatch refuses the script)."""
    words: list[str] = []
    word: list[str] | None = None
    quote: str | None = None
    escaped = False
    for c in text:
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
            word = word if word is not None else []
            continue
        elif quote is not None:
            if c == quote:
                quote = None
                continue
        elif c in "\"'":
            quote = c
            word = word if word is not None else []
            continue
        elif c == "#":
            break
        elif c in _C_SPACE:
            if word is not None:
                if not word:  # sbatch reads no more of the line after an empty word ("")
                    return words
                words.append("".join(word))
                word = None
            continue
        word = word if word is not None else []
        word.append(c)
    if quote is not None:
        raise SbatchOptionError(f"unmatched {quote} in #SBATCH line {line_no}")
    if word:
        words.append("".join(word))
    return words


def request_from_sbatch(
    argv: list[str], script: str, *, uid: int | None = None, sep: str = ":"
) -> JobRequest:
    """Build the JobRequest sbatch would send for ``sbatch ARGV SCRIPT``; ``sep`` is the
    GRES separator of the Slurm to mirror (:func:`local_gres_separator`)."""
    req = JobRequest(
        uid=os.getuid() if uid is None else uid,
        job_name=None,
        partition=None,
        tres_per_node=None,
        tres_per_job=None,
        tres_per_task=None,
        tres_per_socket=None,
        cpus_per_tres=None,
        cpus_per_task=NO_VAL16,
        min_nodes=NO_VAL,
        max_nodes=NO_VAL,
        num_tasks=NO_VAL,
        ntasks_per_node=NO_VAL16,
        comment=None,
        script=script,
    )
    # Command line after the script's own lines: the command line wins.
    for name, value in split_options(script_options(script)) + split_options(argv):
        if name not in _KNOWN:
            continue
        if value is None:
            raise SbatchOptionError(f"{name} needs a value")
        req = _with_option(req, name, value, sep)
    if sep == "/" and req.cpus_per_task != NO_VAL16:
        # sbatch from 23.11 on puts -c into tres_per_task too, first.
        task = f"cpu={req.cpus_per_task}"
        req = replace(
            req, tres_per_task=f"{task},{req.tres_per_task}" if req.tres_per_task else task
        )
    return req


def _with_option(req: JobRequest, name: str, value: str, sep: str) -> JobRequest:
    """``req`` with sbatch option ``name`` (one of the known ones) set to ``value``."""
    if name == "--gpus":
        return replace(req, tres_per_job=_gpu_tres(value, sep))
    if name == "--gpus-per-node":
        return replace(req, tres_per_node=_gpu_tres(value, sep))
    if name == "--gres":
        return replace(req, tres_per_node=_tres(value, sep))
    if name == "--gpus-per-task":
        return replace(req, tres_per_task=_task_tres(value, sep))
    if name == "--gpus-per-socket":
        return replace(req, tres_per_socket=_gpu_tres(value, sep))
    if name == "--cpus-per-gpu":
        return replace(req, cpus_per_tres=f"gres{sep}gpu:{_int(name, value)}")
    if name == "--cpus-per-task":
        return replace(req, cpus_per_task=_int(name, value))
    if name == "--nodes":
        lo, _, hi = value.partition("-")
        return replace(req, min_nodes=_int(name, lo), max_nodes=_int(name, hi or lo))
    if name == "--ntasks":
        return replace(req, num_tasks=_int(name, value))
    if name == "--ntasks-per-node":
        return replace(req, ntasks_per_node=_int(name, value))
    if name == "--job-name":
        return replace(req, job_name=value)
    if name == "--partition":
        return replace(req, partition=value)
    if name == "--comment":
        return replace(req, comment=value)
    if name == "--prefer":
        return replace(req, prefer=value)
    return req
