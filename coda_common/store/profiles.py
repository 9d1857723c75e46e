"""The profile store: one JSON file per workload signature on a shared file system.

Writers are the node daemons on GPU nodes (``merge_samples``) and admins through
``coda-slurm profiles`` (``write``/``delete``). The one hot reader is the submit hook inside
slurmctld, which keeps a :class:`ProfileCache` fresh from a :class:`Reloader` thread and reads
``cache.snapshot()`` lock-free on every sbatch.

Layout of the directory configured as ``ProfileStore=`` in coda.conf::

    <root>/<first 32 hex of sha256(signature)>.json   one profile, see Profile.to_json_dict
    <root>/.<stem>.<random>.tmp                        a write in progress (or left by a crash)
    <root>/.lock                                       fcntl byte-range locks for merge_samples

Names starting with ``.`` are never read as profiles, so a crash mid-write leaves at most a
dead temp file behind (``ProfileStore.remove_stale_temp_files`` sweeps them).

Why a reader never sees a half-written file: writers create the complete file under a temp
name in the same directory, fsync it, and rename(2) it over the final name. rename(2) replaces
the target atomically ("If newpath already exists, it will be atomically replaced, so that
there is no point at which another process attempting to access newpath will find it
missing"), and on NFS the rename is a single RENAME operation on the server. Readers open the
final name; NFS close-to-open consistency (nfs(5), "DATA AND METADATA COHERENCE") guarantees
that an open() after the writer's close() sees the writer's data.

Why users cannot plant profiles: the reader only accepts regular files owned by root or by
the configured store owner that are not group/other-writable, in a directory that passes the
same test. A file failing this is logged once and ignored. On NFS with root_squash the node
daemons do not write here: they drop munge credentials that the controller merges
(``ProfilePublish=munge``, :mod:`coda_common.publish.dropbox`).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from coda_common.store.multinode import MAX_MULTI_NODE_FIGURES, MultiNodeMeasure, merge_figure
from coda_common.store.request import ProfileView

# UsageRecord is re-exported (``from coda_common.store.profiles import UsageRecord``); it lives
# in a leaf module so that request.ProfileView can carry usage records without importing the store.
from coda_common.store.usage import CpuUsageRecord as CpuUsageRecord
from coda_common.store.usage import UsageRecord as UsageRecord
from coda_common.store.usage import merge_cpu_usage, merge_into
from coda_common.store.usage import usage_for_model as usage_for_model

FORMAT = "coda-profile"
#: Version 2 added ``usage`` (per-GPU-model utilisation, PCIe traffic, progress).
#: Version 1 files (no ``usage`` key) are still read, as ``usage=()``.
#: Version 3 added ``run`` to every sample (which probing run measured it: samples of one run
#: share a scale, see coda_common.model.fit.run_labels). Version 1 and 2 samples are read with
#: ``run=None``.
#: Version 4 added ``cpu_usage`` (the memory bandwidth the workload drew as a CPU job, or null).
#: Earlier files are read with ``cpu_usage=None``.
#: Version 5 added ``multi_node`` (the measured per-node figures of multi-node runs, or
#: null, see coda_common.store.multinode). Earlier files are read with ``multi_node=None``.
#: Version 6 added ``starved`` to ``multi_node`` (per kept figure, whether it was
#: starved); version 5 figures are read as not starved.
#: Writers write 6, or the oldest version that holds the profile (Profile.to_json_dict).
FORMAT_VERSION = 6

#: Name of the lock file (dot-prefixed, so readers skip it).
LOCK_FILE_NAME = ".lock"

#: A profile file larger than this is refused unread: it cannot be one we wrote (a few hundred
#: samples are ~50 KiB) and parsing it would stall slurmctld.
MAX_PROFILE_FILE_BYTES = 1 << 20

#: merge_samples keeps the most recent this many samples per profile (n_samples keeps
#: counting), so files and parse times stay bounded.
DEFAULT_MAX_SAMPLES = 256

#: ``log(level, message)``; level is ``"error"`` or ``"info"`` (names hook.py's _LEVELS knows).
LogFn = Callable[[str, str], None]

#: (st_ino, st_size, st_mtime_ns, st_ctime_ns) of a profile file. The inode changes on every
#: atomic replace; size and mtime catch in-place edits (and inode reuse); ctime catches
#: chmod/chown, which matter for the ownership check.
StatKey = tuple[int, int, int, int]

_STEM_HEX_CHARS = 32
_PROFILE_NAME_RE = re.compile(r"[0-9a-f]{32}\.json", re.ASCII)
_SIGNATURE_RE = re.compile(
    r"(?:workload:(?:[0-9]+|\*):(?P<name>.+)|script:[0-9]+:[0-9a-f]{16})", re.ASCII | re.DOTALL
)
_CONTROL_CHARS_RE = re.compile(r"[\x00-\x1f\x7f]")
#: A sample's run id: printable ASCII without whitespace (it is shown in tables and logs).
MAX_RUN_ID_CHARS = 128
_RUN_ID_RE = re.compile(r"[\x21-\x7e]+", re.ASCII)

# A directory whose mtime is closer to "now" than this may still change within the same
# timestamp tick (ext4 and NFS servers store coarse-grained times), so it is not trusted as
# "settled" and the next refresh scans again (the "racy timestamp" problem git also handles).
_DIR_MTIME_SETTLE_S = 2.0


# --------------------------------------------------------------------------------------------
# Errors


class StoreError(Exception):
    """Base class of the profile store's errors."""


class ProfileFormatError(StoreError, ValueError):
    """A profile (file, import entry or record about to be written) is not usable.

    ``str()`` names the file (or entry) and the problem, ready for a log line.
    """

    def __init__(self, where: str | os.PathLike[str], problem: str) -> None:
        self.path = os.fspath(where)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class UntrustedProfileError(ProfileFormatError):
    """A profile file has the wrong owner or mode (or is not a regular file)."""


class ProfileReadError(ProfileFormatError):
    """A profile file could not be opened or read (I/O error, permissions): worth a retry."""


class StoreUnavailable(StoreError):
    """The store directory itself cannot be listed (or is insecure): keep the old snapshot."""


class StoreLockTimeout(StoreError, TimeoutError):
    """Another writer held a profile's lock for longer than ``lock_timeout_s``."""


# --------------------------------------------------------------------------------------------
# Records


def profile_stem(signature: str) -> str:
    """The file name stem of ``signature``: the first 32 hex digits of its sha256."""
    return hashlib.sha256(signature.encode("utf-8")).hexdigest()[:_STEM_HEX_CHARS]


def signature_problem(signature: object) -> str | None:
    """Why ``signature`` is not a valid signature, or None when it is."""
    if not isinstance(signature, str):
        return f"signature must be a string, got {_json_type(signature)}"
    if _CONTROL_CHARS_RE.search(signature):
        return f"signature {signature!r} contains control characters"
    if not _SIGNATURE_RE.fullmatch(signature):
        return (
            f"signature {signature!r} is not workload:<uid>:<NAME>, workload:*:<NAME> "
            "or script:<uid>:<16 hex digits>"
        )
    return None


