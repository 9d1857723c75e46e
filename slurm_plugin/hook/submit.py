"""job_submit/coda: the Python side of the plugin, running inside slurmctld.

slurmctld calls ``job_submit()`` for every new job while it holds its job locks, so
this path does no I/O: the profile store and coda.conf are reloaded by a
background thread (:class:`coda_common.store.profiles.Reloader`) and the hook reads an
immutable snapshot. The decision itself is :func:`slurm_plugin.decision.decide.decide`, a
pure function tested by tables; this module only moves data between the C struct
and Python, enforces the time budget and fails open.

Because decide() is pure, its answers are memoised (:class:`DecisionMemo`): a
job whose decision fields match an earlier one's, under the same configuration and
profile snapshot, costs one dict lookup, and the fields it writes were encoded once.
Called once every few ms from a fresh slurmctld thread, the hook runs with cold caches,
where every line of Python it skips counts (docs/benchmarks.md, "In-hook time").  Every
job that asks for a GPU is answered here; the C side only applies what this module chose
(job_submit_coda.c: the string writes, the fields sbatch derived from ``-c``).

Every decision that writes an admin record ends it with a token of its own (``;tok=``, from
one sequence in C), and puts the user's line after it: slurmctld may refuse the
submission after job_submit, and the token lets ``coda-slurm status`` count only the
decisions a job of Slurm's holds (:func:`slurm_plugin.hook.journal.reconcile`). For the same
reason the line sbatch prints starts ``coda (if Slurm accepts the job):`` (:data:`IF_ACCEPTED`).

Fail-open contract: any exception, or a decision that took longer than
``HookBudgetMs``, leaves the job exactly as the user submitted it and logs one
line. The only way this hook refuses a job is a malformed ``coda:`` directive the
user wrote in ``--comment`` (they asked for something invalid).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coda_common.config.codaconf import CodaConfig, load_config
from coda_common.config.paths import default_conf_path, slurm_conf_for
from coda_common.signature import DirectiveError, parse_coda_directives, quote_label
from coda_common.slurm.conffile import ConfigError
from coda_common.slurm.slurmconf import mtime_ns as file_mtime_ns
from coda_common.store.profiles import ProfileCache, Reloader, StoreUnavailable
from slurm_plugin.config.controllers import Controllers, read_controllers
from slurm_plugin.config.nodecap import NodeCap
from slurm_plugin.decision import placement, priors
from slurm_plugin.decision.decide import (
    ADMIN_PREFIX,
    Decision,
    JobRequest,
    ProfileView,
    decide,
    same_decisions,
)
from slurm_plugin.decision.redecide import (
    Kept,
    Redecision,
    UpdateFields,
    redecide,
    update_triggers,
)
from slurm_plugin.hook import modify
from slurm_plugin.hook.journal import DecisionJournal, format_token, pending_entry

LOG_ERROR, LOG_INFO, LOG_VERBOSE, LOG_DEBUG = 0, 1, 2, 3
_LEVELS = {"error": LOG_ERROR, "info": LOG_INFO, "verbose": LOG_VERBOSE, "debug": LOG_DEBUG}
STATS_WINDOW = 4096  # in-hook durations kept for p50/p99
MEMO_MAX_ENTRIES = 4096
"""Decisions one :class:`DecisionMemo` holds before it is cleared."""
MEMO_MAX_BYTES = 32 * 1024 * 1024
"""Job text (scripts, comments, ...) one :class:`DecisionMemo` keeps as keys, at most."""

_ffi: Any = None
_lib: Any = None
_state: HookState | None = None
_modify: modify.ModifyWorker | None = None
"""The re-decision of updated pending jobs (:mod:`slurm_plugin.hook.modify`); one per
plugin life, whatever coda.conf reloads."""
# Bound once in bind(): the hot path reads them as plain module globals instead of going
# through the cffi lib object and the time module on every call.
_SUCCESS = 0
_ERROR = -1
_NO_VAL = 0xFFFFFFFE
_GRES_SEP = ":"
"""How the running Slurm spells a GRES in ``tres_per_node``: ``gres/`` from 23.11 on (see
slurm_plugin.decision.tres); for CPU-only jobs, whose request shows no spelling."""
_GRES_SLASH_RELEASE = (23 << 16) | (11 << 8)  # SLURM_VERSION_NUM(23, 11, 0)
_perf_ns = time.perf_counter_ns
_time_s = time.time

_token_lock = threading.Lock()
_last_token = 0


def _py_token() -> int:
    """A decision token where the C side is absent (test doubles): as coda_next_token()."""
    global _last_token
    with _token_lock:
        now_ns = time.time_ns()
        _last_token = now_ns if now_ns > _last_token else _last_token + 1
        return _last_token


_next_token = _py_token


@dataclass(slots=True)
class HookStats:
    """Counters the hook keeps about itself (read by ``coda-slurm status`` and bench/)."""

    calls: int = 0
    gpu_jobs: int = 0
    changed: int = 0
    rejected: int = 0
    fail_open: int = 0
    over_budget: int = 0
    cpu_jobs: int = 0
    """CPU-only jobs given a record (``MemBwSpreadGres``); not in ``gpu_jobs``."""
    last_call_unix_s: float | None = None
    durations_ns: list[int] = field(default_factory=list)
    _next: int = 0

    def record(self, duration_ns: int) -> None:
        if len(self.durations_ns) < STATS_WINDOW:
            self.durations_ns.append(duration_ns)
        else:
            self.durations_ns[self._next] = duration_ns
            self._next = (self._next + 1) % STATS_WINDOW

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.durations_ns)

        def pct(q: float) -> float | None:
            if not ordered:
                return None
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000.0

        return {
            "calls": self.calls,
            "gpu_jobs": self.gpu_jobs,
            "changed": self.changed,
            "rejected": self.rejected,
            "fail_open": self.fail_open,
            "over_budget": self.over_budget,
            "cpu_jobs": self.cpu_jobs,
            "last_call_unix_s": self.last_call_unix_s,
            "window": len(ordered),
            "p50_us": pct(0.50),
            "p99_us": pct(0.99),
            "max_us": ordered[-1] / 1000.0 if ordered else None,
        }


RequestKey = tuple[Any, ...]
"""The raw job_desc fields :func:`decide` reads (see :func:`_read_key`): ints and bytes."""


@dataclass(slots=True)
class Plan:
    """One decision and everything the hook writes for it, encoded once.

    Built on a :class:`DecisionMemo` miss; a hit reuses it, so a recurring job costs one
    dict lookup instead of :func:`decide` plus the encoding of each field.  Not frozen, for
    the reason :class:`~coda_common.store.request.JobRequest` is not; nothing changes a
    plan once it is built.
    """

    decision: Decision
    uid: int
    job_name: str | None
    ntasks_per_node: int
    num_tasks: int
    cpus_per_tres: bytes | None
    tres_per_node: bytes | None
    prefer: bytes | None
    partition: bytes | None
    admin_comment: bytes | None
    """The admin record; :func:`_apply` ends it with the decision's token."""
    admin_note: bytes | None
    """The line for the user, after the record in the job's admin comment (``scontrol show
    job`` shows it to users whose client hides sbatch's output)."""
    user_msg: bytes | None
    """The line for sbatch's output (a reject's fallback text included)."""
    log_level: int
    """LOG_INFO, or LOG_VERBOSE for a skip that changes nothing."""
    log_line: bytes
    """:func:`log`'s bytes for the decision's line."""


