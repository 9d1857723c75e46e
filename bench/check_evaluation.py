"""Re-run every ``coda-slurm simulate`` command shown in docs/evaluation.md and compare.

docs/evaluation.md shows each simulator table as the exact output of the command above it
(a fenced block that starts with ``$ coda-slurm simulate ...``, or with
``$ .venv/bin/python bench/bench_shield_tradeoff.py ...``, whose sweep of those commands
also rewrites docs/shield-tradeoff.svg). This re-runs those commands
with the installed ``coda-slurm`` and says, per block, whether the output is the same. The
last line of each output (events, seconds and µs per event) is wall-clock time and is not
compared.

    .venv/bin/python bench/check_evaluation.py                 # all blocks, report only
    .venv/bin/python bench/check_evaluation.py --only muri     # blocks whose command has "muri"
    .venv/bin/python bench/check_evaluation.py --update        # write the new outputs back

``--update`` replaces only the blocks' output lines; the prose around them quotes numbers
from the tables and has to be read again by hand. Runs one command at a time (the Philly
replays take minutes each on a 2-core machine). Exit status 1 when a block differs.
"""

from __future__ import annotations

import argparse
import difflib
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "evaluation.md"
PROMPTS = ("$ coda-slurm simulate ", "$ .venv/bin/python bench/")


@dataclass(frozen=True)
class Block:
    line: int
    """1-based line of the ``$ coda-slurm ...`` command in the document."""
    command: str
    output: tuple[str, ...]
    """The lines after the command, up to the closing fence."""


def find_blocks(text: str) -> list[Block]:
    """Every fenced block whose first line is a ``coda-slurm simulate`` command."""
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("```") and i + 1 < len(lines) and lines[i + 1].startswith(PROMPTS):
            end = i + 2
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            if end == len(lines):
                raise ValueError(f"{DOC.name}:{i + 1}: block never closed")
            blocks.append(Block(i + 2, lines[i + 1][2:], tuple(lines[i + 2 : end])))
            i = end
        i += 1
    return blocks


def _comparable(lines: tuple[str, ...] | list[str]) -> list[str]:
    """The output without its timing line and trailing blanks."""
    out = [ln.rstrip() for ln in lines]
    while out and not out[-1]:
        out.pop()
    if out and " events in " in out[-1]:
        out.pop()
    return out


def run(command: str, exe: str) -> list[str]:
    argv = shlex.split(command)
    if argv[0] == "coda-slurm":
        argv[0] = exe
    else:
        argv[0] = sys.executable
        argv[1] = str(DOC.parents[1] / argv[1])
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{command!r} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return proc.stdout.rstrip("\n").splitlines()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="run blocks whose command has this")
    ap.add_argument("--update", action="store_true", help="write new outputs into the document")
    ap.add_argument("--list", action="store_true", help="list the blocks and stop")
    ap.add_argument("--exe", default=None, help="coda-slurm to run (default: beside this python)")
    args = ap.parse_args(argv)

    exe = args.exe or str(Path(sys.executable).with_name("coda-slurm"))
    if not Path(exe).exists():
        exe = shutil.which("coda-slurm") or exe
    text = DOC.read_text()
    blocks = [b for b in find_blocks(text) if all(s in b.command for s in args.only)]
    if args.list:
        for b in blocks:
            print(f"{DOC.name}:{b.line}: {b.command}")
        return 0
    new_output: dict[int, list[str]] = {}
    differ = 0
    for b in blocks:
        t0 = time.monotonic()
        got = run(b.command, exe)
        took_s = time.monotonic() - t0
        same = _comparable(got) == _comparable(b.output)
        print(f"{'same' if same else 'DIFFERS'}  {DOC.name}:{b.line} ({took_s:.0f} s): {b.command}")
        if not same:
            differ += 1
            diff = difflib.unified_diff(
                _comparable(b.output), _comparable(got), "documented", "now", lineterm="", n=0
            )
            print("\n".join("    " + d for d in diff))
            new_output[b.line] = got
        sys.stdout.flush()
    if args.update and new_output:
        lines = text.splitlines()
        # Replace from the bottom so earlier line numbers stay valid.
        for b in sorted((b for b in blocks if b.line in new_output), key=lambda b: -b.line):
            start = b.line  # index of the first output line (0-based = 1-based command line)
            lines[start : start + len(b.output)] = new_output[b.line]
        DOC.write_text("\n".join(lines) + "\n")
        print(f"updated {len(new_output)} block(s) in {DOC}")
    print(f"{len(blocks) - differ} of {len(blocks)} blocks reproduce")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