def workload_of_signature(signature: str) -> str | None:
    """The ``<NAME>`` of a ``workload:`` signature, None for other kinds."""
    m = _SIGNATURE_RE.fullmatch(signature)
    return m.group("name") if m else None


def run_id_problem(run: object) -> str | None:
    """Why ``run`` is not a valid sample run id (None is valid), or None when it is: the
    end of a sentence starting with the field's name (``samples[3].run must be ...``)."""
    if run is None:
        return None
    if not isinstance(run, str):
        return f"must be a string or null, got {_json_type(run)}"
    if not 1 <= len(run) <= MAX_RUN_ID_CHARS:
        return f"must be 1 to {MAX_RUN_ID_CHARS} characters, got {len(run)}"
    if not _RUN_ID_RE.fullmatch(run):
        return f"must be printable ASCII without whitespace, got {_json_type(run)}"
    return None


@dataclass(frozen=True, slots=True)
class Sample:
    """One measured job step: ``throughput`` achieved with ``cores`` CPU cores per GPU.

    ``run``: which probing run measured this sample; samples of one run share a scale.
    None: unknown (written by hand, or by a version before 3).
    """

    cores: float
    throughput: float
    gpus: int
    nodes: int
    gpu_model: str | None = None
    node: str | None = None
    run: str | None = None

    _KEYS_V2 = ("cores", "throughput", "gpus", "nodes", "gpu_model", "node")
    _KEYS = (*_KEYS_V2, "run")

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "cores": self.cores,
            "throughput": self.throughput,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "gpu_model": self.gpu_model,
            "node": self.node,
            "run": self.run,
        }

    @classmethod
    def from_json_dict(
        cls, d: object, where: str, key: str = "sample", version: int = FORMAT_VERSION
    ) -> Sample:
        """Validate one sample object of a ``version`` file; ``key`` (e.g. ``samples[3]``)
        prefixes problems."""
        if not isinstance(d, dict):
            raise ProfileFormatError(where, f"{key} must be an object, got {_json_type(d)}")
        # Versions 1 and 2 had no run ids; version 3 samples must carry the key (maybe null).
        _check_keys(d, cls._KEYS_V2 if version < 3 else cls._KEYS, where, key)
        return cls(
            cores=_get_number(d, "cores", where, key, lo=0.0),
            throughput=_get_number(d, "throughput", where, key, lo=0.0),
            gpus=_get_int(d, "gpus", where, key, lo=1),
            nodes=_get_int(d, "nodes", where, key, lo=1),
            gpu_model=_get_str(d, "gpu_model", where, key, nullable=True),
            node=_get_str(d, "node", where, key, nullable=True),
            run=_get_run(d, where, key),
        )


_USAGE_KEYS = (
    "gpu_model",
    "gpu_util",
    "gpu_mem_bw_util",
    "pcie_bytes_per_s_per_gpu",
    "iter_per_s_per_gpu",
    "ticks",
    "updated_unix_s",
)


def usage_to_json_dict(record: UsageRecord) -> dict[str, Any]:
    """One ``usage`` list entry of the on-disk format."""
    return {
        "gpu_model": record.gpu_model,
        "gpu_util": record.gpu_util,
        "gpu_mem_bw_util": record.gpu_mem_bw_util,
        "pcie_bytes_per_s_per_gpu": record.pcie_bytes_per_s_per_gpu,
        "iter_per_s_per_gpu": record.iter_per_s_per_gpu,
        "ticks": record.ticks,
        "updated_unix_s": record.updated_unix_s,
    }


def usage_from_json_dict(d: object, where: str, key: str = "usage") -> UsageRecord:
    """Validate one ``usage`` entry strictly; ``key`` (e.g. ``usage[0]``) prefixes problems."""
    if not isinstance(d, dict):
        raise ProfileFormatError(where, f"{key} must be an object, got {_json_type(d)}")
    _check_keys(d, _USAGE_KEYS, where, key)
    return UsageRecord(
        gpu_model=_get_str(d, "gpu_model", where, key, nullable=True),
        gpu_util=_get_number(d, "gpu_util", where, key, lo=0.0, hi=1.0),
        gpu_mem_bw_util=_get_number(d, "gpu_mem_bw_util", where, key, lo=0.0, hi=1.0),
        pcie_bytes_per_s_per_gpu=_get_number(
            d, "pcie_bytes_per_s_per_gpu", where, key, lo=0.0, nullable=True
        ),
        iter_per_s_per_gpu=_get_number(d, "iter_per_s_per_gpu", where, key, lo=0.0, nullable=True),
        ticks=_get_int(d, "ticks", where, key, lo=1),
        updated_unix_s=_get_number(d, "updated_unix_s", where, key, lo=0.0),
    )


_CPU_USAGE_KEYS = ("mem_bw_bytes_per_s_per_cpu", "ticks", "updated_unix_s")


def cpu_usage_to_json_dict(record: CpuUsageRecord | None) -> dict[str, Any] | None:
    """The ``cpu_usage`` value of the on-disk format."""
    if record is None:
        return None
    return {
        "mem_bw_bytes_per_s_per_cpu": record.mem_bw_bytes_per_s_per_cpu,
        "ticks": record.ticks,
        "updated_unix_s": record.updated_unix_s,
    }


def cpu_usage_from_json_dict(d: object, where: str) -> CpuUsageRecord | None:
    """Validate the ``cpu_usage`` value strictly (null: never measured)."""
    if d is None:
        return None
    key = "cpu_usage"
    if not isinstance(d, dict):
        raise ProfileFormatError(where, f"{key} must be an object or null, got {_json_type(d)}")
    _check_keys(d, _CPU_USAGE_KEYS, where, key)
    return CpuUsageRecord(
        mem_bw_bytes_per_s_per_cpu=_get_number(d, "mem_bw_bytes_per_s_per_cpu", where, key, lo=0.0),
        ticks=_get_int(d, "ticks", where, key, lo=1),
        updated_unix_s=_get_number(d, "updated_unix_s", where, key, lo=0.0),
    )


_MULTI_NODE_KEYS_V5 = ("figures_cores_per_gpu", "n_figures", "updated_unix_s")
_MULTI_NODE_KEYS = (*_MULTI_NODE_KEYS_V5, "starved")


def multi_node_to_json_dict(measure: MultiNodeMeasure | None) -> dict[str, Any] | None:
    """The ``multi_node`` value of the on-disk format (version 6: with ``starved``)."""
    if measure is None:
        return None
    return {
        "figures_cores_per_gpu": list(measure.figures_cores_per_gpu),
        "n_figures": measure.n_figures,
        "updated_unix_s": measure.updated_unix_s,
        "starved": [
            bool(measure.starved and measure.starved[i])
            for i in range(len(measure.figures_cores_per_gpu))
        ],
    }


