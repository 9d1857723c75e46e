"""Where a never-seen GPU job's time goes in job_submit/coda's Python path, cold.

Loads the plugin's compiled cffi module in process as ``bench/bench_hook_inprocess.py``
does (tests/controller/compiled_hook.py; 10,000 profiles, journal on) and
submits ``resnet50`` jobs (``--gpus=1``, ``--comment=coda:workload=resnet50``), each with
a job name never used before, so every one misses the decision memo and is decided.
Before each timed call the caches are evicted and the process sleeps 8 ms, as slurmctld's
own work between submissions does.  Three tables:

1. **entry**: the plugin's C ``job_submit()`` (never-seen job) and ``coda_py_modify()``
   (an empty update: the Python side of ``job_modify()``, whose body does nothing) called
   from C, once from a fresh native thread (slurmctld 22.05 serves every RPC on a thread
   of its own, so Python makes and drops a thread state per call) and once from a thread
   that already has one.  The fresh-thread rows run twice, alternately: with the arena
   allocator the plugin installs (freed stack chunks kept for the next thread,
   job_submit_coda.c, "coda_arena") and with the one Python had before (each thread's
   stack chunk mmap'd and munmap'd).  The calling shim is compiled with ``cc``.
2. **stages**: the steps of ``slurm_plugin/hook/submit.py:job_submit`` for that job, and
   of ``decide()`` inside it, run in the hook's order and timed in sequence (one eviction
   per job, so each step pays the misses left after the steps before it; the timer adds
   about 1 µs a step).  The decision is checked against ``decide()``'s own.
3. **lean**: the hook's Python ``job_submit`` next to a minimal Python path that handles
   only this job's form (one ``gres:gpu:N`` request, a ``coda:workload=`` comment, a
   confident shared profile) and writes the same fields: what Python costs with nothing
   but the work this job needs.  Both without the C -> Python entry of table 1.

    .venv/bin/python bench/bench_hook_stages.py [--calls 300]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_hook_inprocess import JOB, Harness, evict

from coda_common.signature import quote_label, workload_signature
from coda_common.store.profiles import Profile, ProfileStore
from slurm_plugin.decision import decide as D
from slurm_plugin.hook import submit as hook
from slurm_plugin.hook.journal import pending_entry

SHIM_C = r"""
#include <pthread.h>
#include <stdint.h>
#include <time.h>
typedef int (*fn_t)(void *, uint32_t, char **);
struct call { fn_t fn; void *desc; char **err; int64_t ns; };
static int64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t) t.tv_sec * 1000000000 + t.tv_nsec;
}
static void *run(void *p)
{
	struct call *c = p;
	int64_t t0 = now_ns();
	c->fn(c->desc, 0, c->err);
	c->ns = now_ns() - t0;
	return NULL;
}
long long call_in_new_thread(void *fn, void *desc, char **err)
{
	struct call c = { (fn_t) fn, desc, err, 0 };
	pthread_t t;
	if (pthread_create(&t, NULL, run, &c))
		return -1;
	pthread_join(t, NULL);
	return c.ns;
}
long long call_here(void *fn, void *desc, char **err)
{
	struct call c = { (fn_t) fn, desc, err, 0 };
	run(&c);
	return c.ns;
}
"""

STAGES = (
    "clock reads, call counter",
    "read the 4 GPU request fields",
    "_read_key: 12 more fields (cffi reads, ffi.string)",
    "profile snapshot + memo lookup (miss)",
    "_request_from_key: decode into a JobRequest",
    "decide: _admit (TRES parse, cpus_per_tres, partition, directives)",
    "decide: nodes, tasks, GPUs per node, user values",
    "decide: workload_signature",
    "decide: _lookup (profile)",
    "decide: _placement",
    "decide: node cap + _prediction",
    "decide: _Job, _Choice, _finish (admin record, log line, message)",
    "make_plan (encode every field)",
    "memo.add",
    "decision token (coda_next_token)",
    "_apply (job_desc writes, user message)",
    "log line (coda_log)",
    "stats + journal entry",
)


class ArenaAllocator(ctypes.Structure):
    """CPython's ``PyObjectArenaAllocator``."""

    _fields_ = (("ctx", ctypes.c_void_p), ("alloc", ctypes.c_void_p), ("free", ctypes.c_void_p))


def _arena_allocator() -> ArenaAllocator:
    now = ArenaAllocator()
    ctypes.pythonapi.PyObject_GetArenaAllocator(ctypes.byref(now))
    return now


