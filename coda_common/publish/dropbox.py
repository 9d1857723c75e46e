"""Node profiles through a drop directory, vouched for by munge (``ProfilePublish=munge``).

On NFS with ``root_squash`` a node daemon cannot write the root-owned profile store. Instead
it encodes what it would merge (the samples of one probing run, or the usage records of one
job: GPU usage per GPU model, a CPU job's memory bandwidth; with the signature and the node)
as a munge credential and drops it into ``ProfileDropDir``, a spool anyone may write; the
summaries of the jobs that ended there go the same way (:class:`SummaryDrop`). On the
controller :class:`Collector` (``coda-slurm profiles collect``) decodes each file with
unmunge and merges the samples into the store it owns (a summary drop: appends its
summaries to the summary store as writer ``collector``), only when munge says the credential
was made by an accepted uid (``ProfileDropUids``, root) on a host that is a node of this
cluster (``ProfileDropHosts``, else the addresses ``scontrol show node`` lists).

Layout of ``ProfileDropDir`` (root-owned, mode 1733 or 1777: anyone may create, the sticky
bit keeps users from renaming or removing each other's files)::

    <dir>/<32 hex>.munge      one credential, complete (linked into place, never written)
    <dir>/.<32 hex>.tmp       a credential being written (or left by a crash)

What the collector does with each entry, one log line for every refusal:

* names that are not ``<32 hex>.munge`` are left alone (a stale ``.tmp`` older than an hour
  of a regular file is removed);
* symbolic links, directories, devices, FIFOs and files with several hard links are left
  alone and never opened for reading (``O_NOFOLLOW|O_NONBLOCK``; logged once per inode);
* a regular file is read to at most :data:`MAX_DROP_FILE_BYTES` (a larger one is refused
  unread), decoded and checked, then removed whether accepted or refused, and only when the
  name still names the inode that was read: unlinking a name in the spool never removes
  anything outside it;
* refused: bigger than the cap, unreadable by munge (forged, cut short, not a credential),
  expired, replayed (munged's own cache, and our record of every credential consumed, kept
  in ``<ProfileStore>/.drop-seen`` until the credential would have expired anyway), made by
  another uid, made on a host that is not a node, or a payload that is not a valid drop.
"""

from __future__ import annotations

import errno
import hashlib
import ipaddress
import json
import os
import re
import secrets
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coda_common.config.codaconf import CodaConfig
from coda_common.publish import munge
from coda_common.store.jobsummary import JobSummary, SummaryFormatError, summary_from_json_dict
from coda_common.store.multinode_merge import merge_summary_figures
from coda_common.store.profiles import (
    CpuUsageRecord,
    LogFn,
    ProfileFormatError,
    ProfileStore,
    Sample,
    StoreError,
    UsageRecord,
    cpu_usage_from_json_dict,
    cpu_usage_to_json_dict,
    signature_problem,
    usage_from_json_dict,
    usage_to_json_dict,
)
from coda_common.store.summaries import SummaryStore, SummaryStoreError

DROP_FORMAT = "coda-drop"
DROP_FORMAT_VERSION = 2
"""Version 2 added ``usage`` and ``cpu_usage`` (usage records; ``samples`` may then be
empty). A drop with samples only is written as version 1, which every collector reads."""
_V1_KEYS = frozenset({"format", "format_version", "signature", "node", "made_unix_s", "samples"})
_V2_KEYS = _V1_KEYS | {"usage", "cpu_usage"}
MAX_DROP_USAGE = 16
"""GPU usage records one drop may carry (one per GPU model)."""

#: A drop file larger than this is refused unread. A credential of the largest payload we
#: write (:data:`MAX_DROP_SAMPLES` samples, ~150 bytes each as JSON, base64 in the armor) is
#: about 60 KiB.
MAX_DROP_FILE_BYTES = 256 * 1024
MAX_DROP_SAMPLES = 256

#: Seconds a ``.tmp`` file may stay before the collector takes it for a crashed writer's.
STALE_TEMP_S = 3600.0
#: Seconds a consumed credential's record outlives its expiry (munged's clock skew margin).
SEEN_SLACK_S = 600