def multi_node_from_json_dict(d: object, where: str, version: int) -> MultiNodeMeasure | None:
    """Validate the ``multi_node`` value of a version ``version`` file strictly (null: no
    multi-node run measured)."""
    if d is None:
        return None
    key = "multi_node"
    if not isinstance(d, dict):
        raise ProfileFormatError(where, f"{key} must be an object or null, got {_json_type(d)}")
    _check_keys(d, _MULTI_NODE_KEYS if version >= 6 else _MULTI_NODE_KEYS_V5, where, key)
    raw = d["figures_cores_per_gpu"]
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_MULTI_NODE_FIGURES:
        raise ProfileFormatError(
            where,
            f"{key}.figures_cores_per_gpu must be a list of 1 to {MAX_MULTI_NODE_FIGURES} "
            f"numbers, got {_json_type(raw)}",
        )
    figures = tuple(
        _get_number(
            {f"figures_cores_per_gpu[{i}]": f}, f"figures_cores_per_gpu[{i}]", where, key, lo=0.0
        )
        for i, f in enumerate(raw)
    )
    n_figures = _get_int(d, "n_figures", where, key, lo=len(figures))
    starved: tuple[bool, ...] = ()
    if version >= 6:
        flags = d["starved"]
        if (
            not isinstance(flags, list)
            or len(flags) != len(figures)
            or not all(type(f) is bool for f in flags)
        ):
            raise ProfileFormatError(
                where,
                f"{key}.starved must be a list of {len(figures)} booleans, one per figure",
            )
        starved = tuple(flags) if any(flags) else ()
    return MultiNodeMeasure(
        figures_cores_per_gpu=figures,
        n_figures=n_figures,
        updated_unix_s=_get_number(d, "updated_unix_s", where, key, lo=0.0),
        starved=starved,
    )


def _usage_tuple(raw: object, where: str) -> tuple[UsageRecord, ...]:
    if not isinstance(raw, list):
        raise ProfileFormatError(where, f"usage must be a list, got {_json_type(raw)}")
    records = tuple(usage_from_json_dict(u, where, f"usage[{i}]") for i, u in enumerate(raw))
    seen: dict[str | None, int] = {}
    for i, r in enumerate(records):
        model = None if r.gpu_model is None else r.gpu_model.lower()
        if model in seen:
            raise ProfileFormatError(
                where,
                f"usage[{i}]: a second record for GPU model {r.gpu_model!r} "
                f"(usage[{seen[model]}] has it; one record per model)",
            )
        seen[model] = i
    return records


@dataclass(frozen=True, slots=True)
class Profile:
    """One workload's CPU-demand profile, as stored in ``<root>/<stem>.json``.

    ``n_samples`` counts every sample ever merged; ``samples`` holds the most recent ones.
    ``fit`` is the model's free-form JSON object (read-only mapping), or None.
    ``usage`` holds at most one :class:`UsageRecord` per GPU model (compared
    case-insensitively); :meth:`ProfileStore.merge_usage` keeps it that way.
    """

    signature: str
    workload: str
    cpus_per_gpu: int
    confidence: float
    n_samples: int
    updated_unix_s: float
    source: str
    multi_node_cpus_per_gpu: int | None = None
    gpu_model: str | None = None
    samples: tuple[Sample, ...] = ()
    fit: Mapping[str, Any] | None = None
    usage: tuple[UsageRecord, ...] = ()
    cpu_usage: CpuUsageRecord | None = None
    multi_node: MultiNodeMeasure | None = None

    _KEYS_V1 = (
        "format",
        "format_version",
        "signature",
        "workload",
        "cpus_per_gpu",
        "confidence",
        "n_samples",
        "multi_node_cpus_per_gpu",
        "gpu_model",
        "updated_unix_s",
        "source",
        "samples",
        "fit",
    )
    _KEYS_V3 = (*_KEYS_V1, "usage")
    _KEYS_V4 = (*_KEYS_V3, "cpu_usage")
    _KEYS = (*_KEYS_V4, "multi_node")

    @property
    def stem(self) -> str:
        return profile_stem(self.signature)

    def to_json_dict(self) -> dict[str, Any]:
        """The on-disk JSON object (fresh plain dicts/lists, safe to mutate), in the oldest
        version that holds the profile: without a measured multi-node figure version 4, with
        one but no starved figure kept version 5, which the coda before each reads. A
        node upgraded before its controller does not make the profiles it merges unreadable
        to the hook until it merges what only the newer format holds."""
        d = self._json_latest()
        if self.multi_node is None:
            del d["multi_node"]
            d["format_version"] = 4
        elif not self.multi_node.starved:
            del d["multi_node"]["starved"]
            d["format_version"] = 5
        return d

    def _json_latest(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "signature": self.signature,
            "workload": self.workload,
            "cpus_per_gpu": self.cpus_per_gpu,
            "confidence": self.confidence,
            "n_samples": self.n_samples,
            "multi_node_cpus_per_gpu": self.multi_node_cpus_per_gpu,
            "gpu_model": self.gpu_model,
            "updated_unix_s": self.updated_unix_s,
            "source": self.source,
            "samples": [s.to_json_dict() for s in self.samples],
            "fit": None if self.fit is None else _thaw(self.fit),
            "usage": [usage_to_json_dict(u) for u in self.usage],
            "cpu_usage": cpu_usage_to_json_dict(self.cpu_usage),
            "multi_node": multi_node_to_json_dict(self.multi_node),
        }

    @classmethod
    def from_json_dict(cls, d: object, source_path: str | os.PathLike[str]) -> Profile:
        """Validate a decoded JSON object strictly; raise ProfileFormatError naming
        ``source_path`` (a file, or e.g. ``"import.json entry 3"``) and the problem."""
        where = os.fspath(source_path)
        if not isinstance(d, dict):
            raise ProfileFormatError(where, f"expected a JSON object, got {_json_type(d)}")
        version = _format_version(d, where)
        # Version 1 had no usage records; version 2 files must carry the key (maybe empty);
        # version 4 files the cpu_usage key (maybe null), version 5 the multi_node key
        # (version 6: the same keys, multi_node with starved).
        keys = (cls._KEYS_V1, cls._KEYS_V3, cls._KEYS_V3, cls._KEYS_V4, cls._KEYS, cls._KEYS)[
            version - 1
        ]
        _check_keys(d, keys, where, None)

        problem = signature_problem(d["signature"])
        if problem:
            raise ProfileFormatError(where, problem)
        samples = _samples_from_json(d["samples"], where, version)
        fit = _fit_from_json(d["fit"], where)
        confidence = _get_number(d, "confidence", where, None, lo=0.0)
        if confidence > 1.0:
            raise ProfileFormatError(where, f"confidence must be within 0..1, got {confidence!r}")
        return cls(
            signature=d["signature"],
            workload=_get_str(d, "workload", where, None),
            cpus_per_gpu=_get_int(d, "cpus_per_gpu", where, None, lo=1),
            confidence=confidence,
            n_samples=_get_int(d, "n_samples", where, None, lo=0),
            multi_node_cpus_per_gpu=_get_int(
                d, "multi_node_cpus_per_gpu", where, None, lo=1, nullable=True
            ),
            gpu_model=_get_str(d, "gpu_model", where, None, nullable=True),
            updated_unix_s=_get_number(d, "updated_unix_s", where, None, lo=0.0),
            source=_get_str(d, "source", where, None),
            samples=samples,
            fit=fit,
            usage=() if version == 1 else _usage_tuple(d["usage"], where),
            cpu_usage=cpu_usage_from_json_dict(d["cpu_usage"], where) if version >= 4 else None,
            multi_node=(
                multi_node_from_json_dict(d["multi_node"], where, version) if version >= 5 else None
            ),
        )

    def validated(self, where: str = "profile to write") -> Profile:
        """Round-trip through the JSON form: the strict reader's verdict before a write."""
        return Profile.from_json_dict(self.to_json_dict(), where)