def make_plan(req: JobRequest, decision: Decision, user_message: str = "all") -> Plan:
    """The :class:`Plan` of ``decision`` for ``req``; every value is encoded here, before
    the hook writes anything. ``user_message`` is UserMessage: which submissions get the
    line on stderr (the admin comment's note and the log line are the same for all)."""
    user_msg = decision.user_msg
    note: str | None = None
    if decision.action == "reject":
        user_msg = user_msg or "coda: invalid coda: directive"
    elif user_msg:
        if decision.admin_comment:
            note = _admin_note(user_msg)
        user_msg = _if_accepted(user_msg) if _tells_user(req, user_message) else None
    if decision.action == "skip" and (decision.admin_comment is None or decision.cpu_job):
        # A CPU-only job routed by CpuJobPartitions or given the memory-bandwidth GRES is
        # said at info; other skips (CPU-only job, coda:off) only at LogLevel=verbose.
        changed = decision.partition is not None or decision.tres_per_node is not None
        level = LOG_INFO if changed else LOG_VERBOSE
    else:
        level = LOG_INFO
    return Plan(
        decision=decision,
        uid=req.uid,
        job_name=req.job_name,
        ntasks_per_node=req.ntasks_per_node,
        num_tasks=req.num_tasks,
        cpus_per_tres=_encode_opt(decision.cpus_per_tres),
        tres_per_node=_encode_opt(decision.tres_per_node),
        prefer=_encode_opt(decision.prefer),
        partition=_encode_opt(decision.partition),
        admin_comment=_encode_opt(decision.admin_comment or None),
        admin_note=_encode_opt(note),
        user_msg=_encode_opt(user_msg or None),
        log_level=level,
        log_line=_log_bytes(_log_line(decision)),
    )


def _tells_user(req: JobRequest, user_message: str) -> bool:
    """Whether the submitting command prints the line, by UserMessage. Only a batch job
    has a script (job_desc's ``script``); srun and salloc send none, and their stderr is
    the program's, which scripts and Slurm's own tests read (``srun --error=none``).
    The script is part of the memo's key, so a plan kept for one is never given to the
    other."""
    if user_message == "all":
        return True
    return user_message == "batch" and req.script is not None


IF_ACCEPTED = "coda (if Slurm accepts the job): "
"""How the hook's line for sbatch starts.  slurmctld validates much of a submission after
the job_submit plugins (an array over MaxArraySize, a QOS limit), and sbatch prints the
plugin's line for a refused submission as an error, before Slurm's own reason: the line
says that it describes the job Slurm would have run."""


def _if_accepted(user_msg: str) -> str:
    """``user_msg`` (``coda: ...``) as sbatch prints it for a job Slurm may still refuse."""
    return IF_ACCEPTED + user_msg.removeprefix("coda: ")


def _admin_note(user_msg: str) -> str:
    """``user_msg`` for the job's admin comment, where ``scontrol show job`` shows it to users
    whose client hides sbatch's output.  It follows the admin record, and readers take the
    last ``coda:sig=`` as the hook's record: a job name holding one is defused here."""
    return user_msg.replace(ADMIN_PREFIX, "coda:sig:")


