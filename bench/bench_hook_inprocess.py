"""In-process cost of slurm_plugin.hook.job_submit(): hot loop vs one call every 8 ms.

Two ways to reach the hook (``--ffi``):

* ``compiled`` (default): the plugin's own cffi module (``slurm_plugin._job_submit``, built by
  setup.py) with its C helpers, called through its C entry point ``coda_py_submit`` as
  slurmctld calls it.  The few slurmctld functions the module needs (``slurm_info``,
  ``slurm_xstrdup``, ...) come from a small stand-in library compiled here with ``cc``.
* ``double``: the struct double and Python helpers of tests/test_hook.py (no compiler
  needed; its cffi FFI and Python ``coda_replace_str`` cost more than the compiled ones).

``--sections`` adds, for the cold pattern, the time of each step of a repeated GPU job
(the memo hits), timed one by one from outside the hook.

    .venv/bin/python bench/bench_hook_inprocess.py [--calls 2000] [--ffi double] [--sections]
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slurm_plugin import hook
from slurm_plugin.store import Profile, ProfileStore

# What job_submit_coda.so takes from slurmctld, for a process that is not slurmctld.
_SLURMCTLD_STANDIN = r"""
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static FILE *sink;
static void out(const char *fmt, va_list ap)
{
	if (!sink)
		sink = fopen("/dev/null", "w");
	vfprintf(sink, fmt, ap);
	fputc('\n', sink);
}
void slurm_xfree(void **item) { free(*item); *item = NULL; }
char *slurm_xstrdup(const char *s) { return s ? strdup(s) : NULL; }
void slurm_error(const char *f, ...) { va_list ap; va_start(ap, f); out(f, ap); va_end(ap); }
void slurm_info(const char *f, ...) { va_list ap; va_start(ap, f); out(f, ap); va_end(ap); }
void slurm_verbose(const char *f, ...) { va_list ap; va_start(ap, f); out(f, ap); va_end(ap); }
void slurm_debug(const char *f, ...) { va_list ap; va_start(ap, f); out(f, ap); va_end(ap); }
"""


class Harness:
    """Makes job descriptors and submits them through one of the two FFIs."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.keep: list[Any] = []
        if kind == "compiled":
            cc = shutil.which("cc")
            if cc is None:
                raise SystemExit("bench: no C compiler (cc) for --ffi compiled; use --ffi double")
            standin = tmp / "slurmctld_standin.so"
            (tmp / "standin.c").write_text(_SLURMCTLD_STANDIN)
            subprocess.run(
                [cc, "-O2", "-shared", "-fPIC", "-o", str(standin), str(tmp / "standin.c")],
                check=True,
            )
            ctypes.CDLL(str(standin), mode=os.RTLD_GLOBAL)
            try:
                from slurm_plugin._job_submit import ffi, lib
            except ImportError as exc:
                raise SystemExit(
                    f"bench: cannot load the compiled plugin module ({exc}); build it with "
                    "scripts/setup, or use --ffi double"
                ) from exc
            self.ffi, self.lib = ffi, lib
        else:
            from tests.test_hook import FakeLib, ffi

            self.ffi, self.lib = ffi, FakeLib()

    def init(self) -> int:
        if self.kind == "compiled":
            # The module's embedding init code binds the hook to this ffi/lib.
            return int(self.lib.coda_py_init())
        hook.bind(self.ffi, self.lib)
        return hook.plugin_init()

    def fini(self) -> None:
        if self.kind == "compiled":
            self.lib.coda_py_fini()
        else:
            hook.plugin_fini()

    def submit_fn(self) -> Callable[[Any, int, Any], int]:
        return self.lib.coda_py_submit if self.kind == "compiled" else hook.job_submit

    def desc(self, **strings: str) -> Any:
        ffi, lib = self.ffi, self.lib
        desc = ffi.new("job_desc_msg_t *")
        desc.cpus_per_task = lib.NO_VAL16
        desc.min_nodes = desc.max_nodes = desc.num_tasks = desc.job_id = lib.NO_VAL
        desc.ntasks_per_node = lib.NO_VAL16
        desc.user_id = 1000
        for name, value in strings.items():
            buf = ffi.new("char[]", value.encode())
            self.keep.append(buf)
            setattr(desc, name, buf)
        return desc


JOB = {
    "tres_per_job": "gres:gpu:1",
    "comment": "coda:workload=resnet50",
    "script": "#!/bin/sh\nsleep 300\n",
    "name": "job.sh",
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
    parser.add_argument("--sections", action="store_true")
    args = parser.parse_args()
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
    # The decision journal is on, as in production (a local file, flushed once a second).
    (root / "coda.conf").write_text(
        f"ProfileStore={store.root}\nHookStatsFile=\nDecisionJournal={root / 'decisions.jsonl'}\n"
    )
    (root / "slurm.conf").write_text("NodeName=g1 CPUs=32 Gres=gpu:4\n")
    os.environ["CODA_CONF"] = str(root / "coda.conf")
    assert h.init() == 1
    submit = h.submit_fn()

    def one(name: str = JOB["name"]) -> float:
        desc = h.desc(**{**JOB, "name": name})
        err = h.ffi.new("char **")
        t0 = time.perf_counter_ns()
        submit(desc, 0, err)
        elapsed = (time.perf_counter_ns() - t0) / 1000
        assert h.ffi.string(desc.cpus_per_tres) == b"gres:gpu:6"
        return elapsed

    hot = [one() for _ in range(args.calls)]
    cold = []
    for _ in range(args.calls // 10):
        evict()
        cold.append(one())
    # A job name never seen before: the memo misses and decide() runs (the first job of
    # each workload, or every job where each submission differs).
    miss = []
    for i in range(args.calls // 10):
        evict()
        miss.append(one(f"new{i}.sh"))
    steps = sections(h, args.calls // 10) if args.sections else []
    h.fini()
    q = statistics.quantiles
    out = (
        f"ffi: {args.ffi}\n"
        f"| call pattern | calls | p50 µs | p99 µs |\n|---|--:|--:|--:|\n"
        f"| back to back (hot) | {len(hot)} | {statistics.median(hot):.1f} | "
        f"{q(hot, n=100)[98]:.1f} |\n"
        f"| one every 8 ms, caches evicted (cold) | {len(cold)} | "
        f"{statistics.median(cold):.1f} | {q(cold, n=100)[98]:.1f} |\n"
        f"| one every 8 ms, caches evicted, new job name each time (cold, memo miss) | "
        f"{len(miss)} | {statistics.median(miss):.1f} | {q(miss, n=100)[98]:.1f} |\n"
    )
    if steps:
        out += "\n| step of a memo hit, cold | p50 µs |\n|---|--:|\n"
        out += "".join(f"| {name} | {us:.1f} |\n" for name, us in steps)
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