def _format_version(d: dict[str, Any], where: str) -> int:
    """The ``format_version`` of a profile's JSON object, once it is known to be a coda
    profile of a version this coda reads; raises ProfileFormatError otherwise."""
    if d.get("format") != FORMAT:
        if "format" not in d:
            raise ProfileFormatError(where, f'not a coda profile (no "format": "{FORMAT}")')
        raise ProfileFormatError(
            where, f'not a coda profile ("format" is {d["format"]!r}, expected "{FORMAT}")'
        )
    version = d.get("format_version")
    if not _is_int(version):
        raise ProfileFormatError(
            where, f"format_version must be an integer, got {_json_repr(version)}"
        )
    if version > FORMAT_VERSION:
        raise ProfileFormatError(
            where,
            f"format_version {version} was written by a newer coda (this one reads "
            f"version {FORMAT_VERSION}); upgrade coda-slurm on the controller",
        )
    if version < 1:
        raise ProfileFormatError(
            where,
            f"format_version {version} was never written by any coda (this one reads "
            f"versions 1 to {FORMAT_VERSION}); fix or delete the file",
        )
    return version


def _samples_from_json(samples_raw: object, where: str, version: int) -> tuple[Sample, ...]:
    """A profile's ``samples`` list, each one validated as ``version`` writes them."""
    if not isinstance(samples_raw, list):
        raise ProfileFormatError(where, f"samples must be a list, got {_json_type(samples_raw)}")
    return tuple(
        Sample.from_json_dict(s, where, f"samples[{i}]", version) for i, s in enumerate(samples_raw)
    )


def _fit_from_json(fit: object, where: str) -> Mapping[str, Any] | None:
    """A profile's ``fit`` object as a read-only mapping, or None for null."""
    if fit is not None and not isinstance(fit, dict):
        raise ProfileFormatError(where, f"fit must be an object or null, got {_json_type(fit)}")
    if fit is not None and _json_depth(fit, MAX_FIT_DEPTH) > MAX_FIT_DEPTH:
        # Every reader (profiles show/export, json.dumps) recurses into it.
        raise ProfileFormatError(where, f"fit is nested deeper than {MAX_FIT_DEPTH} levels")
    return None if fit is None else MappingProxyType(fit)


def _sample_records(new_samples: Iterable[Sample]) -> tuple[Sample, ...]:
    """``new_samples`` as a tuple, once each is known to be a :class:`Sample`."""
    added = tuple(new_samples)
    for s in added:
        if not isinstance(s, Sample):
            raise TypeError(f"merge_samples wants Sample records, got {type(s).__name__}")
    return added


def _placeholder_profile(
    signature: str, workload: str | None, source: str | None, now_unix_s: float
) -> Profile:
    """The profile a first merge starts from: no samples, 1 CPU per GPU, no confidence."""
    return Profile(
        signature=signature,
        workload=workload or workload_of_signature(signature) or signature,
        cpus_per_gpu=1,
        confidence=0.0,
        n_samples=0,
        updated_unix_s=now_unix_s,
        source=source or "coda-node",
    )


def to_view(profile: Profile) -> ProfileView:
    """The part of a profile the submit policy reads."""
    return ProfileView(
        signature=profile.signature,
        workload=profile.workload,
        cpus_per_gpu=profile.cpus_per_gpu,
        confidence=profile.confidence,
        n_samples=profile.n_samples,
        multi_node_cpus_per_gpu=profile.multi_node_cpus_per_gpu,
        usage=profile.usage,
        cpu_usage=profile.cpu_usage,
        multi_node_measured_cores_per_gpu=(
            None
            if profile.multi_node is None
            else profile.multi_node.published_cores_per_gpu(
                # A placeholder (confidence 0, no single-node fit) bounds nothing.
                profile.cpus_per_gpu if profile.confidence > 0 else None
            )
        ),
        multi_node_runs=0 if profile.multi_node is None else profile.multi_node.n_figures,
    )


def encode_profile(profile: Profile) -> bytes:
    """The exact bytes ``ProfileStore.write`` stores (validates first)."""
    profile.validated()
    text = json.dumps(profile.to_json_dict(), indent=1, allow_nan=False)
    return (text + "\n").encode("utf-8")


def decode_profile(data: bytes, where: str | os.PathLike[str]) -> Profile:
    """Parse profile file contents; every problem becomes a ProfileFormatError."""
    if not data.strip():
        raise ProfileFormatError(where, "empty file (truncated?)")
    try:
        obj = _load_json(data)
    except RecursionError as exc:
        raise ProfileFormatError(where, "not valid JSON (nested too deeply)") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, NaN/Infinity
        raise ProfileFormatError(where, f"not valid JSON (truncated or corrupt?): {exc}") from exc
    return Profile.from_json_dict(obj, where)


def _load_json(data: bytes) -> Any:
    # Module-level so tests can count parses. NaN/Infinity are not JSON (RFC 8259 §6).
    return json.loads(data, parse_constant=_reject_constant)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_thaw(v) for v in value]
    return value


# -- strict field checks ------------------------------------------------------------------------


MAX_FIT_DEPTH = 16
"""Deepest nesting of a profile's ``fit`` object that is accepted (the model writes 2)."""