class DecisionMemo:
    """Plans of recent decisions, keyed on the raw job_desc fields :func:`decide` reads.

    :func:`decide` is pure given those fields, the configuration, the node shapes and the
    profile snapshot.  A memo belongs to one :class:`HookState` (a coda.conf reload builds
    a new state, and with it an empty memo) and to one snapshot object: ``ProfileCache``
    replaces its snapshot whenever a profile changes, and the hook starts a new memo when
    the snapshot it holds is not the one it was built for, unless the reloader moved the
    memo to the new snapshot first because it decides every job alike
    (:func:`_follow_snapshot`).  Bounded by
    :data:`MEMO_MAX_ENTRIES` and :data:`MEMO_MAX_BYTES`, cleared when either is reached: a
    recurring workload is back in after one miss.
    """

    __slots__ = ("key_bytes", "plans", "profiles")

    def __init__(self, profiles: Mapping[str, ProfileView] | None) -> None:
        self.profiles = profiles
        self.plans: dict[RequestKey, Plan] = {}
        self.key_bytes = 0

    def add(self, key: RequestKey, plan: Plan) -> None:
        size = sum(len(v) for v in key if type(v) is bytes)
        if size > MEMO_MAX_BYTES:
            return  # a huge script: decided again next time rather than kept
        if len(self.plans) >= MEMO_MAX_ENTRIES or self.key_bytes + size > MEMO_MAX_BYTES:
            self.plans.clear()
            self.key_bytes = 0
        self.plans[key] = plan
        self.key_bytes += size


@dataclass(slots=True)
class HookState:
    """Everything the hot path reads; swapped as a whole when coda.conf changes."""

    cfg: CodaConfig
    cfg_path: Path
    cfg_mtime_ns: int
    cache: ProfileCache
    node_cap: NodeCap
    node_features: frozenset[str] = frozenset()
    """Every node's slurm.conf ``Feature=``: the only values the hook sets ``--prefer`` to."""
    started_node_cap: NodeCap | None = None
    """The node shapes read when the plugin started (with slurmctld): GRES counts read
    later never go above them (:attr:`NodeCap.ceiling`)."""
    slurm_conf_stamp: tuple[tuple[Path, int | None], ...] = ()
    """The mtimes of slurm.conf, the files it includes and the folders its Include globs look
    in, when the node shapes were read (None: it could not be stat'ed); a change reloads them
    (``scontrol reconfigure`` does not restart job_submit plugins)."""
    reloader: Reloader | None = None
    controllers: Controllers = field(default_factory=lambda: Controllers((), ""))
    """slurm.conf's controllers and this one: its files are named by it
    (:mod:`slurm_plugin.config.controllers`)."""
    journal_path: Path | None = None
    """This controller's DecisionJournal file; None: no journal."""
    stats_path: Path | None = None
    """This controller's HookStatsFile; None: no stats."""
    journal: DecisionJournal | None = None
    stats: HookStats = field(default_factory=HookStats)
    stats_error: str | None = None
    started_unix_s: float = field(default_factory=time.time)
    conf_loaded_unix_s: float = field(default_factory=time.time)
    memo: DecisionMemo = field(default_factory=lambda: DecisionMemo(None))
    log_level: int = LOG_INFO
    """``LogLevel`` as a number."""
    cpu_jobs_silent: bool = True
    """Whether a job that asks for no GPUs ends with nothing written and nothing logged
    (no ``CpuJobPartitions`` nor ``MemBwSpreadGres``, ``LogLevel`` below verbose): the hook
    then stops after reading the four GPU request fields."""


# -- logging -------------------------------------------------------------------


def log(level: int, msg: str) -> None:
    """One line into slurmctld's log (prefixed ``job_submit/coda:`` by the C side)."""
    state = _state
    if state is not None and level > _LEVELS.get(state.cfg.log_level, LOG_INFO):
        return
    if _lib is None:
        return
    _lib.coda_log(level, _log_bytes(msg))


def _log_named(level_name: str, msg: str) -> None:
    log(_LEVELS.get(level_name, LOG_INFO), msg)


def on_callback_error(exc_type: type, exc_value: BaseException, _tb: object) -> None:
    """cffi's last line of defence: an exception escaped a def_extern function.

    The C caller then receives 0 (SLURM_SUCCESS / "inactive"), i.e. the job passes
    unchanged; say so once.
    """
    with contextlib.suppress(Exception):
        log(
            LOG_ERROR,
            f"internal error escaped to C ({exc_type.__name__}: {exc_value}); job passes unchanged",
        )


# -- plugin life cycle ---------------------------------------------------------


def bind(ffi: Any, lib: Any) -> None:
    global _ffi, _lib, _SUCCESS, _ERROR, _NO_VAL, _GRES_SEP, _next_token
    _ffi, _lib = ffi, lib
    _SUCCESS, _ERROR, _NO_VAL = lib.SLURM_SUCCESS, lib.SLURM_ERROR, lib.NO_VAL
    release = getattr(lib, "SLURM_VERSION_NUMBER", 0)
    _GRES_SEP = "/" if release >= _GRES_SLASH_RELEASE else ":"
    # The token sequence lives in C (job_submit_coda.c, "Decision tokens"); test doubles
    # without it get the same sequence in Python.
    _next_token = lib.coda_next_token if hasattr(lib, "coda_next_token") else _py_token


# -- the decision memo ------------------------------------------------------------


def _follow_snapshot(state: HookState) -> None:
    """Right after the store's refresh, bring the memo to the new snapshot: when that
    snapshot decides every job as the memo's did (only usage records the decision does not
    read changed), the plans hold and the memo moves to it; else it is emptied now rather
    than at the next job."""
    memo = state.memo
    snapshot = state.cache.snapshot()
    if memo.profiles is None or memo.profiles is snapshot:
        return
    if same_decisions(memo.profiles, snapshot, state.cfg):
        memo.profiles = snapshot
    else:
        _renew_memo(state, snapshot)


