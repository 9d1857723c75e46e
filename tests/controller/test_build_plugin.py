"""csrc/build_plugin.py: which Slurm it builds for, and a build by hand without setuptools."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parents[2]
SCRIPT = HERE / "csrc" / "build_plugin.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("coda_build_plugin", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _headers(root: Path, number: str) -> Path:
    (root / "slurm").mkdir(parents=True)
    (root / "slurm" / "slurm_version.h").write_text(
        f"#ifndef _SLURM_VERSION_H_\n#define SLURM_VERSION_NUMBER {number}\n#endif\n"
    )
    return root


@pytest.fixture(scope="module")
def build() -> ModuleType:
    if not Path("/usr/include/slurm/slurm_version.h").exists():
        pytest.skip("Slurm's headers (libslurm-dev) are not installed")
    return _module()


@pytest.mark.parametrize(
    ("number", "version", "job_id", "tested"),
    [
        ("0x160508", (22, 5, 8), "uint32_t job_id;", True),
        ("0x180b05", (24, 11, 5), "uint32_t job_id;", True),
        ("0x190b00", (25, 11, 0), "slurm_step_id_t step_id;", False),
        ("0x1a0505", (26, 5, 5), "slurm_step_id_t step_id;", True),
    ],
)
def test_the_release_decides_the_declaration_and_is_named(
    build: ModuleType, tmp_path: Path, number: str, version: tuple, job_id: str, tested: bool
) -> None:
    found = build.slurm_version((_headers(tmp_path, number),))
    assert found == version
    assert build.job_id_cdef(found) == job_id
    line = build.describe(found)
    assert f"Slurm {version[0]}.{version[1]:02d}.{version[2]}" in line
    assert ("does not cover" in line) is not tested


def test_missing_headers_say_what_to_install(build: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(build.SlurmHeadersMissing, match="libslurm-dev"):
        build.slurm_version((tmp_path,))


def test_a_build_by_hand_needs_no_setuptools(build: ModuleType, tmp_path: Path) -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    # Python 3.12+ venvs have no setuptools: the build must not import it.
    code = (
        "import sys, runpy\n"
        "sys.modules['setuptools'] = None\n"
        "sys.modules['distutils'] = None\n"
        f"sys.argv = ['build_plugin.py', {str(tmp_path)!r}]\n"
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    built = tmp_path / "job_submit_coda.so"
    assert proc.stdout.strip() == str(built)
    assert "job_submit_coda: building for Slurm" in proc.stderr
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(built)], capture_output=True, text=True
    )
    names = {line.split()[-1] for line in symbols.stdout.splitlines() if line.strip()}
    assert {"init", "fini", "job_submit", "job_modify", "plugin_version"} <= names
