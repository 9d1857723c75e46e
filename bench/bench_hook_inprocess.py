"""In-process cost of job_submit/coda's job_submit(): hot loop vs one call every 8 ms.

Two ways to reach the hook (``--ffi``):

* ``compiled`` (default): the plugin's own cffi module (``slurm_plugin._job_submit``, built by
  setup.py), started with its ``init()`` and called through its ``job_submit()`` as slurmctld
  calls them.  The few slurmctld functions the module needs (``slurm_info``,
  ``slurm_xstrdup``, ...) come from a small stand-in library (tests/controller/compiled_hook.py,
  compiled with ``cc``).
* ``double``: the struct double and Python helpers of tests/controller/test_hook.py (no compiler
  needed; its cffi FFI and Python ``coda_replace_str`` cost more than the compiled ones).

``--sections`` adds, for the cold pattern, the time of each step of a repeated GPU job
(the memo hits, in Python), timed one by one from outside the hook.

``--job cpu`` submits a CPU-only job (``-c 12``, a workload measured at 5 GB/s per CPU)
instead, with ``MemBwSpreadGres`` off (the hook stops after the four GPU request fields)
and on: what the spread costs each CPU job.

    .venv/bin/python bench/bench_hook_inprocess.py [--calls 2000] [--rounds 2] [--ffi double]
        [--sections] [--job gpu|cpu]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coda_common.store.profiles import CpuUsageRecord, Profile, ProfileStore
from slurm_plugin.hook import submit as hook
from tests.controller import compiled_hook


class Harness:
    """Makes job descriptors and submits them through one of the two FFIs."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        if kind == "compiled":
            try:
                self.ffi, self.lib = compiled_hook.load(tmp / "standin")
            except compiled_hook.Unavailable as exc:
                raise SystemExit(
                    f"bench: {exc}; build it with scripts/setup, or use --ffi double"
                ) from exc
        else:
            from tests.controller.test_hook import FakeLib, ffi

            self.ffi, self.lib = ffi, FakeLib()

    def init(self) -> int:
        if self.kind == "compiled":
            compiled_hook.start(self.ffi, self.lib)  # raises if the plugin did not start
            return 1
        hook.bind(self.ffi, self.lib)
        return hook.plugin_init()

    def fini(self) -> None:
        if self.kind == "compiled":
            self.lib.fini()
        else:
            hook.plugin_fini()

    def submit_fn(self) -> Callable[[Any, int, Any], int]:
        return self.lib.job_submit if self.kind == "compiled" else hook.job_submit

    def desc(self, **strings: str) -> Any:
        if self.kind == "compiled":  # strings from the stand-in's allocator, as slurmctld's
            return compiled_hook.new_desc(self.ffi, self.lib, **strings)
        from tests.controller.test_hook import make_desc

        return make_desc(self.lib, **strings)


JOB = {
    "tres_per_job": "gres:gpu:1",
    "comment": "coda:workload=resnet50",
    "script": "#!/bin/sh\nsleep 300\n",
    "name": "job.sh",
}
CPU_JOB = {
    "comment": "coda:workload=stream",
    "script": "#!/bin/sh\n./stream\n",
    "name": "stream.sh",
    "cpus_per_task": 12,
}
CPU_CONFIGS = {
    "off": "",
    "on": "MemBwSpreadGres=membw\n",
}


def evict() -> None:
    junk = bytearray(8_000_000)  # evict caches, as slurmctld's own work does
    sum(junk[::4096])
    time.sleep(0.008)


