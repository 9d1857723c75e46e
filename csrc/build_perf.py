"""cffi build script for ``coda_node._perf``, the perf_event_open(2) wrappers.

setup.py names this in ``cffi_modules``; it can also be built by hand::

    python csrc/build_perf.py OUTDIR

API mode, out of line: cffi compiles ``csrc/perf_event.c`` into an ordinary
extension module. The C side only makes syscalls and returns raw numbers or
``-errno``; everything else is in ``coda_node/system/perf.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import cffi

HERE = Path(__file__).resolve().parent
MODULE_NAME = "coda_node._perf"

CDEF = r"""
int coda_perf_open(uint32_t type, uint64_t config, uint64_t config1, uint64_t config2,
                   int pid, int cpu, int group_fd, int disabled, int inherit);
int coda_perf_read(int fd, uint64_t *value, uint64_t *time_enabled_ns,
                   uint64_t *time_running_ns);
int coda_perf_read_many(int n, const int *fds, uint64_t *out);
int coda_perf_enable(int fd);
int coda_perf_disable(int fd);
int coda_perf_reset(int fd);
int coda_perf_close(int fd);
"""


def make_builder() -> cffi.FFI:
    ffibuilder = cffi.FFI()
    ffibuilder.cdef(CDEF)
    ffibuilder.set_source(
        MODULE_NAME,
        (HERE / "perf_event.c").read_text(),
        extra_compile_args=["-Wall", "-Wextra", "-Wno-unused-function"],
    )
    return ffibuilder


ffibuilder = make_builder()


def main(argv: list[str]) -> int:
    out_dir = Path(argv[1]) if len(argv) > 1 else Path.cwd()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = ffibuilder.compile(tmpdir=str(out_dir), verbose=False)
    sys.stdout.write(f"{target}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
