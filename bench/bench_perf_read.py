"""Cost of one per-tick counter read: perf fds through cffi vs the same number from files.

    .venv/bin/python bench/bench_perf_read.py [--rounds 300] [--batch 200]

What is read:

- perf: ``task-clock`` (PERF_TYPE_SOFTWARE) opened for this thread, so this runs on any
  machine, VMs included. A read(2) of an uncore counter is the same syscall; it only
  costs more in the kernel when the PMU sits behind PCI config space (SKX IMC).
- files: ``/proc/self/schedstat``'s first field is the nanoseconds this (main) thread has
  spent on a CPU, i.e. the very number task-clock counts, from the same scheduler
  accounting (Documentation/scheduler/sched-stats.rst). ``cpuacct.usage`` (cgroup v1) or
  ``cpu.stat`` usage_usec (v2) is the same kind of number for a whole cgroup, which is
  what a per-job sampler reads for a Slurm job today.

Every variant is timed in batches of ``--batch`` calls with time.perf_counter_ns; the
batches of all variants are interleaved round by round, so they share the machine's
state; the table shows the median over ``--rounds`` batches, per call and per counter.
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coda_node.system import perf
from coda_node.system.paths import SystemRoot

N_MANY = 8


def _cgroup_usage_file(root: SystemRoot) -> Path | None:
    """This process's cpuacct.usage (v1) or cpu.stat (v2), or None."""
    for line in root.path("/proc/self/cgroup").read_text().splitlines():
        hier, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            for mount in ("cpuacct", "cpu,cpuacct"):
                candidate = root.path(f"/sys/fs/cgroup/{mount}{path}/cpuacct.usage")
                if candidate.exists():
                    return candidate
        if hier == "0":
            candidate = root.path(f"/sys/fs/cgroup{path}/cpu.stat")
            if candidate.exists():
                return candidate
    return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--batch", type=int, default=200)
    args = parser.parse_args()

    backend = perf.default_backend()
    ffi, lib = perf._load_extension()
    one = perf.open_software("task-clock")
    many = [perf.open_software("task-clock") for _ in range(N_MANY)]
    counter_set = perf.CounterSet(many)
    fd = one.fd
    buf = ffi.new("uint64_t[3]")
    fds_c = ffi.new("int[]", [c.fd for c in many])
    out_c = ffi.new("uint64_t[]", 3 * N_MANY)
    unpack = struct.Struct("=QQQ").unpack
    del backend

    def raw_read() -> None:
        lib.coda_perf_read(fd, buf, buf + 1, buf + 2)

    def counter_read() -> None:
        one.read()

    def os_read() -> None:
        unpack(os.read(fd, 24))

    def raw_read_many() -> None:
        lib.coda_perf_read_many(N_MANY, fds_c, out_c)

    def set_read() -> None:
        counter_set.read()

    def eight_counter_reads() -> None:
        for c in many:
            c.read()

    schedstat = "/proc/self/schedstat"

    def schedstat_open_read() -> None:
        with open(schedstat, "rb") as f:
            int(f.read().split()[0])

    sched_fd = os.open(schedstat, os.O_RDONLY)

    def schedstat_pread() -> None:
        int(os.pread(sched_fd, 256, 0).split()[0])

    def eight_schedstat_open_read() -> None:
        for _ in range(N_MANY):
            schedstat_open_read()

    variants: list[tuple[str, int, Callable[[], None]]] = [
        ("(a) 1 perf counter: lib.coda_perf_read, cffi", 1, raw_read),
        ("(a') 1 perf counter: Counter.read()", 1, counter_read),
        ("(a'') 1 perf counter: os.read(fd, 24) + struct", 1, os_read),
        (f"(b) {N_MANY} perf counters: lib.coda_perf_read_many", N_MANY, raw_read_many),
        (f"(b') {N_MANY} perf counters: CounterSet.read()", N_MANY, set_read),
        (f"(b'') {N_MANY} perf counters: {N_MANY} x Counter.read()", N_MANY, eight_counter_reads),
        ("(c) /proc/self/schedstat: open+read+parse", 1, schedstat_open_read),
        ("(c') /proc/self/schedstat: pread on a kept fd", 1, schedstat_pread),
        (f"(c'') {N_MANY} x /proc/self/schedstat open+read", N_MANY, eight_schedstat_open_read),
    ]
    cgroup_file = _cgroup_usage_file(SystemRoot())
    if cgroup_file is not None:

        def cgroup_open_read() -> None:
            with open(cgroup_file, "rb") as f:
                f.read()

        variants.append((f"(c''') {cgroup_file}: open+read", 1, cgroup_open_read))

    samples: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for _ in range(args.rounds):
        for name, _, fn in variants:
            t0 = time.perf_counter_ns()
            for _ in range(args.batch):
                fn()
            samples[name].append((time.perf_counter_ns() - t0) / args.batch)

    base = statistics.median(samples[variants[0][0]])
    width = max(len(name) for name, _, _ in variants)
    lines = [
        f"{'variant':<{width}} | ns/call | ns/counter | x (a)",
        f"{'-' * width}-|--------:|-----------:|------:",
    ]
    for name, n, _ in variants:
        med = statistics.median(samples[name])
        lines.append(f"{name:<{width}} | {med:7.0f} | {med / n:10.0f} | {med / base:5.1f}")
    lines.append(
        f"{args.rounds} rounds x {args.batch} calls, medians; python {sys.version.split()[0]}, "
        f"kernel {os.uname().release}"
    )
    sys.stdout.write("\n".join(lines) + "\n")

    counter_set.close()
    one.close()
    os.close(sched_fd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