def _json_depth(value: object, limit: int) -> int:
    """Nesting depth of a JSON value (a scalar is 0), counted no further than ``limit + 1``;
    iterative, so a hostile file cannot exhaust the stack here either."""
    depth = 0
    level = [value]
    while level and depth <= limit:
        nested = [
            child
            for item in level
            if isinstance(item, dict | list)
            for child in (item.values() if isinstance(item, dict) else item)
        ]
        if not any(isinstance(item, dict | list) for item in level):
            break
        depth += 1
        level = nested
    return depth


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _json_repr(value: object) -> str:
    return "nothing" if value is None else _json_type(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_keys(d: dict[str, Any], keys: tuple[str, ...], where: str, prefix: str | None) -> None:
    missing = [k for k in keys if k not in d]
    unknown = sorted(str(k) for k in d if k not in keys)
    if missing or unknown:
        parts = []
        if missing:
            parts.append("missing key(s) " + ", ".join(missing))
        if unknown:
            parts.append("unknown key(s) " + ", ".join(unknown))
        what = f"{prefix}: " if prefix else ""
        raise ProfileFormatError(where, what + "; ".join(parts))


def _field(prefix: str | None, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _get_int(
    d: dict[str, Any], key: str, where: str, prefix: str | None, *, lo: int, nullable: bool = False
) -> Any:
    value = d[key]
    if value is None and nullable:
        return None
    if not _is_int(value) or value < lo:
        null = " or null" if nullable else ""
        raise ProfileFormatError(
            where,
            f"{_field(prefix, key)} must be an integer >= {lo}{null}, got {_json_type(value)}",
        )
    return value


def _get_number(
    d: dict[str, Any],
    key: str,
    where: str,
    prefix: str | None,
    *,
    lo: float,
    hi: float | None = None,
    nullable: bool = False,
) -> Any:
    value = d[key]
    if value is None and nullable:
        return None
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < lo
        or (hi is not None and value > hi)
    ):
        bounds = f">= {lo:g}" if hi is None else f"within {lo:g}..{hi:g}"
        null = " or null" if nullable else ""
        raise ProfileFormatError(
            where,
            f"{_field(prefix, key)} must be a number {bounds}{null}, got {_json_type(value)}",
        )
    return float(value)


def _get_run(d: dict[str, Any], where: str, prefix: str) -> str | None:
    """A sample's ``run`` (absent before version 3: None)."""
    value = d.get("run")
    problem = run_id_problem(value)
    if problem:
        raise ProfileFormatError(where, f"{_field(prefix, 'run')} {problem}")
    return value


def _get_str(
    d: dict[str, Any], key: str, where: str, prefix: str | None, *, nullable: bool = False
) -> Any:
    value = d[key]
    if value is None and nullable:
        return None
    if not isinstance(value, str) or not value:
        null = " or null" if nullable else ""
        raise ProfileFormatError(
            where,
            f"{_field(prefix, key)} must be a non-empty string{null}, got {_json_type(value)}",
        )
    if _CONTROL_CHARS_RE.search(value):
        # These strings end up in slurmctld's log and in admins' terminals.
        raise ProfileFormatError(where, f"{_field(prefix, key)} contains control characters")
    return value


# --------------------------------------------------------------------------------------------
# Reading one file safely


def default_trusted_uids(owner_uid: int | None = None) -> frozenset[int]:
    """root, plus the store owner (default: the effective uid of this process)."""
    return frozenset({0, os.geteuid() if owner_uid is None else owner_uid})


def _stat_key(st: os.stat_result) -> StatKey:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _trust_problem(st: os.stat_result, trusted_uids: frozenset[int], kind: str) -> str | None:
    if st.st_uid not in trusted_uids:
        uids = ", ".join(str(u) for u in sorted(trusted_uids))
        return (
            f"{kind} is owned by uid {st.st_uid}, not by a trusted uid ({uids}); "
            "only root or the store owner may write profiles"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"{kind} is group/other-writable (mode {stat.S_IMODE(st.st_mode):04o}); "
            "users could plant profiles: chmod go-w it"
        )
    return None


def read_profile_file(path: Path, trusted_uids: frozenset[int]) -> Profile:
    """Read and validate one profile file.

    Raises FileNotFoundError if it vanished (a racing delete), ProfileFormatError for every
    other problem (UntrustedProfileError for owner/mode/file-type problems).
    """
    return _read_profile_file(path, trusted_uids)[0]


def _read_profile_file(path: Path, trusted_uids: frozenset[int]) -> tuple[Profile, StatKey]:
    # O_NOFOLLOW: a symlink is refused (ELOOP) rather than followed to a file we would not
    # trust. O_NONBLOCK: a FIFO under a profile name cannot hang slurmctld in open(2).
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedProfileError(path, "is a symbolic link; profiles must be files") from exc
        raise ProfileReadError(path, f"cannot open: {exc.strerror}") from exc
    try:
        # Check the opened file, not the name: nothing can be swapped in between (no TOCTOU).
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedProfileError(path, "is not a regular file")
        problem = _trust_problem(st, trusted_uids, "file")
        if problem:
            raise UntrustedProfileError(path, problem)
        if st.st_size > MAX_PROFILE_FILE_BYTES:
            raise ProfileFormatError(
                path, f"is {st.st_size} bytes, more than {MAX_PROFILE_FILE_BYTES}; not a profile"
            )
        try:
            data = _read_all(fd, MAX_PROFILE_FILE_BYTES + 1)
        except OSError as exc:
            raise ProfileReadError(path, f"cannot read: {exc.strerror}") from exc
    finally:
        os.close(fd)
    if len(data) > MAX_PROFILE_FILE_BYTES:
        raise ProfileFormatError(path, f"is more than {MAX_PROFILE_FILE_BYTES} bytes")
    profile = decode_profile(data, path)
    if path.name != f"{profile.stem}.json":
        raise ProfileFormatError(
            path,
            f"file name does not match its signature {profile.signature!r} (expected "
            f"{profile.stem}.json); add profiles with `coda-slurm profiles import`",
        )
    return profile, _stat_key(st)


def _read_all(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while total < limit:
        chunk = os.read(fd, min(1 << 16, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _fsync_dir(path: Path) -> None:
    """Make a rename/unlink in ``path`` durable (fsync(2) on the directory, as the man page
    says is needed for the directory entry itself)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some file systems cannot fsync a directory (EINVAL); the rename is then as durable
        # as that file system makes it, which is all we can do.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# Writers


# POSIX record locks belong to the process, not the file descriptor: two threads of one process
# would both "get" the lock, and closing any descriptor of the lock file drops all the process's
# locks on it (fcntl(2), "Advisory record locking"). So threads of one process serialize here
# first, and each locked section opens and closes the lock file exactly once.
_PROCESS_LOCK = threading.Lock()


class ProfileStore:
    """Read/write access to the profile directory, for node daemons and the admin CLI.

    ``owner_uid``: the uid trusted besides root when reading (default: this process's uid).
    """

    def __init__(
        self, root: Path, *, owner_uid: int | None = None, lock_timeout_s: float = 30.0
    ) -> None:
        self.root = Path(root)
        self.trusted_uids = default_trusted_uids(owner_uid)
        self.lock_timeout_s = lock_timeout_s

    def __repr__(self) -> str:
        return f"ProfileStore({str(self.root)!r})"

    def path_for(self, signature: str) -> Path:
        return self.root / f"{profile_stem(signature)}.json"

    def ensure_root(self) -> Path:
        """Create the store directory (mode 0755, parents as needed) if it does not exist."""
        try:
            self.root.mkdir(mode=0o755, parents=True)
        except FileExistsError:
            return self.root
        # mkdir(2) applies the umask; readers require exactly "not group/other-writable",
        # and other nodes' daemons need to read it, so set the mode explicitly.
        os.chmod(self.root, 0o755)
        return self.root

    # -- reads ----------------------------------------------------------------------------------

    def read(self, signature: str) -> Profile | None:
        """The stored profile, None if there is none; ProfileFormatError if it is unusable."""
        try:
            return read_profile_file(self.path_for(signature), self.trusted_uids)
        except FileNotFoundError:
            return None

    def iter_profiles(self) -> Iterator[tuple[Path, Profile | ProfileFormatError]]:
        """Every profile file, in file-name order, with its profile or why it is unusable.

        Raises StoreUnavailable if the directory cannot be listed.
        """
        try:
            with os.scandir(self.root) as it:
                names = sorted(e.name for e in it if _PROFILE_NAME_RE.fullmatch(e.name))
        except OSError as exc:
            raise StoreUnavailable(
                f"cannot list profile store {self.root}: {exc.strerror}"
            ) from exc
        for name in names:
            path = self.root / name
            try:
                yield path, read_profile_file(path, self.trusted_uids)
            except FileNotFoundError:
                continue  # deleted while we listed
            except ProfileFormatError as exc:
                yield path, exc

    # -- writes ---------------------------------------------------------------------------------

    def write(self, profile: Profile) -> Path:
        """Store ``profile`` atomically (replacing any previous one); returns its path.

        Raises ProfileFormatError (before touching the disk) if the reader would reject it.
        """
        data = encode_profile(profile)
        with self._locked(profile.signature):
            return self._write_locked(profile.signature, data)

    def delete(self, signature: str) -> bool:
        """Remove the profile of ``signature``; False if there was none."""
        path = self.path_for(signature)
        with self._locked(signature):
            try:
                os.unlink(path)
            except FileNotFoundError:
                return False
            _fsync_dir(self.root)
        return True

    def merge_samples(
        self,
        signature: str,
        new_samples: Iterable[Sample],
        refit: Callable[[Profile], Profile] | None = None,
        *,
        workload: str | None = None,
        source: str | None = None,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        now_unix_s: float | None = None,
    ) -> Profile:
        """Append ``new_samples`` to the profile of ``signature`` without losing concurrent
        writers' samples; returns the profile written.

        Under the signature's lock: read the current profile, build a candidate with the
        merged samples (the most recent ``max_samples`` kept; ``n_samples`` += the new ones;
        ``updated_unix_s`` = now; ``source`` replaced if given), pass it to ``refit`` (which
        returns the profile to store, typically ``dataclasses.replace(candidate,
        cpus_per_gpu=..., confidence=..., fit=...)``), and write the result.

        A profile that does not exist yet is created from a placeholder (cpus_per_gpu 1,
        confidence 0, ``workload`` or the signature's NAME), which needs ``refit``: without
        one, ValueError. An existing but unusable file raises ProfileFormatError and is left
        alone (it may hold samples, or be from a newer coda).
        """
        added = _sample_records(new_samples)
        problem = signature_problem(signature)
        if problem:
            raise ValueError(problem)
        if max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {max_samples}")
        now = time.time() if now_unix_s is None else now_unix_s
        with self._locked(signature):
            current = self.read(signature)
            if current is None:
                if refit is None:
                    raise ValueError(
                        f"no profile for {signature!r} yet, and no refit function to create one"
                    )
                current = _placeholder_profile(signature, workload, source, now)
            merged = (current.samples + added)[-max_samples:]
            candidate = replace(
                current,
                samples=merged,
                n_samples=current.n_samples + len(added),
                updated_unix_s=now,
                source=source or current.source,
            )
            result = refit(candidate) if refit is not None else candidate
            if result.signature != signature:
                raise ValueError(
                    f"refit changed the signature from {signature!r} to {result.signature!r}"
                )
            self._write_locked(signature, encode_profile(result))
            return result

    def merge_usage(self, signature: str, record: UsageRecord) -> Profile | None:
        """Merge one usage record into the profile of ``signature``; returns the profile
        written, or None (nothing written) when there is no profile for ``signature``.

        Under the signature's lock, like :meth:`merge_samples`: the stored record of the same
        GPU model (compared case-insensitively) becomes the ticks-weighted mean of old and new
        (a field only one of them measured keeps that value; ticks add; the newer
        ``updated_unix_s`` wins); records of other models are kept. ``updated_unix_s`` of the
        profile itself is left alone: it dates the CPU prediction, which this does not change.
        Raises ProfileFormatError for an unusable existing file (left alone) or a record the
        reader would reject (nothing written).
        """
        if not isinstance(record, UsageRecord):
            raise TypeError(f"merge_usage wants a UsageRecord, got {type(record).__name__}")

        def merged(current: Profile | None) -> Profile | None:
            if current is None:
                return None
            return replace(current, usage=merge_into(current.usage, record))

        return self._update(signature, merged)

    def merge_cpu_usage(self, signature: str, record: CpuUsageRecord) -> Profile:
        """Merge one CPU-job memory-bandwidth record into the profile of ``signature``;
        returns the profile written.

        Under the signature's lock, like :meth:`merge_usage`: the stored record becomes the
        ticks-weighted mean of old and new. A CPU workload has no GPU profile, so one that
        does not exist yet is created from the placeholder :meth:`merge_samples` also uses
        (cpus_per_gpu 1, confidence 0, no samples: the submit hook never takes it for a CPU
        prediction), with ``source`` ``cpu-usage``. Raises ProfileFormatError for an
        unusable existing file (left alone) or a record the reader would reject (nothing
        written).
        """
        if not isinstance(record, CpuUsageRecord):
            raise TypeError(f"merge_cpu_usage wants a CpuUsageRecord, got {type(record).__name__}")

        def merged(current: Profile | None) -> Profile:
            if current is None:
                current = Profile(
                    signature=signature,
                    workload=workload_of_signature(signature) or signature,
                    cpus_per_gpu=1,
                    confidence=0.0,
                    n_samples=0,
                    updated_unix_s=record.updated_unix_s,
                    source="cpu-usage",
                )
            return replace(current, cpu_usage=merge_cpu_usage(current.cpu_usage, record))

        result = self._update(signature, merged)
        assert result is not None  # merged() always gives a profile
        return result

    def merge_multi_node(
        self, signature: str, cores_per_gpu: float, now_unix_s: float, starved: bool = False
    ) -> Profile:
        """Merge one per-node figure of a multi-node run (cores per GPU used,
        :func:`coda_common.store.multinode.summary_figure`; ``starved``:
        :func:`coda_common.store.multinode_merge.summary_starved`) into the profile of
        ``signature``; returns the profile written.

        Under the signature's lock, like :meth:`merge_usage`; the profile's ``multi_node``
        keeps the last figures (:func:`coda_common.store.multinode.merge_figure`).
        ``updated_unix_s`` of the profile is left alone (it dates the single-node
        prediction). A workload with no profile yet gets one: the placeholder
        :meth:`merge_samples` starts from (cpus_per_gpu 1, confidence 0, no samples), with
        ``source`` ``multi-node``, so that workloads that only ever run on several nodes are
        measured too; its confidence 0 keeps single-node jobs of the workload unprofiled
        (under any MinConfidence above 0),
        and only a multi-node job reads the figure (``MultiNodeMinSamples``). Raises
        ProfileFormatError for an unusable existing file (left alone), ValueError for a
        figure that is not a number >= 0.
        """

        def merged(current: Profile | None) -> Profile:
            if current is None:
                current = _placeholder_profile(signature, None, "multi-node", now_unix_s)
            measure = merge_figure(current.multi_node, cores_per_gpu, now_unix_s, starved)
            return replace(current, multi_node=measure)

        result = self._update(signature, merged)
        assert result is not None  # merged() always gives a profile
        return result

    def _update(
        self, signature: str, change: Callable[[Profile | None], Profile | None]
    ) -> Profile | None:
        """Under the signature's lock: read its profile (None when there is none), write
        what ``change`` makes of it (nothing when it gives None) and return that."""
        problem = signature_problem(signature)
        if problem:
            raise ValueError(problem)
        with self._locked(signature):
            result = change(self.read(signature))
            if result is not None:
                self._write_locked(signature, encode_profile(result))
            return result

    def remove_stale_temp_files(self, older_than_s: float = 3600.0) -> int:
        """Delete ``.*.tmp`` files left by writers that crashed; returns how many."""
        removed = 0
        cutoff = time.time() - older_than_s
        with os.scandir(self.root) as it:
            stale = [
                e.path
                for e in it
                if e.name.startswith(".")
                and e.name.endswith(".tmp")
                and e.stat(follow_symlinks=False).st_mtime < cutoff
            ]
        for path in stale:
            try:
                os.unlink(path)
                removed += 1
            except FileNotFoundError:
                continue
        return removed

    # -- internals ------------------------------------------------------------------------------

    def _write_locked(self, signature: str, data: bytes) -> Path:
        final = self.path_for(signature)
        # The temp file lives in the same directory: rename(2) is only atomic within one file
        # system, and its dot prefix keeps readers away from it.
        fd, tmp = tempfile.mkstemp(prefix=f".{final.stem}.", suffix=".tmp", dir=self.root)
        try:
            # mkstemp creates 0600; readers on other hosts (slurmctld as SlurmUser) need 0644.
            os.fchmod(fd, 0o644)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            # Data on disk before the rename makes it visible: after a crash the name points
            # at either the old or the new complete file, never at an empty one (the
            # ext4 "zero-length file after crash" case the rename-without-fsync pattern has).
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink_quietly(tmp)
            raise
        os.close(fd)
        try:
            os.replace(tmp, final)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        _fsync_dir(self.root)
        return final

    @contextmanager
    def _locked(self, signature: str) -> Iterator[None]:
        """Exclusive lock on one signature, across threads, processes and NFS clients.

        One byte of ``.lock`` per signature (offset from its hash), so writers of different
        profiles do not wait on each other. fcntl(2) record locks (which lockf uses on Linux)
        are forwarded to the server on NFS (NLM for v3, built into the v4 protocol); flock(2)
        locks are not reliable there.
        """
        offset = int(profile_stem(signature)[:12], 16)
        deadline = time.monotonic() + self.lock_timeout_s
        with _PROCESS_LOCK:
            fd = os.open(self.root / LOCK_FILE_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                delay_s = 0.001
                while True:
                    try:
                        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset, os.SEEK_SET)
                        break
                    except OSError as exc:
                        if exc.errno not in (errno.EAGAIN, errno.EACCES):
                            raise
                    # Poll rather than block: a blocking lock on a hung NFS server or a
                    # wedged peer would never return.
                    if time.monotonic() >= deadline:
                        raise StoreLockTimeout(
                            f"profile {signature!r} stayed locked for {self.lock_timeout_s:g} s "
                            f"({self.root / LOCK_FILE_NAME})"
                        )
                    time.sleep(delay_s)
                    delay_s = min(delay_s * 2, 0.05)
                try:
                    yield
                finally:
                    fcntl.lockf(fd, fcntl.LOCK_UN, 1, offset, os.SEEK_SET)
            finally:
                os.close(fd)


def _unlink_quietly(path: str) -> None:
    with suppress(FileNotFoundError):
        os.unlink(path)


# --------------------------------------------------------------------------------------------
# The hook's reader


class RefreshStats(NamedTuple):
    scanned: int  # directory entries stat'ed (0 when skipped)
    changed: int  # files (re)parsed successfully: new or updated profiles
    removed: int  # profiles dropped because their file disappeared
    errors: int  # files that failed this time (each logged once per stat key)
    duration_s: float
    skipped: bool  # directory unchanged, nothing listed


@dataclass(slots=True)
class _FileState:
    key: StatKey | None  # stat key last processed, good or bad
    view: ProfileView | None = None  # last good copy; keeps serving through later failures
    retry: bool = False  # last attempt hit an I/O error: try again on the next scan
    logged: tuple[StatKey | None, str] | None = None  # (key, problem) last logged


class ProfileCache:
    """An in-memory snapshot of the store for the submit hook.

    ``refresh()`` is cheap when nothing changed (one stat of the directory) and proportional to
    the change otherwise (one scandir plus a stat per entry, a parse per changed file).
    ``snapshot()`` is a lock-free attribute read, safe from any thread.

    ``log(level, message)`` gets ``"error"`` (a file is ignored) or ``"info"``; it may be
    called from the Reloader thread.

    On NFS, the directory's mtime comes through the attribute cache (acdirmin/acdirmax,
    nfs(5)), so a change may wait for the cache to expire or for the periodic full rescan
    (``full_rescan_every`` refreshes), whichever comes first. The full rescan also catches
    in-place edits, which do not change the directory's mtime.
    """

    def __init__(
        self,
        root: Path,
        log: LogFn,
        *,
        trusted_uids: frozenset[int] | None = None,
        full_rescan_every: int = 12,
    ) -> None:
        if full_rescan_every < 1:
            raise ValueError(f"full_rescan_every must be >= 1, got {full_rescan_every}")
        self.root = Path(root)
        self.log = log
        self.trusted_uids = default_trusted_uids() if trusted_uids is None else trusted_uids
        self.full_rescan_every = full_rescan_every
        self._files: dict[str, _FileState] = {}
        self._ignored_names: set[str] = set()
        self._settled_dir_key: tuple[int, int, int] | None = None
        self._refreshes_since_scan = 0
        self._snapshot: Mapping[str, ProfileView] = MappingProxyType({})
        self._refresh_lock = threading.Lock()

    def snapshot(self) -> Mapping[str, ProfileView]:
        """Signature -> ProfileView; an immutable mapping that is replaced, never changed."""
        return self._snapshot

    def refresh(self) -> RefreshStats:
        """Bring the snapshot up to date with the directory.

        Per-file problems are logged (once per file version) and never raised; the last good
        copy of such a file keeps serving. Raises StoreUnavailable if the directory cannot be
        stat'ed or listed or is insecure; the snapshot is then left as it was.
        """
        with self._refresh_lock:
            return self._refresh()

    def _refresh(self) -> RefreshStats:
        t0 = time.perf_counter()
        st = self._stat_root()
        dir_key = (st.st_dev, st.st_ino, st.st_mtime_ns)
        self._refreshes_since_scan += 1
        if dir_key == self._settled_dir_key and self._refreshes_since_scan < self.full_rescan_every:
            return RefreshStats(0, 0, 0, 0, time.perf_counter() - t0, True)
        entries = self._list_root()

        updates: dict[str, ProfileView | None] = {}  # signature -> new view (None: remove)
        present: set[str] = set()
        scanned, changed, errors = self._scan_entries(entries, present, updates)
        removed = self._forget_missing(present, updates)
        self._ignored_names &= {e.name for e in entries}
        if updates:
            self._publish(updates)

        self._refreshes_since_scan = 0
        mtime_age_s = time.time() - st.st_mtime_ns / 1e9
        self._settled_dir_key = dir_key if mtime_age_s >= _DIR_MTIME_SETTLE_S else None
        return RefreshStats(scanned, changed, removed, errors, time.perf_counter() - t0, False)

    def _stat_root(self) -> os.stat_result:
        """The store directory's stat, once it is known to be a directory to trust."""
        try:
            st = os.stat(self.root)
        except OSError as exc:
            raise StoreUnavailable(
                f"cannot stat profile store {self.root}: {exc.strerror}"
            ) from exc
        if not stat.S_ISDIR(st.st_mode):
            raise StoreUnavailable(f"profile store {self.root} is not a directory")
        problem = _trust_problem(st, self.trusted_uids, "directory")
        if problem:
            raise StoreUnavailable(f"refusing profile store {self.root}: {problem}")
        return st

    def _list_root(self) -> list[os.DirEntry[str]]:
        try:
            with os.scandir(self.root) as it:
                # List everything before acting: an error half-way through the listing must
                # not read as "the other files were deleted".
                return list(it)
        except OSError as exc:
            raise StoreUnavailable(
                f"cannot list profile store {self.root}: {exc.strerror}"
            ) from exc

    def _scan_entries(
        self,
        entries: list[os.DirEntry[str]],
        present: set[str],
        updates: dict[str, ProfileView | None],
    ) -> tuple[int, int, int]:
        """(Re)read the profile files among ``entries`` whose stat changed or that failed
        with an I/O error last time; adds the names still there to ``present`` and the
        changed views to ``updates``. Returns ``(scanned, changed, errors)``."""
        scanned = changed = errors = 0
        for entry in entries:
            name = entry.name
            if not _PROFILE_NAME_RE.fullmatch(name):
                self._note_ignored(name)
                continue
            present.add(name)
            scanned += 1
            state = self._files.get(name)
            try:
                key = _stat_key(entry.stat(follow_symlinks=False))
            except FileNotFoundError:
                present.discard(name)  # deleted since the listing
                continue
            except OSError as exc:
                self._failed(name, state, None, f"cannot stat: {exc.strerror}", retry=True)
                errors += 1
                continue
            if state is not None and state.key == key and not state.retry:
                continue
            path = self.root / name
            try:
                profile = _read_profile_file(path, self.trusted_uids)[0]
            except FileNotFoundError:
                present.discard(name)
                continue
            except ProfileFormatError as exc:
                retry = isinstance(exc, ProfileReadError)
                self._failed(name, state, key, exc.problem, retry=retry)
                errors += 1
                continue
            view = to_view(profile)
            self._files[name] = _FileState(key=key, view=view)
            if state is not None and state.logged is not None:
                self.log("info", f"{path}: readable again")
            if state is None or state.view != view:
                updates[view.signature] = view
            changed += 1
        return scanned, changed, errors

    def _forget_missing(self, present: set[str], updates: dict[str, ProfileView | None]) -> int:
        """Drop the files not in ``present``; marks their profiles for removal in
        ``updates`` and returns how many profiles that removes."""
        removed = 0
        for name in [n for n in self._files if n not in present]:
            gone = self._files.pop(name)
            if gone.view is not None:
                updates[gone.view.signature] = None
                removed += 1
        return removed

    def _publish(self, updates: dict[str, ProfileView | None]) -> None:
        new = dict(self._snapshot)
        for signature, view in updates.items():
            if view is None:
                new.pop(signature, None)
            else:
                new[signature] = view
        # Readers hold the old mapping or the new one, never a half-updated one.
        self._snapshot = MappingProxyType(new)

    def _failed(
        self,
        name: str,
        state: _FileState | None,
        key: StatKey | None,
        problem: str,
        *,
        retry: bool,
    ) -> _FileState:
        if state is None:
            state = _FileState(key=key)
            self._files[name] = state
        state.key = key
        state.retry = retry
        if state.logged != (key, problem):
            state.logged = (key, problem)
            serving = (
                f"; still serving the last good copy ({state.view.signature})"
                if state.view is not None
                else ""
            )
            self.log("error", f"ignoring profile {self.root / name}: {problem}{serving}")
        return state

    def _note_ignored(self, name: str) -> None:
        # Temp/lock files are ours; anything else ending in .json is probably an admin
        # dropping a file in by hand, which will never be read: say so once.
        if name.startswith(".") or not name.endswith(".json") or name in self._ignored_names:
            return
        self._ignored_names.add(name)
        self.log(
            "info",
            f"ignoring {self.root / name}: not a profile file name "
            "(use `coda-slurm profiles import` to add profiles)",
        )


class Reloader:
    """A daemon thread that calls ``cache.refresh()`` every ``interval_s`` seconds, then
    ``on_tick()`` (if given).

    Errors are logged (a repeated identical error only once) and never end the thread; the
    cache keeps serving its last snapshot meanwhile. ``retarget`` swaps the cache and the
    interval from any thread (including ``on_tick``); the next tick uses them.
    """

    def __init__(
        self,
        cache: ProfileCache,
        interval_s: float,
        log: LogFn | None = None,
        *,
        on_tick: Callable[[], None] | None = None,
        name: str = "coda-profile-reloader",
    ) -> None:
        _check_interval(interval_s)
        self.cache = cache
        self.interval_s = interval_s
        self.log = cache.log if log is None else log
        self.on_tick = on_tick
        self.refreshes = 0  # completed refresh() calls, for tests and diagnostics
        # For the hook's stats file (coda-slurm status): when the store was last read
        # successfully, and the error of the last tick (None when it succeeded).
        self.last_ok_unix_s: float | None = None
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Reloader:
        """Start the thread; the first refresh happens at once."""
        self._thread.start()
        return self

    def stop(self, timeout_s: float | None = 5.0) -> None:
        """Ask the thread to end and wait up to ``timeout_s`` for it."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def retarget(self, cache: ProfileCache, interval_s: float) -> None:
        """Refresh ``cache`` every ``interval_s`` from the next tick on."""
        _check_interval(interval_s)
        # Plain attribute stores: the thread reads each once per tick.
        self.cache = cache
        self.interval_s = interval_s

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        last_error: str | None = None
        while not self._stop.is_set():
            cache = self.cache
            error: str | None = None
            try:
                cache.refresh()
                self.refreshes += 1
                self.last_ok_unix_s = time.time()
            except StoreUnavailable as exc:
                error = f"{exc}; keeping the last {len(cache.snapshot())} profiles"
            except Exception as exc:
                # This thread is the store's only refresher inside slurmctld: a bug must cost
                # a log line (type and message), not every later profile update.
                error = f"profile refresh failed: {type(exc).__name__}: {exc}"
            if error is not None and error != last_error:
                self.log("error", error)
            elif error is None and last_error is not None:
                self.log("info", f"profile store {cache.root} readable again")
            last_error = self.last_error = error
            if self.on_tick is not None:
                try:
                    self.on_tick()
                except Exception as exc:
                    # Same reason: on_tick (config reload, stats) must not end refreshing.
                    self.log("error", f"reload tick failed: {type(exc).__name__}: {exc}")
            self._stop.wait(self.interval_s)


def _check_interval(interval_s: float) -> None:
    if not interval_s > 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s}")