class Bench:
    def __init__(self, root: Path, n_profiles: int) -> None:
        self.pythons_arena = _arena_allocator()  # before the plugin's init() replaces it
        self.h = Harness("compiled", root)
        store = ProfileStore(root / "profiles")
        store.ensure_root()
        now = time.time()
        for i in range(n_profiles):
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
        (root / "slurm.conf").write_text(
            "NodeName=g1 CPUs=32 Gres=gpu:4\nPartitionName=p Nodes=g1 Default=YES\n"
        )
        os.environ["CODA_CONF"] = str(root / "coda.conf")
        (root / "coda.conf").write_text(
            f"ProfileStore={store.root}\nHookStatsFile=\n"
            f"DecisionJournal={root / 'decisions.jsonl'}\n"
        )
        if self.h.init() != 1:
            raise SystemExit("the plugin did not start")
        self.plugins_arena = _arena_allocator()
        self.ffi, self.lib = self.h.ffi, self.h.lib
        state = hook.current_state()
        assert state is not None and state.journal is not None
        self.state = state
        self.names = itertools.count()
        self.shim = self._shim(root)
        # The plugin's own C entry points, as slurmctld calls them.
        self.c_submit = self._addr(self.ffi.addressof(self.lib, "job_submit"))
        self.c_modify = self._addr(self.ffi.addressof(self.lib, "coda_py_modify"))
        self.lean_memo: dict[tuple[Any, ...], tuple[bytes, bytes, bytes, bytes]] = {}

    @staticmethod
    def _shim(root: Path) -> ctypes.CDLL:
        src, so = root / "shim.c", root / "shim.so"
        src.write_text(SHIM_C)
        subprocess.run(
            ["cc", "-O2", "-shared", "-fPIC", "-pthread", "-o", str(so), str(src)], check=True
        )
        shim = ctypes.CDLL(str(so))
        for fn in (shim.call_in_new_thread, shim.call_here):
            fn.restype = ctypes.c_longlong
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        return shim

    def new_job(self) -> Any:
        return self.h.desc(**{**JOB, "name": f"new-{next(self.names)}.sh"})

    def _addr(self, cdata: Any) -> int:
        return int(self.ffi.cast("uintptr_t", cdata))

    def from_c(self, fn: int, desc: Any, new_thread: bool) -> float:
        """µs of one call of the plugin's C ``fn`` (ctypes releases the GIL around it)."""
        err = self.ffi.new("char **")
        call = self.shim.call_in_new_thread if new_thread else self.shim.call_here
        ns = call(fn, self._addr(desc), self._addr(err))
        if ns < 0:
            raise SystemExit("pthread_create failed")
        return ns / 1000

    # -- table 1 ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def pythons_own_arena(self) -> Iterator[None]:
        """Python's arena allocator instead of the plugin's, for the calls inside.  Both hand
        out mmap'd blocks that either one frees, so swapping them is safe."""
        ctypes.pythonapi.PyObject_SetArenaAllocator(ctypes.byref(self.pythons_arena))
        try:
            yield
        finally:
            ctypes.pythonapi.PyObject_SetArenaAllocator(ctypes.byref(self.plugins_arena))

    def entry(self, calls: int) -> dict[str, list[float]]:
        ways = (
            ("a fresh native thread", True, False),
            ("a fresh native thread, Python's own arena allocator", True, True),
            ("a thread with a state", False, False),
        )
        out: dict[str, list[float]] = {}
        for i in range(calls):
            order = ways if i % 2 == 0 else (ways[1], ways[0], ways[2])
            for where, new_thread, pythons in order:
                with self.pythons_own_arena() if pythons else contextlib.nullcontext():
                    desc = self.new_job()
                    evict()
                    t = self.from_c(self.c_submit, desc, new_thread)
                    out.setdefault(f"job_submit, never-seen job, from {where}", []).append(t)
                    assert self.ffi.string(desc.cpus_per_tres) == b"gres:gpu:6"
                    empty = self.h.desc()
                    evict()
                    t = self.from_c(self.c_modify, empty, new_thread)
                    out.setdefault(f"coda_py_modify, empty update, from {where}", []).append(t)
        return dict(sorted(out.items(), key=lambda kv: kv[0].startswith("coda_py_modify")))

    # -- table 2 ---------------------------------------------------------------------------

    def stages(self, calls: int) -> list[list[int]]:
        rows = []
        for _ in range(calls):
            desc = self.new_job()
            err = self.ffi.new("char **")
            evict()
            rows.append(self._staged(desc, err))
        return rows

    def _staged(self, desc: Any, err: Any) -> list[int]:
        """The hook's steps for a memo miss, in its order, with a clock read after each."""
        state, lib, pc = self.state, self.lib, time.perf_counter_ns
        t = [pc()]
        t0 = hook._perf_ns()
        state.stats.calls += 1
        now_unix_s = hook._time_s()
        t.append(pc())
        gpu = (desc.tres_per_node, desc.tres_per_job, desc.tres_per_task, desc.tres_per_socket)
        t.append(pc())
        key = hook._read_key(desc, 0, *gpu)
        t.append(pc())
        profiles = state.cache.snapshot()
        memo = state.memo
        assert memo.profiles is profiles and memo.plans.get(key) is None
        t.append(pc())
        req = hook._request_from_key(key)
        t.append(pc())
        cfg, cap_of = state.cfg, state.node_cap
        admitted = D._admit(req, cfg)
        assert isinstance(admitted, D._Admitted)
        t.append(pc())
        nodes = req.min_nodes if D._set32(req.min_nodes) else 1
        tasks_per_node = D.job_tasks_per_node(req, nodes)
        gpn = D._gpus_per_node(req, admitted.gpus, nodes, tasks_per_node)
        user_cpg = admitted.user_cpg
        user_cpt = req.cpus_per_task if D._set16(req.cpus_per_task) else None
        t.append(pc())
        sig = workload_signature(
            req.uid, req.job_name, req.script, admitted.directives, cfg.signature_ignore
        )
        t.append(pc())
        profile, src, weak = D._lookup(sig, profiles, cfg.min_confidence)
        t.append(pc())
        place = D._placement(req, cfg, sig, profiles, gpn, state.node_features, admitted.sep)
        t.append(pc())
        cap = cap_of(gpn)
        pred, src, note = D._prediction(profile, src, gpn, nodes, cfg, cap, cap_of.share)
        was, user_flag = D._user_value(user_cpg, user_cpt)
        t.append(pc())
        assert not user_flag, "this bench's job gives no CPU value of its own"
        bound = note.removeprefix(", ") if "capped" in note or "raised to" in note else ""
        job = D._Job(
            req, cfg, sig, was, src, gpn, nodes, tasks_per_node, cap, place, admitted.sep, bound
        )
        choice = D._Choice(
            profile=profile,
            pred=pred,
            unknown=weak or "no profile for this workload yet",
            label=quote_label(sig.workload),
            basis=D._basis(profile, src, nodes) + note,
        )
        decision = D._without_user_value(job, choice)
        t.append(pc())
        plan = hook.make_plan(req, decision, cfg.user_message)
        t.append(pc())
        memo.add(key, plan)
        t.append(pc())
        token = hook._next_token()
        t.append(pc())
        hook._apply(desc, plan, err, token)
        t.append(pc())
        lib.coda_log(plan.log_level, plan.log_line)
        t.append(pc())
        elapsed_ns = hook._perf_ns() - t0
        state.stats.record(elapsed_ns)
        state.journal.record(
            pending_entry(
                now_unix_s, lib.coda_job_id(desc), 0, plan, decision, elapsed_ns, False, None, token
            )
        )
        t.append(pc())
        reference = D.decide(
            req,
            cfg,
            profiles,
            cap_of,
            node_features=state.node_features,
            node_share=cap_of.share,
            gres_units=cap_of.gres_units,
            gres_sep=hook._GRES_SEP,
            default_partition=cap_of.default_partition,
        )
        if decision != reference:
            raise SystemExit(f"the staged steps no longer match decide():\n{decision}\n{reference}")
        assert self.ffi.string(desc.cpus_per_tres) == b"gres:gpu:6"
        return [b - a for a, b in itertools.pairwise(t)]

    # -- table 3 ---------------------------------------------------------------------------

    def lean(self, desc: Any, submit_uid: int, err: Any) -> int:
        """Only this job's form: what a Python path does with no other work."""
        ffi, lib, state = self.ffi, self.lib, self.state
        t0 = time.perf_counter_ns()
        per_node, per_job = desc.tres_per_node, desc.tres_per_job
        per_task, per_socket = desc.tres_per_task, desc.tres_per_socket
        if not (per_node or per_job or per_task or per_socket):
            return 0
        s = ffi.string
        uid = desc.user_id
        name, partition, cpt, comment = desc.name, desc.partition, desc.cpus_per_tres, desc.comment
        script, prefer = desc.script, desc.prefer
        key = (
            uid if uid != lib.NO_VAL else submit_uid,
            desc.cpus_per_task,
            desc.min_nodes,
            desc.num_tasks,
            desc.ntasks_per_node,
            desc.sockets_per_node,
            s(name) if name else None,
            s(partition) if partition else None,
            s(per_node) if per_node else None,
            s(per_job) if per_job else None,
            s(per_task) if per_task else None,
            s(per_socket) if per_socket else None,
            s(cpt) if cpt else None,
            s(comment) if comment else None,
            s(script) if script else None,
            s(prefer) if prefer else None,
        )
        plan = self.lean_memo.get(key)
        if plan is None:
            gpus = int(key[9].rpartition(b":")[2])
            workload = key[13].partition(b"coda:workload=")[2].split(b" ", 1)[0]
            sig = b"workload:*:" + workload
            prof = state.cache.snapshot()[sig.decode()]
            cap = state.node_cap(gpus)
            cpg = min(prof.cpus_per_gpu, cap) if cap else prof.cpus_per_gpu
            admin = b"coda:sig=%s;cpg=%d;was=;action=set;src=global;gpn=%d;nodes=1" % (
                sig,
                cpg,
                gpus,
            )
            line = b'job "%s" uid=%d sig=%s action=set cpg=%d was=- src=global gpn=%d ' % (
                key[6],
                key[0],
                sig,
                cpg,
                gpus,
            )
            msg = (
                b'coda (if Slurm accepts the job): --cpus-per-gpu=%d for workload "%s" '
                b"(shared profile, %d samples, confidence %.2f)"
                % (cpg, workload, prof.n_samples, prof.confidence)
            )
            plan = (b"gres:gpu:%d" % cpg, admin, line + b"nodes=1: confident profile", msg)
            self.lean_memo[key] = plan
        token = lib.coda_next_token()
        replace = lib.coda_replace_str
        replace(ffi.addressof(desc, "cpus_per_tres"), plan[0])
        replace(ffi.addressof(desc, "admin_comment"), b"%s;tok=%016x" % (plan[1], token))
        replace(err, plan[3])
        lib.coda_log(1, plan[2])
        elapsed_ns = time.perf_counter_ns() - t0
        state.stats.record(elapsed_ns)
        assert state.journal is not None
        state.journal.record(
            (time.time(), 0, key[0], None, 0, 0, "set", None, elapsed_ns, False, None, token)
        )
        return 0

    def compare(self, calls: int) -> dict[str, list[float]]:
        paths: dict[str, Callable[[Any, int, Any], int]] = {
            "hook": hook.job_submit,
            "lean": self.lean,
        }

        def timed(fn: Callable[[Any, int, Any], int], desc: Any, cold: bool) -> float:
            err = self.ffi.new("char **")
            if cold:
                evict()
            t0 = time.perf_counter_ns()
            fn(desc, 0, err)
            elapsed = (time.perf_counter_ns() - t0) / 1000
            assert self.ffi.string(desc.cpus_per_tres) == b"gres:gpu:6"
            return elapsed

        for fn in paths.values():
            timed(fn, self.h.desc(**JOB), False)  # the repeated job's plan is kept
        out: dict[str, list[float]] = {}
        for _ in range(calls):  # cold: the two paths and both jobs interleaved
            for name, fn in paths.items():
                for job in ("never-seen", "repeated"):
                    desc = self.new_job() if job == "never-seen" else self.h.desc(**JOB)
                    out.setdefault(f"{name}, {job} job, cold", []).append(timed(fn, desc, True))
        for name, fn in paths.items():  # hot: back to back
            label = f"{name}, never-seen job, hot (back to back)"
            out[label] = [timed(fn, self.new_job(), False) for _ in range(calls)]
        return out