SEEN_FILE_NAME = ".drop-seen"
_DROP_NAME_RE = re.compile(r"[0-9a-f]{32}\.munge", re.ASCII)
_TEMP_NAME_RE = re.compile(r"\.[0-9a-f]{32}\.tmp", re.ASCII)
_NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", re.ASCII)


class DropError(Exception):
    """A drop could not be made (munge unavailable, drop directory unusable)."""


# --------------------------------------------------------------------------------------------
# The payload


@dataclass(frozen=True, slots=True)
class Drop:
    """What one credential carries for one signature: samples of one probing run, or a
    job's usage records."""

    signature: str
    node: str
    samples: tuple[Sample, ...]
    made_unix_s: float
    usage: tuple[UsageRecord, ...] = ()
    cpu_usage: CpuUsageRecord | None = None

    def to_json_bytes(self) -> bytes:
        d: dict[str, Any] = {
            "format": DROP_FORMAT,
            "format_version": 1,
            "signature": self.signature,
            "node": self.node,
            "made_unix_s": self.made_unix_s,
            "samples": [s.to_json_dict() for s in self.samples],
        }
        if self.usage or self.cpu_usage is not None:
            d["format_version"] = DROP_FORMAT_VERSION
            d["usage"] = [usage_to_json_dict(u) for u in self.usage]
            d["cpu_usage"] = cpu_usage_to_json_dict(self.cpu_usage)
        return json.dumps(d, separators=(",", ":"), allow_nan=False).encode("utf-8")

    @classmethod
    def from_json_bytes(cls, raw: bytes, where: str) -> Drop:
        """Validate a payload strictly; ProfileFormatError naming ``where`` and the problem."""
        return cls.from_json_dict(_payload_json(raw, where), where)

    @classmethod
    def from_json_dict(cls, d: object, where: str) -> Drop:
        """:meth:`from_json_bytes` of a payload already decoded."""
        if not isinstance(d, dict) or d.get("format") != DROP_FORMAT:
            raise ProfileFormatError(where, f'payload is not a "{DROP_FORMAT}" object')
        version = d.get("format_version")
        if isinstance(version, bool) or version not in (1, DROP_FORMAT_VERSION):
            raise ProfileFormatError(
                where,
                f"payload format_version {version!r} is not 1 to "
                f"{DROP_FORMAT_VERSION}: run the same coda version on nodes and controller",
            )
        keys = _V1_KEYS if version == 1 else _V2_KEYS
        extra = set(d) - keys
        if extra:
            raise ProfileFormatError(where, f"payload has unknown keys {sorted(extra)}")
        missing = keys - set(d)
        if missing:
            raise ProfileFormatError(where, f"payload lacks keys {sorted(missing)}")
        problem = signature_problem(d.get("signature"))
        if problem:
            raise ProfileFormatError(where, problem)
        node = d.get("node")
        if not isinstance(node, str) or not _NODE_RE.fullmatch(node):
            raise ProfileFormatError(where, f"node {node!r} is not a Slurm node name")
        made = d.get("made_unix_s")
        if isinstance(made, bool) or not isinstance(made, int | float) or not made >= 0:
            raise ProfileFormatError(where, f"made_unix_s {made!r} is not a time")
        raw_samples = d.get("samples")
        least = 1 if version == 1 else 0
        if not isinstance(raw_samples, list) or not least <= len(raw_samples) <= MAX_DROP_SAMPLES:
            raise ProfileFormatError(
                where, f"samples must be a list of {least} to {MAX_DROP_SAMPLES}"
            )
        samples = tuple(
            Sample.from_json_dict(s, where, f"samples[{i}]") for i, s in enumerate(raw_samples)
        )
        if version == 1:
            return cls(d["signature"], node, samples, float(made))
        raw_usage = d["usage"]
        if not isinstance(raw_usage, list) or len(raw_usage) > MAX_DROP_USAGE:
            raise ProfileFormatError(where, f"usage must be a list of at most {MAX_DROP_USAGE}")
        usage = tuple(
            usage_from_json_dict(u, where, f"usage[{i}]") for i, u in enumerate(raw_usage)
        )
        cpu_usage = cpu_usage_from_json_dict(d["cpu_usage"], where)
        if not samples and not usage and cpu_usage is None:
            raise ProfileFormatError(where, "payload carries no samples and no usage record")
        return cls(d["signature"], node, samples, float(made), usage, cpu_usage)