def sections(h: Harness, n: int) -> list[tuple[str, float]]:
    """Median cold time of each step of a memo hit, timed one by one (µs)."""
    state = hook.current_state()
    assert state is not None and state.journal is not None
    pc = time.perf_counter_ns
    names = [
        "two clock reads (perf_counter_ns, time)",
        "read the 4 GPU request fields",
        "read the other decision fields (_read_key)",
        "snapshot + memo lookup",
        "write job_desc + user message (_apply)",
        "log line (coda_log)",
        "journal append",
        "in-hook duration record",
    ]
    if h.kind == "compiled":
        names.append("C -> Python call, empty body (coda_py_modify, no comment)")
    rows: list[list[int]] = []
    submit = h.submit_fn()
    submit(h.desc(**JOB), 0, h.ffi.new("char **"))  # the memo holds this job now
    for _ in range(n):
        desc = h.desc(**JOB)
        empty = h.desc()
        err = h.ffi.new("char **")
        evict()
        t = [pc()]
        t0 = hook._perf_ns()
        now = hook._time_s()
        t.append(pc())
        gpu = (desc.tres_per_node, desc.tres_per_job, desc.tres_per_task, desc.tres_per_socket)
        t.append(pc())
        key = hook._read_key(desc, 0, *gpu)
        t.append(pc())
        profiles = state.cache.snapshot()
        plan = state.memo.plans[key] if state.memo.profiles is profiles else None
        t.append(pc())
        assert plan is not None, "the repeated job missed the memo"
        hook._apply(desc, plan, err)
        t.append(pc())
        h.lib.coda_log(plan.log_level, plan.log_line)
        t.append(pc())
        state.journal.record(
            (now, 0, plan.uid, plan.job_name, 0, 0, "set", None, pc() - t0, False, None)
        )
        t.append(pc())
        state.stats.record(1)
        t.append(pc())
        if h.kind == "compiled":
            h.lib.coda_py_modify(empty, 0, err)
            t.append(pc())
        rows.append([b - a for a, b in itertools.pairwise(t)])
    return [(name, statistics.median(r[i] for r in rows) / 1000) for i, name in enumerate(names)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--profiles", type=int, default=10_000)
    parser.add_argument("--ffi", choices=("compiled", "double"), default="compiled")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sections", action="store_true")
    parser.add_argument("--job", choices=("gpu", "cpu"), default="gpu")
    args = parser.parse_args()
    cpu = args.job == "cpu"
    root = Path(tempfile.mkdtemp(prefix="coda-bench-"))
    h = Harness(args.ffi, root)
    store = ProfileStore(root / "profiles")
    store.ensure_root()
    now = time.time()
    for i in range(args.profiles):
        name = "resnet50" if i == 0 else f"w{i}"
        store.write(
            Profile(
                signature=f"workload:*:{name}",
                workload=name,
                cpus_per_gpu=6,
                confidence=0.95,
                n_samples=8,
                updated_unix_s=now,
                source="bench",
            )
        )
    store.merge_cpu_usage("workload:*:stream", CpuUsageRecord(5e9, 100, now))
    (root / "slurm.conf").write_text(
        "NodeName=g1 CPUs=32 Gres=gpu:4,membw:200\nPartitionName=p Nodes=g1 Default=YES\n"
    )
    os.environ["CODA_CONF"] = str(root / "coda.conf")
    # GPU jobs: the hook as --ffi reaches it; CPU-only jobs: the spread off and on.
    configs = list(CPU_CONFIGS) if cpu else [args.ffi]
    samples: dict[tuple[str, str], list[float]] = {}
    round_p50: dict[tuple[str, str], list[float]] = {}
    steps: list[tuple[str, float]] = []
    for rnd in range(args.rounds):
        for config in configs:
            # The decision journal is on, as in production (a local file, flushed once a
            # second).
            extra = CPU_CONFIGS[config] if cpu else ""
            (root / "coda.conf").write_text(
                f"ProfileStore={store.root}\nHookStatsFile=\n"
                f"DecisionJournal={root / 'decisions.jsonl'}\n" + extra
            )
            assert h.init() == 1
            job, check = JOB, _gpu_check
            if cpu:
                job, check = CPU_JOB, (_membw_check if config != "off" else _untouched_check)
            for pattern, times in measure(h, args.calls, f"r{rnd}", job, check).items():
                samples.setdefault((config, pattern), []).extend(times)
                round_p50.setdefault((config, pattern), []).append(statistics.median(times))
            if args.sections and not cpu and not steps:
                steps = sections(h, args.calls // 10)
            h.fini()
    q = statistics.quantiles
    out = f"ffi: {args.ffi}, {args.rounds} rounds\n"
    first = "MemBwSpreadGres (CPU-only job)" if cpu else "hook reached through"
    out += f"| {first} | call pattern | calls | p50 µs | p99 µs | p50 of each round |\n"
    out += "|---|---|--:|--:|--:|---|\n"
    for (config, pattern), times in samples.items():
        rounds = ", ".join(f"{v:.1f}" for v in round_p50[(config, pattern)])
        out += (
            f"| {config} | {pattern} | {len(times)} | {statistics.median(times):.1f} | "
            f"{q(times, n=100)[98]:.1f} | {rounds} |\n"
        )
    if steps:
        out += "\n| step of a memo hit in Python, cold | p50 µs |\n|---|--:|\n"
        out += "".join(f"| {name} | {us:.1f} |\n" for name, us in steps)
    sys.stdout.write(out)
    return 0


def _gpu_check(h: Harness, desc: Any) -> bool:
    return h.ffi.string(desc.cpus_per_tres) == b"gres:gpu:6"


def _membw_check(h: Harness, desc: Any) -> bool:
    return h.ffi.string(desc.tres_per_node) == b"gres:membw:60"


def _untouched_check(h: Harness, desc: Any) -> bool:
    return desc.tres_per_node == h.ffi.NULL and desc.admin_comment == h.ffi.NULL


def measure(
    h: Harness,
    calls: int,
    tag: str,
    job: dict[str, Any],
    check: Callable[[Harness, Any], bool],
) -> dict[str, list[float]]:
    """µs per call: back to back, cold, and cold with a name never seen (memo miss)."""
    submit = h.submit_fn()

    def one(name: str = job["name"]) -> float:
        desc = h.desc(**{**job, "name": name})
        err = h.ffi.new("char **")
        t0 = time.perf_counter_ns()
        submit(desc, 0, err)
        elapsed = (time.perf_counter_ns() - t0) / 1000
        assert check(h, desc), "the hook did not do what this job should get"
        return elapsed

    hot = [one() for _ in range(calls)]
    cold = []
    for _ in range(calls // 10):
        evict()
        cold.append(one())
    # A job name never seen before: the memo misses and decide() runs (the first job of
    # each workload, or every job where each submission differs).
    miss = []
    for i in range(calls // 10):
        evict()
        miss.append(one(f"new-{tag}-{i}.sh"))
    return {
        "back to back (hot)": hot,
        "one every 8 ms, caches evicted (cold)": cold,
        "cold, new job name each time (memo miss)": miss,
    }


if __name__ == "__main__":
    raise SystemExit(main())
