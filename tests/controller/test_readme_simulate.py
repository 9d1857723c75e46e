"""Every ``coda-slurm simulate`` command README.md shows runs from a fresh clone.

The commands are read from the README's code blocks, so this follows the docs. Each runs as
``coda-slurm`` in an empty working folder with ``CODA_TRACE_DIR`` pointing at an empty
folder, so only what the package ships is there (no user folder, nothing beside the
checkout), and with fewer jobs than shown (``--jobs``; the replay is the same, shorter).
``sacct:FILE`` gets a small export of the documented form in the working folder. The Alibaba
trace is not shipped: its command must say where to get the trace and where to put it; the
test then puts this machine's copy there, as the printed ``curl`` commands would (tests do
not download), and runs the command again. That second half skips where no copy is
installed.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_plugin.sim.traces import SACCT_COMMAND, trace_file

README = Path(__file__).resolve().parents[2] / "README.md"
SMALL_JOBS = "150"


def readme_simulate_commands() -> list[str]:
    commands, in_block = [], False
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            in_block = not in_block
        elif in_block and line.strip().startswith("coda-slurm simulate "):
            commands.append(line.strip())
    return commands


COMMANDS = readme_simulate_commands()


def _coda_slurm() -> list[str]:
    exe = Path(sys.executable).with_name("coda-slurm")
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-m", "slurm_plugin.cli.main"]


def _write_sacct_export(path: Path) -> None:
    """60 finished jobs over two days, GPU and CPU, in the columns of ``SACCT_COMMAND``."""
    columns = SACCT_COMMAND.split("--format=")[1]
    lines = [columns.replace(",", "|")]
    for i in range(60):
        gpus = (1, 2, 4, 0)[i % 4]
        cpus = 8 * max(gpus, 1)
        tres = f"cpu={cpus},mem=64G,node=1" + (f",gres/gpu={gpus}" if gpus else "")
        day, hour = 1 + i // 30, i % 24
        submit = f"2024-03-0{day}T{hour:02d}:00:00"
        start = f"2024-03-0{day}T{hour:02d}:05:00"
        end = f"2024-03-0{day}T{hour:02d}:{35 + i % 20}:00"
        lines.append(
            f"{1000 + i}|train{i % 5}|u{i % 3}|gpu|{submit}|{start}|{end}|COMPLETED|1|{tres}|{tres}"
        )
    path.write_text("\n".join(lines) + "\n")


def _run(argv: list[str], cwd: Path, traces: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CODA_TRACE_DIR": str(traces), "MPLBACKEND": "Agg"}
    return subprocess.run(
        [*_coda_slurm(), *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def _assert_table(proc: subprocess.CompletedProcess[str], command: str) -> None:
    assert proc.returncode == 0, (command, proc.stderr[-2000:])
    lines = proc.stdout.splitlines()
    header = next((i for i, ln in enumerate(lines) if ln.startswith("policy ")), None)
    assert header is not None, (command, proc.stdout)
    assert "GPU alloc" in lines[header] and "JCT mean" in lines[header]
    assert re.match(r"(slurm|fixed|even|coda|oracle)\S*\s+\d", lines[header + 1]), proc.stdout


def test_the_readme_shows_every_shipped_trace() -> None:
    kinds = {shlex.split(c)[2].split(":")[0] for c in COMMANDS}
    assert {"sacct", "philly", "muri", "alibaba"} <= kinds, COMMANDS


@pytest.mark.parametrize("command", COMMANDS, ids=[shlex.split(c)[2] for c in COMMANDS])
def test_readme_simulate_command_runs_from_a_fresh_clone(command: str, tmp_path: Path) -> None:
    argv = shlex.split(command, comments=True)[1:]
    trace = argv[1]
    work, traces = tmp_path / "work", tmp_path / "traces"
    work.mkdir()
    traces.mkdir()
    if trace.startswith("sacct:"):
        _write_sacct_export(work / trace.split(":", 1)[1])
    else:
        argv += ["--jobs", SMALL_JOBS]
    proc = _run(argv, work, traces)
    if trace != "alibaba":
        _assert_table(proc, command)
        if "--plot" in argv:
            plots = work / argv[argv.index("--plot") + 1]
            assert any(plots.glob("*.png")), proc.stdout
        return

    # Not shipped: the command says exactly where to get it and where to put it.
    assert proc.returncode == 1, proc.stdout
    fetches = re.findall(r"curl -fLo (\S+) (https://\S+)", proc.stderr)
    assert len(fetches) == 2, proc.stderr
    for dest, url in fetches:
        assert Path(dest).parent == traces / "alibaba-gpu-v2023"
        assert url.startswith("https://raw.githubusercontent.com/alibaba/clusterdata/")
        assert url.rsplit("/", 1)[1] == Path(dest).name
    assert f"mkdir -p {traces / 'alibaba-gpu-v2023'}" in proc.stderr
    # Follow the instructions with this machine's copy instead of the network.
    copies = [trace_file(Path("alibaba-gpu-v2023") / Path(d).name) for d, _ in fetches]
    if any(c is None for c in copies):
        pytest.skip("no local copy of the Alibaba trace to stand in for the download")
    for (dest, _), copy in zip(fetches, copies, strict=True):
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(copy, dest)  # type: ignore[arg-type]
    _assert_table(_run(argv, work, traces), command)