SUMMARY_DROP_FORMAT = "coda-summary-drop"
SUMMARY_DROP_FORMAT_VERSION = 1
_SUMMARY_DROP_KEYS = frozenset({"format", "format_version", "node", "made_unix_s", "summaries"})
MAX_DROP_SUMMARIES = 32
"""Job summaries one drop may carry: a summary is at most about 2.5 KB of JSON (its names
and record at their caps), so a full drop stays well under :data:`MAX_DROP_FILE_BYTES`
once munge has armoured it."""


@dataclass(frozen=True, slots=True)
class SummaryDrop:
    """What one credential carries of job summaries: those of jobs that ended on ``node``
    (:mod:`coda_common.store.jobsummary`), for the collector to append to the summary
    store."""

    node: str
    made_unix_s: float
    summaries: tuple[JobSummary, ...]

    def to_json_bytes(self) -> bytes:
        d = {
            "format": SUMMARY_DROP_FORMAT,
            "format_version": SUMMARY_DROP_FORMAT_VERSION,
            "node": self.node,
            "made_unix_s": self.made_unix_s,
            "summaries": [s.to_json_dict() for s in self.summaries],
        }
        return json.dumps(d, separators=(",", ":"), allow_nan=False).encode("utf-8")

    @classmethod
    def from_json_dict(cls, d: Mapping[str, Any], where: str) -> SummaryDrop:
        """Validate a decoded payload strictly; ProfileFormatError naming ``where``."""
        version = d.get("format_version")
        if type(version) is not int or version != SUMMARY_DROP_FORMAT_VERSION:
            raise ProfileFormatError(
                where,
                f"summary payload format_version {str(version)[:20]!r} is not "
                f"{SUMMARY_DROP_FORMAT_VERSION}: run the same coda version on nodes and "
                "controller",
            )
        if set(d) != _SUMMARY_DROP_KEYS:
            raise ProfileFormatError(
                where, f"summary payload keys are not {sorted(_SUMMARY_DROP_KEYS)}"
            )
        node = d["node"]
        if not isinstance(node, str) or not _NODE_RE.fullmatch(node):
            raise ProfileFormatError(where, f"node {str(node)[:70]!r} is not a Slurm node name")
        made = d["made_unix_s"]
        if isinstance(made, bool) or not isinstance(made, int | float) or not made >= 0:
            raise ProfileFormatError(where, f"made_unix_s {str(made)[:40]!r} is not a time")
        raw = d["summaries"]
        if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_DROP_SUMMARIES:
            raise ProfileFormatError(
                where, f"summaries must be a list of 1 to {MAX_DROP_SUMMARIES}"
            )
        out = []
        for i, item in enumerate(raw):
            try:
                summary = summary_from_json_dict(item)
            except SummaryFormatError as exc:
                raise ProfileFormatError(where, f"summaries[{i}]: {exc}") from None
            if summary.node != node:
                raise ProfileFormatError(
                    where, f"summaries[{i}] is of node {summary.node!r}, not {node!r}"
                )
            out.append(summary)
        return cls(node, float(made), tuple(out))


def payload_from_json_bytes(raw: bytes, where: str) -> Drop | SummaryDrop:
    """The drop a credential's payload is: profile samples and usage records
    (:class:`Drop`) or job summaries (:class:`SummaryDrop`); ProfileFormatError when it
    is neither, or not a valid one."""
    d = _payload_json(raw, where)
    if isinstance(d, dict) and d.get("format") == SUMMARY_DROP_FORMAT:
        return SummaryDrop.from_json_dict(d, where)
    return Drop.from_json_dict(d, where)


def _payload_json(raw: bytes, where: str) -> object:
    """A credential's payload decoded from JSON (once); ProfileFormatError when it is not."""
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfileFormatError(where, f"payload is not JSON: {exc}") from None
    except RecursionError:
        raise ProfileFormatError(where, "payload is not JSON: nested too deeply") from None