def _renew_memo(state: HookState, profiles: Mapping[str, ProfileView]) -> DecisionMemo:
    """A new empty memo for ``state`` and ``profiles`` (earlier plans may be stale).  A
    state that is no longer the live one gets a memo of its own, which it does not keep."""
    memo = DecisionMemo(profiles)
    if state is _state:
        state.memo = memo
    return memo


_warned: set[str] = set()
"""coda.conf warnings already written to slurmctld's log: each is said once per slurmctld,
not again at every reload of the file."""


def _load_state(path: Path, started: NodeCap | None = None) -> HookState:
    warnings: list[str] = []
    cfg = load_config(path, warnings=warnings)
    for warning in warnings:
        if warning not in _warned:
            _warned.add(warning)
            _log_named("info", f"warning: {warning}")
    mtime_ns = path.stat().st_mtime_ns
    cache = ProfileCache(Path(cfg.profile_store), _log_named)
    slurm_conf = slurm_conf_for(path, cfg.slurm_conf)
    node_cap = NodeCap.from_slurm_conf(slurm_conf, _log_named)
    node_cap.ceiling = started
    controllers, ctld_error = read_controllers(slurm_conf)
    if ctld_error is not None and ctld_error not in _warned:
        _warned.add(ctld_error)
        _log_named("error", f"{ctld_error}; the hook names its files as if it were alone")
    if cfg.mem_bw_spread_gres is not None:
        # Every partition's GRES count now, not under slurmctld's job write lock: expanding
        # the host lists of 10,000 nodes takes ~20 ms.
        node_cap.prepare_gres(cfg.mem_bw_spread_gres)
    features = frozenset(f for node in node_cap.nodes for f in node.features)
    for gpu_type in cfg.prefer_gpu_types:
        feature = dict(cfg.prefer_gpu_features).get(gpu_type, gpu_type)
        if feature not in features:
            # Slurm would refuse every job the hook gave this --prefer: never set it.
            _log_named(
                "error",
                f"PreferGpuTypes: no node in {node_cap.source} has feature {feature!r} "
                f"(GPU type {gpu_type}); jobs are never steered to it "
                "(add it to the nodes' Feature= or fix PreferGpuFeatures)",
            )
    log_level = _LEVELS.get(cfg.log_level, LOG_INFO)
    return HookState(
        cfg=cfg,
        cfg_path=path,
        cfg_mtime_ns=mtime_ns,
        cache=cache,
        node_cap=node_cap,
        node_features=features,
        started_node_cap=started or node_cap,
        slurm_conf_stamp=node_cap.read_stamp,
        controllers=controllers,
        journal_path=controllers.file_of(cfg.decision_journal),
        stats_path=controllers.file_of(cfg.hook_stats_file),
        log_level=log_level,
        cpu_jobs_silent=not cfg.cpu_job_partitions
        and cfg.mem_bw_spread_gres is None
        and log_level < LOG_VERBOSE,
    )


def plugin_init() -> int:
    """Load coda.conf and the profile store; start the reloader. 1 = ready."""
    global _state
    path = default_conf_path()
    try:
        state = _load_state(path)
    except (OSError, ConfigError) as exc:
        _lib.coda_log(LOG_ERROR, f"cannot load {path}: {exc}".encode("utf-8", "replace"))
        return 0
    try:
        stats = state.cache.refresh()
    except StoreUnavailable as exc:
        # Not fatal: the store may be an NFS mount that comes later. Unknown
        # workloads get the default until it appears.
        _lib.coda_log(LOG_ERROR, f"profile store unavailable: {exc}".encode())
        stats = None
    state.journal = _start_journal(state)
    _state = state
    _renew_memo(state, state.cache.snapshot())
    _prepare_snapshot(state)
    state.reloader = Reloader(
        state.cache, state.cfg.reload_interval_s, _log_named, on_tick=_on_reload_tick
    )
    state.reloader.start()
    global _modify
    _modify = modify.ModifyWorker(_redecide_job, _log_named)
    n = len(state.cache.snapshot())
    log(
        LOG_INFO,
        f"active: mode={state.cfg.mode} user_value={state.cfg.user_value} "
        f"store={state.cfg.profile_store} profiles={n} conf={path}"
        + (f" controller={state.controllers.this}" if state.controllers.several else "")
        + (f" load_ms={stats.duration_s * 1000:.1f}" if stats else ""),
    )
    return 1


def plugin_fini() -> None:
    global _state, _modify
    if _modify is not None:
        _modify.stop()
        _modify = None
    state = _state
    if state is not None and state.reloader is not None:
        state.reloader.stop()
        if state.journal is not None:
            state.journal.stop()
        _write_stats(state)
    _state = None


def _start_journal(state: HookState) -> DecisionJournal | None:
    if state.journal_path is None:
        return None
    return DecisionJournal(state.journal_path, state.cfg.journal_max_bytes, _log_named).start()