def _p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=300, help="timed jobs per row")
    p.add_argument("--profiles", type=int, default=10_000)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="coda-bench-stages-"))
    bench = Bench(root, args.profiles)
    for _ in range(30):  # imports, caches and the memo's first plans
        bench.lib.job_submit(bench.new_job(), 0, bench.ffi.new("char **"))
        bench.lean(bench.new_job(), 0, bench.ffi.new("char **"))
    out = "| 1. entry: plugin call from C, cold | p50 µs | p90 µs |\n|---|--:|--:|\n"
    for name, times in bench.entry(args.calls).items():
        out += f"| {name} | {statistics.median(times):.1f} | {_p(times, 90):.1f} |\n"
    rows = bench.stages(args.calls)
    out += "\n| 2. step of a never-seen job, cold, in sequence | p50 µs |\n|---|--:|\n"
    total = 0.0
    for i, name in enumerate(STAGES):
        us = statistics.median(r[i] for r in rows) / 1000
        total += us
        out += f"| {name} | {us:.1f} |\n"
    out += f"| sum of the steps' medians | {total:.1f} |\n"
    out += "\n| 3. Python job_submit, no C entry | p50 µs | p90 µs |\n|---|--:|--:|\n"
    for name, times in bench.compare(args.calls).items():
        out += f"| {name} | {statistics.median(times):.1f} | {_p(times, 90):.1f} |\n"
    sys.stdout.write(out)
    bench.h.fini()
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