def drop_as_configured(payload: Drop | SummaryDrop, cfg: CodaConfig) -> Path:
    """:func:`drop` into coda.conf's ``ProfileDropDir`` through its ``MungeSocket``, valid
    for ``ProfileDropTtlS``: how coda-node hands each kind of record to the collector."""
    return drop(payload, cfg.profile_drop_dir, cfg.munge_socket, ttl_s=cfg.profile_drop_ttl_s)


# --------------------------------------------------------------------------------------------
# The node side


def drop(payload: Drop | SummaryDrop, drop_dir: Path, munge_socket: Path, *, ttl_s: int) -> Path:
    """Encode ``payload`` as a credential only root can decode and put it into ``drop_dir``
    under a fresh unguessable name; the path written. Raises DropError.

    The credential is written to ``.<name>.tmp`` created with O_EXCL|O_NOFOLLOW (a name
    someone planted, file or symlink, fails the create instead of being written through),
    then hard-linked to ``<name>.munge``, which fails rather than replace anything: the
    collector never sees a half-written file, and nothing but the new file is touched.
    """
    try:
        data = payload.to_json_bytes()
    except ValueError as exc:  # a non-finite number: no JSON the collector would take
        raise DropError(f"payload cannot be encoded: {exc}") from None
    try:
        credential = munge.encode(data, munge_socket, ttl_s=ttl_s, restrict_uid=0)
    except munge.MungeUnavailable as exc:
        raise DropError(str(exc)) from None
    name = secrets.token_hex(16)
    temp = drop_dir / f".{name}.tmp"
    final = drop_dir / f"{name}.munge"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(temp, flags, 0o600)
    except OSError as exc:
        raise DropError(f"cannot create {temp}: {exc.strerror}") from None
    try:
        try:
            view = memoryview(credential)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.link(temp, final)
    except OSError as exc:
        raise DropError(f"cannot write {final}: {exc.strerror}") from None
    finally:
        # A temp file a crash leaves is swept by the collector after STALE_TEMP_S.
        with suppress(OSError):
            os.unlink(temp)
    return final


# --------------------------------------------------------------------------------------------
# The controller side