def _on_reload_tick() -> None:
    """Runs on the reloader thread: pick up coda.conf edits and persist counters."""
    state = _state
    if state is None:
        return
    _follow_snapshot(state)
    try:
        mtime_ns = state.cfg_path.stat().st_mtime_ns
    except OSError as exc:
        log(LOG_ERROR, f"cannot stat {state.cfg_path}: {exc}; keeping the loaded configuration")
        mtime_ns = state.cfg_mtime_ns
    if mtime_ns != state.cfg_mtime_ns:
        _reload_config(state, mtime_ns)
    else:
        changed = _changed(state.slurm_conf_stamp)
        if changed is not None:
            _reload_config(state, mtime_ns, f"{changed} changed")
    state = _state or state
    _prepare_snapshot(state)
    _write_stats(state)


def _prepare_snapshot(state: HookState) -> None:
    """What the decision computes once per profile snapshot, computed here, on the reload
    thread right after a refresh, so the first job after a profile change does not scan
    every profile under the job write lock: the GPU ranking and the priors' index."""
    snapshot = state.cache.snapshot()
    if state.cfg.prefer_gpu_types:
        placement.ranking_for(snapshot)
    if state.cfg.priors_from_names:
        priors.index_for(snapshot, state.cfg.prior_aliases)


def _changed(stamp: tuple[tuple[Path, int | None], ...]) -> Path | None:
    """The first path of ``stamp`` whose mtime is not what it was, or None."""
    return next((p for p, was in stamp if file_mtime_ns(p) != was), None)


def _reload_config(state: HookState, mtime_ns: int, why: str = "") -> None:
    global _state
    try:
        fresh = _load_state(state.cfg_path, state.started_node_cap)
    except (OSError, ConfigError) as exc:
        state.cfg_mtime_ns = mtime_ns  # log once per edit
        state.slurm_conf_stamp = tuple((p, file_mtime_ns(p)) for p, _ in state.slurm_conf_stamp)
        log(
            LOG_ERROR,
            f"{state.cfg_path} changed but is invalid ({exc}); keeping the last good configuration",
        )
        return
    if fresh.cfg.profile_store == state.cfg.profile_store:
        fresh.cache = state.cache
    else:
        try:
            fresh.cache.refresh()
        except StoreUnavailable as exc:
            log(LOG_ERROR, f"new profile store unavailable ({exc}); keeping the old one")
            fresh.cache = state.cache
    fresh.stats = state.stats
    fresh.started_unix_s = state.started_unix_s
    fresh.reloader = state.reloader
    old_journal = state.journal
    if old_journal is not None and old_journal.path == fresh.journal_path:
        old_journal.max_bytes = fresh.cfg.journal_max_bytes
        fresh.journal = old_journal
        old_journal = None
    else:
        fresh.journal = _start_journal(fresh)
    if fresh.reloader is not None:
        fresh.reloader.retarget(fresh.cache, fresh.cfg.reload_interval_s)
    _state = fresh
    if old_journal is not None:
        # A submission that read the old state just before the swap may still append
        # here after this final flush; that entry is lost (once, at a DecisionJournal edit).
        old_journal.stop()
    log(
        LOG_INFO,
        f"reloaded {state.cfg_path}{f' ({why})' if why else ''}: mode={fresh.cfg.mode} "
        f"user_value={fresh.cfg.user_value}",
    )


# The reloader thread and plugin_fini() both write the stats file; one writer at a time,
# each through its own temporary file, so a reader never sees two documents spliced.
_stats_lock = threading.Lock()


def _write_stats(state: HookState) -> None:
    if state.stats_path is None:
        return
    with _stats_lock:
        _write_stats_locked(state, state.stats_path)


def _write_stats_locked(state: HookState, path: Path) -> None:
    reloader = state.reloader
    journal = state.journal
    # format_version 1; keys are only ever added (coda-slurm status reads missing ones as
    # unknown).
    data = {
        "format": "coda-hook-stats",
        "format_version": 1,
        "pid": os.getpid(),
        "host": state.controllers.this,
        "controllers": list(state.controllers.hosts),
        "started_unix_s": state.started_unix_s,
        "written_unix_s": time.time(),
        "conf": str(state.cfg_path),
        "conf_loaded_unix_s": state.conf_loaded_unix_s,
        "mode": state.cfg.mode,
        "hook_budget_ms": state.cfg.hook_budget_ms,
        "reload_interval_s": state.cfg.reload_interval_s,
        "profiles": len(state.cache.snapshot()),
        "profile_store": str(state.cfg.profile_store),
        "store_refreshed_unix_s": reloader.last_ok_unix_s if reloader else None,
        "store_error": reloader.last_error if reloader else None,
        "journal": None
        if journal is None
        else {
            "path": str(journal.path),
            "written": journal.written,
            "dropped": journal.dropped,
            "pending": journal.pending,
            "error": journal.error,
        },
        **state.stats.summary(),
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        tmp.write_text(json.dumps(data, sort_keys=True))
        os.replace(tmp, path)
        state.stats_error = None
    except OSError as exc:
        if state.stats_error != str(exc):  # once per distinct problem, not every tick
            state.stats_error = str(exc)
            log(LOG_ERROR, f"cannot write HookStatsFile {path}: {exc}")


# -- the hot path --------------------------------------------------------------


def _str(ptr: Any) -> str | None:
    if ptr == _ffi.NULL:
        return None
    # Job fields are bytes from the user's client; keep undecodable bytes.
    return _ffi.string(ptr).decode("utf-8", "surrogateescape")


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _encode_opt(text: str | None) -> bytes | None:
    return None if text is None else text.encode("utf-8", "surrogateescape")


def _decode_opt(raw: bytes | None) -> str | None:
    # Job fields are bytes from the user's client; keep undecodable bytes.
    return None if raw is None else raw.decode("utf-8", "surrogateescape")


def _read_key(
    desc: Any, submit_uid: int, per_node: Any, per_job: Any, per_task: Any, per_socket: Any
) -> RequestKey:
    """The fields :func:`decide` reads, as raw bytes and ints (the four GPU request
    pointers were read first by the caller).  ``max_nodes`` is not read: no rule uses it.

    A NULL ``char *`` is false in cffi; the strings are copied, not decoded: decoding and
    the :class:`JobRequest` are only needed when the memo misses (:func:`_request_from_key`).
    """
    string = _ffi.string
    uid = desc.user_id
    name = desc.name
    partition = desc.partition
    cpus_per_tres = desc.cpus_per_tres
    comment = desc.comment
    script = desc.script
    prefer = desc.prefer
    return (
        uid if uid != _NO_VAL else submit_uid,
        desc.cpus_per_task,
        desc.min_nodes,
        desc.num_tasks,
        desc.ntasks_per_node,
        desc.sockets_per_node,
        string(name) if name else None,
        string(partition) if partition else None,
        string(per_node) if per_node else None,
        string(per_job) if per_job else None,
        string(per_task) if per_task else None,
        string(per_socket) if per_socket else None,
        string(cpus_per_tres) if cpus_per_tres else None,
        string(comment) if comment else None,
        string(script) if script else None,
        string(prefer) if prefer else None,
    )


def _request_from_key(key: RequestKey) -> JobRequest:
    """The :class:`JobRequest` :func:`decide` gets for the fields in ``key``."""
    (
        uid,
        cpus_per_task,
        min_nodes,
        num_tasks,
        ntasks_per_node,
        sockets_per_node,
        name,
        partition,
        per_node,
        per_job,
        per_task,
        per_socket,
        cpus_per_tres,
        comment,
        script,
        prefer,
    ) = key
    return JobRequest(
        uid=uid,
        job_name=_decode_opt(name),
        partition=_decode_opt(partition),
        tres_per_node=_decode_opt(per_node),
        tres_per_job=_decode_opt(per_job),
        tres_per_task=_decode_opt(per_task),
        tres_per_socket=_decode_opt(per_socket),
        cpus_per_tres=_decode_opt(cpus_per_tres),
        cpus_per_task=cpus_per_task,
        min_nodes=min_nodes,
        num_tasks=num_tasks,
        ntasks_per_node=ntasks_per_node,
        sockets_per_node=sockets_per_node,
        comment=_decode_opt(comment),
        script=_decode_opt(script),
        prefer=_decode_opt(prefer),
    )


def read_request(desc: Any, submit_uid: int) -> JobRequest:
    """Copy the fields the policy needs out of job_desc_msg_t (for tools and tests; the
    hook itself reads :func:`_read_key` and decodes only on a memo miss)."""
    return _request_from_key(
        _read_key(
            desc,
            submit_uid,
            desc.tres_per_node,
            desc.tres_per_job,
            desc.tres_per_task,
            desc.tres_per_socket,
        )
    )


def _append_user_msg(err_msg: Any, line: bytes) -> None:
    # Another job_submit plugin (lua) may already have said something.
    old = err_msg[0]
    prev = _ffi.string(old) if old else b""
    _lib.coda_replace_str(err_msg, prev + b"\n" + line if prev else line)


def _apply(desc: Any, plan: Plan, err_msg: Any, token: int = 0) -> None:
    """Write the plan into job_desc (every value was encoded when the plan was made); the
    admin record ends with ``;tok=`` and ``token`` in 16 hex digits."""
    replace = _lib.coda_replace_str
    if plan.cpus_per_tres is not None:
        replace(_ffi.addressof(desc, "cpus_per_tres"), plan.cpus_per_tres)
    if plan.decision.cpus_per_task is not None:
        _lib.coda_set_cpus_per_task(desc, plan.decision.cpus_per_task)  # and what sbatch derived
    if plan.decision.min_cpus_rescale is not None:
        _lib.coda_rescale_min_cpus(desc, *plan.decision.min_cpus_rescale)
    # Placement: Slurm validates these after job_submit, like cpus_per_tres.
    if plan.tres_per_node is not None:
        replace(_ffi.addressof(desc, "tres_per_node"), plan.tres_per_node)
    if plan.prefer is not None:
        replace(_ffi.addressof(desc, "prefer"), plan.prefer)
    if plan.partition is not None:
        replace(_ffi.addressof(desc, "partition"), plan.partition)
    if plan.admin_comment is not None:
        old = desc.admin_comment
        prev = _ffi.string(old) if old else b""
        record = b"%s;tok=%016x" % (plan.admin_comment, token)
        if plan.admin_note is not None:
            record += b" " + plan.admin_note
        replace(_ffi.addressof(desc, "admin_comment"), prev + b" " + record if prev else record)
    if plan.user_msg is not None:
        _append_user_msg(err_msg, plan.user_msg)


def _log_line(decision: Decision) -> str:
    # slurmctld's line is already prefixed "job_submit/coda: ".
    return decision.log_msg.removeprefix("coda: ")


def _log_bytes(msg: str) -> bytes:
    return msg.replace("\n", " | ").encode("utf-8", "replace")


class _Call:
    """What one ``job_submit`` call has learnt, for its journal entry and a failure's
    line; the class attributes are the values before the job was read."""

    who: Plan | JobRequest | None = None
    """The plan once there is one, the request on a memo miss."""
    journaled: Decision | None = None
    """What the decision journal gets (set before each return that is a decision)."""
    token: int = 0
    fail_open: bool = False
    error: str | None = None


def job_submit(desc: Any, submit_uid: int, err_msg: Any) -> int:
    state = _state
    if state is None:
        return _SUCCESS
    t0 = _perf_ns()
    stats = state.stats
    stats.calls += 1
    stats.last_call_unix_s = now_unix_s = _time_s()
    gpus = (desc.tres_per_node, desc.tres_per_job, desc.tres_per_task, desc.tres_per_socket)
    if state.cpu_jobs_silent and not any(gpus):
        # No GPU asked: decide() would skip the job with nothing to write or log, so the
        # other fields are not read at all.
        stats.record(_perf_ns() - t0)
        return _SUCCESS
    call = _Call()
    try:
        return _decide_and_write(desc, submit_uid, err_msg, state, t0, call, gpus)
    except Exception as exc:
        stats.fail_open += 1
        call.fail_open = True
        call.error = error = f"{type(exc).__name__}: {exc}"
        log(LOG_ERROR, f"{_failed_job_label(call.who, submit_uid)}: {error}; job passes unchanged")
        return _SUCCESS
    finally:
        elapsed_ns = _perf_ns() - t0
        stats.record(elapsed_ns)
        journal = state.journal
        if journal is not None and (call.journaled is not None or call.fail_open):
            journal.record(
                pending_entry(
                    now_unix_s,
                    _lib.coda_job_id(desc),
                    submit_uid,
                    call.who,
                    call.journaled,
                    elapsed_ns,
                    call.fail_open,
                    call.error,
                    call.token,
                )
            )


def _decide_and_write(
    desc: Any,
    submit_uid: int,
    err_msg: Any,
    state: HookState,
    t0: int,
    call: _Call,
    gpus: tuple[Any, Any, Any, Any],
) -> int:
    """``job_submit``'s work: the job's plan (memoised), then what it writes or says.
    ``gpus``: job_desc's GPU request fields, per node, job, task and socket."""
    key = _read_key(desc, submit_uid, *gpus)
    profiles = state.cache.snapshot()
    memo = state.memo
    if memo.profiles is not profiles:  # the store reloaded: earlier plans may be stale
        memo = _renew_memo(state, profiles)
    plan = memo.plans.get(key)
    if plan is None:
        call.who = req = _request_from_key(key)
        plan = _plan_miss(state, memo, key, req, profiles)
    call.who = plan
    decision = plan.decision
    action = decision.action
    if action == "reject":
        call.journaled = decision
        return _reject(state, plan, err_msg)
    if action == "skip" and (decision.admin_comment is None or decision.cpu_job):
        # CPU-only job, coda:off, or one routed by CpuJobPartitions or MemBwSpreadGres:
        # not a GPU decision, so neither counted nor journaled as one (coda-slurm status
        # is about GPU jobs' cores).
        return _pass_unmanaged(desc, state, plan, err_msg)
    state.stats.gpu_jobs += 1
    call.journaled = decision
    elapsed_ms = (_perf_ns() - t0) / 1e6
    if elapsed_ms > state.cfg.hook_budget_ms:
        call.fail_open = True
        call.error = _over_budget(state, plan, submit_uid, elapsed_ms)
        return _SUCCESS
    if plan.admin_comment is not None:
        call.token = _next_token()
    return _accept(desc, state, plan, err_msg, call.token)


def _plan_miss(
    state: HookState,
    memo: DecisionMemo,
    key: RequestKey,
    req: JobRequest,
    profiles: Mapping[str, ProfileView],
) -> Plan:
    """A job the memo has no plan for: decide it and remember the plan."""
    decision = decide(
        req,
        state.cfg,
        profiles,
        state.node_cap,
        node_features=state.node_features,
        node_share=state.node_cap.share,
        gres_units=state.node_cap.gres_units,
        gres_sep=_GRES_SEP,
        default_partition=state.node_cap.default_partition,
    )
    plan = make_plan(req, decision, state.cfg.user_message)
    memo.add(key, plan)
    return plan


def _over_budget(state: HookState, plan: Plan, submit_uid: int, elapsed_ms: float) -> str:
    """The decision ran past HookBudgetMs: count it, log it and say why the job passes
    unchanged (the journal's error)."""
    stats = state.stats
    stats.over_budget += 1
    stats.fail_open += 1
    error = f"decision took {elapsed_ms:.1f} ms > HookBudgetMs={state.cfg.hook_budget_ms}"
    log(LOG_ERROR, f"{_failed_job_label(plan, submit_uid)}: {error}; job passes unchanged")
    return error


def _accept(desc: Any, state: HookState, plan: Plan, err_msg: Any, token: int) -> int:
    """A GPU job CODA manages: write its plan into job_desc, count a change, log it."""
    _apply(desc, plan, err_msg, token)
    if plan.cpus_per_tres is not None or plan.decision.cpus_per_task is not None:
        state.stats.changed += 1
    if plan.log_level <= state.log_level:
        _lib.coda_log(plan.log_level, plan.log_line)
    return _SUCCESS


def _reject(state: HookState, plan: Plan, err_msg: Any) -> int:
    """Refuse the job: its line to the user and to the log."""
    state.stats.rejected += 1
    _append_user_msg(err_msg, plan.user_msg or b"")
    if plan.log_level <= state.log_level:
        _lib.coda_log(plan.log_level, plan.log_line)
    return _ERROR


def _pass_unmanaged(desc: Any, state: HookState, plan: Plan, err_msg: Any) -> int:
    """A job CODA does not manage passes; only a CPU-only job's route, record and
    memory-bandwidth GRES are written (make_plan set the log level)."""
    if plan.decision.cpu_job:
        state.stats.cpu_jobs += 1
        _apply(desc, plan, err_msg, _next_token())
    elif plan.partition is not None:
        _apply(desc, plan, err_msg)
    if plan.log_level <= state.log_level:
        _lib.coda_log(plan.log_level, plan.log_line)
    return _SUCCESS


def _failed_job_label(who: Plan | JobRequest | None, submit_uid: int) -> str:
    # The same "job NAME uid=N" a decision's line starts with, when the job was read.
    if who is None:
        return f"job ? uid={submit_uid}"
    return f"job {quote_label(who.job_name or '')} uid={who.uid}"


def job_modify(desc: Any, submit_uid: int, err_msg: Any) -> int:
    """Updates (``scontrol update job``) pass unchanged, except an invalid directive.

    The update message carries only the changed fields (no script) and the job itself is
    slurmctld's, so an update that changes a pending job's GPUs, tasks, nodes or partition
    without naming its cores is only noticed here: :mod:`slurm_plugin.hook.modify` decides
    the job's cores again once the update is done.
    """
    if _state is None:
        return _lib.SLURM_SUCCESS
    try:
        comment = _str(desc.comment)
        if comment and "coda:" in comment:
            parse_coda_directives(comment)
        worker = _modify
        if worker is not None:
            job_id = update_triggers(_update_fields(desc))
            if job_id is not None and not worker.notice(job_id):
                log(LOG_ERROR, f"job {job_id}: update not decided again (queue full)")
        return _lib.SLURM_SUCCESS
    except DirectiveError as exc:
        _append_user_msg(err_msg, _encode(str(exc)))
        log(
            LOG_INFO,
            f"job_id={_lib.coda_job_id(desc)} uid={submit_uid}: update rejected: {exc}",
        )
        return _lib.SLURM_ERROR
    except Exception as exc:
        log(
            LOG_ERROR,
            f"job_id={_lib.coda_job_id(desc)}: {type(exc).__name__}: {exc}; "
            "update passes unchanged",
        )
        return _lib.SLURM_SUCCESS


def _update_fields(desc: Any) -> UpdateFields:
    """What an update message carries (job_modify's job_desc), for update_triggers()."""
    return UpdateFields(
        job_id_str=_str(desc.job_id_str),
        job_id=_lib.coda_job_id(desc),
        tres_per_node=_str(desc.tres_per_node),
        tres_per_job=_str(desc.tres_per_job),
        tres_per_task=_str(desc.tres_per_task),
        tres_per_socket=_str(desc.tres_per_socket),
        num_tasks=desc.num_tasks,
        min_nodes=desc.min_nodes,
        ntasks_per_node=desc.ntasks_per_node,
        partition=_str(desc.partition),
        cpus_per_tres=_str(desc.cpus_per_tres),
        cpus_per_task=desc.cpus_per_task,
        min_cpus=desc.min_cpus,
        pn_min_cpus=desc.pn_min_cpus,
    )


def _redecide_job(job_id: int) -> None:
    """On the modify worker's thread: read job ``job_id``, decide its cores again, write
    them, journal and log it; anything that fails leaves the job as Slurm has it."""
    state = _state
    if state is None:
        return
    t0 = _perf_ns()
    job = modify.load_job(_ffi, _lib, job_id)
    if isinstance(job, str):
        log(LOG_VERBOSE, f"job {job_id} updated: cores left as they are: {job}")
        return
    outcome = redecide(
        job,
        state.cfg,
        state.cache.snapshot(),
        state.node_cap,
        state.node_cap.share,
        token=format_token(_next_token()),
    )
    if isinstance(outcome, Kept):
        level = LOG_INFO if outcome.recorded else LOG_VERBOSE
        log(level, f"job {job_id} updated: cores left as they are: {outcome.reason}")
        return
    error = modify.update_job(_ffi, _lib, job_id, outcome)
    if error is not None:
        log(LOG_ERROR, f"job {job_id} updated: new cores not written ({error}); job left as is")
        return
    log(LOG_INFO, outcome.log_msg)
    _journal_redecision(state, job_id, job.uid, job.name, outcome, _perf_ns() - t0)


def _journal_redecision(
    state: HookState, job_id: int, uid: int, name: str | None, outcome: Redecision, ns: int
) -> None:
    """The journal's entry of a pending job's cores decided again."""
    journal = state.journal
    if journal is None:
        return
    was = outcome.was_record
    was_tok = was.rpartition(";tok=")[2] if ";tok=" in was else None
    token = outcome.record.rpartition(";tok=")[2]
    decision = outcome.decision
    entry = pending_entry(
        _time_s(),
        job_id,
        uid,
        JobRequest(uid=uid, job_name=name),
        Decision(
            action=decision.action if outcome.cpus_per_tres else "skip",
            cpus_per_tres=None,
            cpus_per_task=None,
            user_msg=None,
            log_msg="",
            admin_comment=outcome.record,
            reason=decision.reason,
        ),
        ns,
        False,
        token=int(token, 16) if token else 0,
        update=outcome.log_msg,
        was_tok=was_tok,
    )
    journal.record(entry)


def current_state() -> HookState | None:
    """For in-process tests and tools: the live state, or None before init."""
    return _state