def node_addresses_from_slurm(env: Mapping[str, str] | None = None) -> frozenset[str]:
    """IPv4/IPv6 addresses of every node's NodeAddr and NodeHostName, from ``scontrol -o
    show node``; raises OSError (scontrol missing or failing)."""
    try:
        done = subprocess.run(
            ["scontrol", "-o", "show", "node"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=30,
            check=False,
            env=None if env is None else dict(env),
        )
    except (subprocess.TimeoutExpired, FileNotFoundError) as exc:
        raise OSError(f"scontrol show node: {exc}") from None
    if done.returncode != 0:
        raise OSError(f"scontrol show node: {done.stderr.strip() or done.returncode}")
    names: set[str] = set()
    for line in done.stdout.splitlines():
        for word in line.split():
            key, _, value = word.partition("=")
            if key in ("NodeAddr", "NodeHostName") and value and value != "(null)":
                names.add(value)
    return resolve_hosts(names)


def resolve_hosts(hosts: Iterable[str]) -> frozenset[str]:
    """Addresses of ``hosts`` (addresses stay as they are; names are resolved, a name that
    does not resolve gives nothing)."""
    out: set[str] = set()
    for host in hosts:
        try:
            out.add(str(ipaddress.ip_address(host)))
            continue
        except ValueError:
            pass
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        except (socket.gaierror, UnicodeError):
            continue
        out.update(str(ipaddress.ip_address(info[4][0])) for info in infos)
    return frozenset(out)


class HostFilter:
    """Whether an ENCODE_HOST address is a node: configured entries (addresses, CIDR
    networks, names) or, with none, the nodes' addresses from ``nodes()``, re-read at most
    every ``refresh_s`` seconds."""

    def __init__(
        self,
        configured: Iterable[str],
        nodes: Callable[[], frozenset[str]] = node_addresses_from_slurm,
        refresh_s: float = 60.0,
    ) -> None:
        entries = tuple(configured)
        self._networks = tuple(ipaddress.ip_network(e, strict=False) for e in entries if "/" in e)
        self._fixed = resolve_hosts(e for e in entries if "/" not in e) if entries else None
        self._nodes = nodes
        self._refresh_s = refresh_s
        self._cached: frozenset[str] = frozenset()
        self._cached_at = -float("inf")

    def allowed(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        if self._fixed is not None:
            return str(ip) in self._fixed or any(ip in net for net in self._networks)
        now = time.monotonic()
        if now - self._cached_at >= self._refresh_s:
            self._cached = self._nodes()  # OSError goes to the caller: no pass without nodes
            self._cached_at = now
        return str(ip) in self._cached


@dataclass
class CollectStats:
    """One pass of :meth:`Collector.collect`."""

    accepted: int = 0
    refused: int = 0
    samples: int = 0
    summaries: int = 0
    left_alone: int = 0
    refusals: list[str] = field(default_factory=list)


class _Refused(Exception):
    pass


def _now_s() -> float:
    return time.time()


class Collector:
    """Reads ``drop_dir``, merges what munge vouches for into ``store``; see the module doc.

    ``decode`` and ``refit`` are the defaults in production (:func:`munge.decode`,
    :func:`coda_common.model.fit.refit_profile`).
    """

    def __init__(
        self,
        drop_dir: Path,
        store: ProfileStore,
        munge_socket: Path,
        *,
        accept_uids: Iterable[int],
        hosts: HostFilter,
        log: LogFn,
        decode: Callable[[bytes, Path], munge.Decoded] = munge.decode,
        refit: Callable[[Any], Any] | None = None,
        clock: Callable[[], float] = _now_s,
        summaries: SummaryStore | None = None,
    ) -> None:
        if refit is None:
            from coda_common.model.fit import refit_profile

            refit = refit_profile
        self.drop_dir = drop_dir
        self.store = store
        self.munge_socket = munge_socket
        self.accept_uids = frozenset(accept_uids)
        self.hosts = hosts
        self.log = log
        self._decode = decode
        self._refit = refit
        self._clock = clock
        self.summaries = summaries
        """Where job summaries go (JobSummaryDir); None: a summary drop is refused."""
        self._left_alone_logged: set[tuple[str, int, int]] = set()

    # -- the consumed-credential record ---------------------------------------------------
    @property
    def seen_path(self) -> Path:
        return self.store.root / SEEN_FILE_NAME

    def _load_seen(self, now_s: float) -> dict[str, float]:
        try:
            fd = os.open(self.seen_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return {}
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
                raise StoreError(
                    f"{self.seen_path}: not a regular file of uid {os.geteuid()} that only "
                    "its owner may write; refusing to collect (remove it)"
                )
            try:
                raw = json.loads(f.read(8 << 20))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raw = {}
        if not isinstance(raw, dict):
            return {}
        return {
            k: float(v)
            for k, v in raw.items()
            if isinstance(k, str) and isinstance(v, int | float) and v > now_s
        }

    def _save_seen(self, seen: Mapping[str, float]) -> None:
        temp = self.seen_path.with_name(f"{SEEN_FILE_NAME}.{secrets.token_hex(8)}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(dict(seen), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, self.seen_path)

    # -- one pass -------------------------------------------------------------------------
    def collect(self) -> CollectStats:
        """Read every entry once; raises StoreError/OSError when the drop directory or the
        store cannot be used at all (nothing is consumed then)."""
        stats = CollectStats()
        now = self._clock()
        self.store.ensure_root()
        seen = self._load_seen(now)
        seen_before = dict(seen)
        dir_fd = os.open(self.drop_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for name in sorted(os.listdir(dir_fd)):
                if _TEMP_NAME_RE.fullmatch(name):
                    self._sweep_temp(dir_fd, name, now)
                    continue
                if not _DROP_NAME_RE.fullmatch(name):
                    continue
                self._one(dir_fd, name, seen, now, stats)
        finally:
            os.close(dir_fd)
            if seen != seen_before:
                self._save_seen(seen)
        self._prune_summaries(now)
        return stats

    def _prune_summaries(self, now_s: float) -> None:
        """The summary store past its retention, at most hourly (SummaryStore.prune_if_due);
        a failure is logged and collecting goes on."""
        if self.summaries is None:
            return
        try:
            removed = self.summaries.prune_if_due(now_s)
        except OSError as exc:
            self.log("error", f"cannot prune job summaries in {self.summaries.root}: {exc}")
            return
        if removed:
            self.log("info", f"job summaries of {', '.join(removed)} removed (retention)")

    def _sweep_temp(self, dir_fd: int, name: str, now_s: float) -> None:
        try:
            st = os.lstat(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and now_s - st.st_mtime > STALE_TEMP_S:
            self._unlink_if_same(dir_fd, name, st)

    def _leave_alone(self, name: str, st: os.stat_result, why: str, stats: CollectStats) -> None:
        stats.left_alone += 1
        key = (name, st.st_dev, st.st_ino)
        if key not in self._left_alone_logged:
            self._left_alone_logged.add(key)
            self.log("error", f"drop {self.drop_dir / name}: {why}; left alone, not read")

    def _one(
        self, dir_fd: int, name: str, seen: dict[str, float], now_s: float, stats: CollectStats
    ) -> None:
        where = str(self.drop_dir / name)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        try:
            st_link = os.lstat(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st_link.st_mode):
            self._leave_alone(name, st_link, "a symbolic link", stats)
            return
        if not stat.S_ISREG(st_link.st_mode):
            self._leave_alone(name, st_link, "not a regular file", stats)
            return
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self._leave_alone(name, st_link, "a symbolic link", stats)
            else:
                self._leave_alone(name, st_link, f"cannot open: {exc.strerror}", stats)
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self._leave_alone(name, st, "not a regular file", stats)
                return
            if st.st_nlink != 1:
                self._leave_alone(name, st, f"{st.st_nlink} hard links", stats)
                return
            try:
                credential = self._read_capped(fd, st)
                drop_, key = self._check(credential, where, seen, now_s)
                try:
                    merged = self._merge(drop_, now_s)
                except (ProfileFormatError, ValueError) as exc:
                    raise _Refused(f"cannot merge into the store: {exc}") from None
                except (StoreError, OSError):
                    # The store's fault, not the drop's: keep the file for the next pass.
                    del seen[key]
                    raise
            except _Refused as exc:
                stats.refused += 1
                stats.refusals.append(str(exc))
                self.log("error", f"drop {where} refused: {exc}; removed, nothing merged")
            else:
                stats.accepted += 1
                if isinstance(drop_, SummaryDrop):
                    stats.summaries += len(drop_.summaries)
                else:
                    stats.samples += len(drop_.samples)
                self.log("info", f"drop {where}: {merged}")
            self._unlink_if_same(dir_fd, name, st)
        finally:
            os.close(fd)

    def _merge(self, drop_: Drop | SummaryDrop, now_s: float) -> str:
        """Merge what ``drop_`` carries into the store; what was merged, for the log."""
        if isinstance(drop_, SummaryDrop):
            return self._append_summaries(drop_, now_s)
        said: list[str] = []
        if drop_.samples:
            profile = self.store.merge_samples(
                drop_.signature,
                drop_.samples,
                refit=self._refit,
                source=f"coda-node:{drop_.node}",
                now_unix_s=now_s,
            )
            said.append(
                f"{len(drop_.samples)} samples of {drop_.signature} from node {drop_.node} "
                f"merged: {profile.cpus_per_gpu} cores/GPU at confidence "
                f"{profile.confidence:.2f} from {profile.n_samples} samples"
            )
        for record in drop_.usage:
            got = self.store.merge_usage(drop_.signature, record)
            model = record.gpu_model or "an unknown GPU model"
            said.append(
                f"GPU usage on {model} of {drop_.signature} from node {drop_.node} "
                + ("merged" if got is not None else "not merged: no profile for it")
            )
        if drop_.cpu_usage is not None:
            self.store.merge_cpu_usage(drop_.signature, drop_.cpu_usage)
            said.append(
                f"CPU memory bandwidth of {drop_.signature} from node {drop_.node} merged: "
                f"{drop_.cpu_usage.mem_bw_bytes_per_s_per_cpu / 1e9:.2f} GB/s per CPU over "
                f"{drop_.cpu_usage.ticks} ticks"
            )
        return "; ".join(said)

    def _append_summaries(self, drop_: SummaryDrop, now_s: float) -> str:
        """Append a drop's job summaries to the summary store (writer ``collector``), then
        merge the multi-node figures they give into their profiles
        (:mod:`coda_common.store.multinode_merge`: a figure that cannot be merged is said in
        the log line, the drop is still accepted, its summaries being in)."""
        if self.summaries is None:
            raise ValueError("this collector keeps no job summaries (no JobSummaryDir given)")
        try:
            self.summaries.append(drop_.summaries, writer="collector")
        except SummaryStoreError as exc:
            raise StoreError(f"cannot append job summaries: {exc}") from None
        jobs = ", ".join(str(s.job_id) for s in drop_.summaries)
        said = [f"job summaries of job(s) {jobs} from node {drop_.node} appended"]
        said += [line for _, line in merge_summary_figures(self.store, drop_.summaries, now_s)]
        return "; ".join(said)

    def _read_capped(self, fd: int, st: os.stat_result) -> bytes:
        if st.st_size > MAX_DROP_FILE_BYTES:
            raise _Refused(f"{st.st_size} bytes, more than {MAX_DROP_FILE_BYTES} (not read)")
        chunks: list[bytes] = []
        total = 0
        while total <= MAX_DROP_FILE_BYTES:
            chunk = os.read(fd, MAX_DROP_FILE_BYTES + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > MAX_DROP_FILE_BYTES:
            raise _Refused(f"more than {MAX_DROP_FILE_BYTES} bytes (grew while read)")
        return b"".join(chunks)

    def _check(
        self, credential: bytes, where: str, seen: dict[str, float], now_s: float
    ) -> tuple[Drop | SummaryDrop, str]:
        """The drop ``credential`` carries and its key in the consumed record (already
        recorded); _Refused saying why it is not accepted."""
        try:
            decoded = self._decode(credential, self.munge_socket)
        except munge.MungeUnavailable as exc:
            # Not the file's fault: keep it for the next pass.
            raise StoreError(f"cannot decode {where}: {exc}") from None
        who = f"uid {decoded.uid} on {decoded.encode_host}"
        if decoded.status == munge.EMUNGE_CRED_EXPIRED:
            raise _Refused(f"expired munge credential ({who})")
        if decoded.status in (munge.EMUNGE_CRED_REPLAYED, munge.EMUNGE_CRED_REWOUND):
            raise _Refused(f"replayed munge credential ({who}; munged decoded it before)")
        if decoded.status == munge.EMUNGE_CRED_UNAUTHORIZED:
            raise _Refused(
                f"a munge credential only another uid may decode (munge: {decoded.status_text})"
            )
        if decoded.status != munge.EMUNGE_SUCCESS:
            raise _Refused(
                f"not a valid munge credential (forged, cut short or from another cluster; "
                f"munge: {decoded.status_text or decoded.status})"
            )
        if decoded.uid not in self.accept_uids:
            accepts = ", ".join(str(u) for u in sorted(self.accept_uids))
            raise _Refused(f"made by uid {decoded.uid}, only uid {accepts} accepted")
        if decoded.encode_host is None or not self.hosts.allowed(decoded.encode_host):
            raise _Refused(
                f"made on host {decoded.encode_host}, which is not a node of this cluster"
            )
        made = decoded.encode_time_unix_s or 0
        digest = hashlib.sha256(decoded.payload).hexdigest()
        key = f"{decoded.encode_host}|{decoded.uid}|{made}|{digest}"
        if key in seen:
            raise _Refused(f"replayed munge credential ({who}; consumed before)")
        seen[key] = max(made + (decoded.ttl_s or 0) + SEEN_SLACK_S, now_s + SEEN_SLACK_S)
        try:
            return payload_from_json_bytes(decoded.payload, where), key
        except ProfileFormatError as exc:
            raise _Refused(f"({who}) {exc.problem}") from None

    def _unlink_if_same(self, dir_fd: int, name: str, st: os.stat_result) -> None:
        """Remove ``name`` only while it still names the inode ``st`` describes."""
        try:
            now = os.lstat(name, dir_fd=dir_fd)
            if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino) and stat.S_ISREG(now.st_mode):
                os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
