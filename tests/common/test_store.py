"""Tests for coda_common.store.profiles: file format, atomic writes, the hook's cache, merges,
locks.

These tests run as root (ownership cases chown files to uid 12345 to play a user).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from coda_common.store import profiles as store_mod
from coda_common.store.profiles import (
    FORMAT_VERSION,
    CpuUsageRecord,
    Profile,
    ProfileCache,
    ProfileFormatError,
    ProfileStore,
    Reloader,
    Sample,
    StoreLockTimeout,
    StoreUnavailable,
    UntrustedProfileError,
    encode_profile,
    profile_stem,
    read_profile_file,
    to_view,
)
from slurm_plugin.decision.decide import ProfileView

USER_UID = 12345
SIG = "workload:1000:train"

# fork: the children share this test's imports and fixtures' paths; no threads run yet.
_MP = multiprocessing.get_context("fork")


WRITTEN_WITHOUT_FIGURE = 4
"""The version a profile without a measured multi-node figure is written as."""


def make_profile(
    signature: str = SIG, cpus_per_gpu: int = 8, n_samples: int = 2, **kw: Any
) -> Profile:
    samples = kw.pop(
        "samples",
        tuple(
            Sample(cores=float(c), throughput=100.0 + c, gpus=1, nodes=1, gpu_model="H100")
            for c in range(n_samples)
        ),
    )
    fields: dict[str, Any] = {
        "signature": signature,
        "workload": store_mod.workload_of_signature(signature) or "script",
        "cpus_per_gpu": cpus_per_gpu,
        "confidence": 0.9,
        "n_samples": len(samples),
        "updated_unix_s": 1_700_000_000.0,
        "source": "test",
        "gpu_model": "H100",
        "samples": samples,
        "fit": {"model": "amdahl", "params": [1.0, 2.5]},
    }
    fields.update(kw)
    return Profile(**fields)


class Logs:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def __call__(self, level: str, msg: str) -> None:
        self.lines.append((level, msg))

    def errors(self) -> list[str]:
        return [m for lvl, m in self.lines if lvl == "error"]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return ProfileStore(tmp_path / "profiles").ensure_root()


@pytest.fixture
def store(root: Path) -> ProfileStore:
    return ProfileStore(root)


@pytest.fixture
def logs() -> Logs:
    return Logs()


def age_dir(root: Path, seconds_ago: float = 600.0) -> None:
    """Backdate the directory mtime so the cache treats it as settled (not "racy")."""
    t = time.time() - seconds_ago
    os.utime(root, (t, t))


def write_in_place(path: Path, data: bytes) -> None:
    """Rewrite a file's contents in place (same inode), as an editor or a bug might."""
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(data)


# -------------------------------------------------------------------------------- format


def test_profile_json_round_trip_and_file_layout(store: ProfileStore, root: Path) -> None:
    p = make_profile(multi_node_cpus_per_gpu=12)
    d = p.to_json_dict()
    assert d["format"] == "coda-profile" and d["format_version"] == WRITTEN_WITHOUT_FIGURE
    assert Profile.from_json_dict(json.loads(json.dumps(d)), "x") == p

    path = store.write(p)
    assert path == root / f"{profile_stem(SIG)}.json"
    assert len(path.stem) == 32
    assert (path.stat().st_mode & 0o777) == 0o644
    assert sorted(os.listdir(root)) == [".lock", path.name]  # no temp file left behind
    assert store.read(SIG) == p
    assert store.read("workload:1000:other") is None
    assert to_view(p) == ProfileView(
        signature=SIG,
        workload="train",
        cpus_per_gpu=8,
        confidence=0.9,
        n_samples=2,
        multi_node_cpus_per_gpu=12,
    )


@pytest.mark.parametrize(
    "signature",
    ["workload:0:train", "workload:*:train", "workload:1000:a:b c", "script:1000:0123456789abcdef"],
)
def test_valid_signatures(signature: str) -> None:
    assert store_mod.signature_problem(signature) is None


@pytest.mark.parametrize(
    "signature",
    ["train", "workload:x:train", "workload:1000:", "script:1000:XYZ", "workload:1:a\nb", 5],
)
def test_invalid_signatures(signature: Any) -> None:
    assert store_mod.signature_problem(signature)


def _bad(**changes: Any) -> dict[str, Any]:
    d = make_profile().to_json_dict()
    for key, value in changes.items():
        if value is _DELETE:
            del d[key]
        else:
            d[key] = value
    return d


_DELETE = object()


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        (_bad(format_version=FORMAT_VERSION + 1), "written by a newer coda"),
        (_bad(format_version=0), "never written by any coda"),
        (_bad(format_version="1"), "format_version must be an integer"),
        (_bad(format="something-else"), "not a coda profile"),
        (_bad(format=_DELETE), "not a coda profile"),
        (_bad(cpus_per_gpu=0), "cpus_per_gpu must be an integer >= 1"),
        (_bad(cpus_per_gpu=True), "cpus_per_gpu must be an integer >= 1"),
        (_bad(cpus_per_gpu=8.0), "cpus_per_gpu must be an integer >= 1"),
        (_bad(confidence=1.5), "confidence must be within 0..1"),
        (_bad(confidence=-0.1), "confidence must be a number >= 0"),
        (_bad(n_samples=-1), "n_samples must be an integer >= 0"),
        (_bad(multi_node_cpus_per_gpu=0), "multi_node_cpus_per_gpu must be an integer >= 1"),
        (_bad(workload=""), "workload must be a non-empty string"),
        (_bad(workload="a\x1b[31m"), "workload contains control characters"),
        (_bad(signature="nope"), "signature 'nope' is not"),
        (_bad(samples={}), "samples must be a list"),
        (_bad(samples=[{"cores": 1}]), "samples[0]: missing key(s) throughput"),
        (_bad(fit=[1]), "fit must be an object or null"),
        (_bad(extra=1), "unknown key(s) extra"),
        (_bad(source=_DELETE), "missing key(s) source"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_from_json_dict_rejects(doc: Any, needle: str) -> None:
    with pytest.raises(ProfileFormatError) as info:
        Profile.from_json_dict(doc, "/store/abc.json")
    assert str(info.value).startswith("/store/abc.json: ")
    assert needle in str(info.value)


def test_foreign_version_tells_operator_to_upgrade() -> None:
    with pytest.raises(ProfileFormatError, match="upgrade coda-slurm on the controller"):
        Profile.from_json_dict(_bad(format_version=FORMAT_VERSION + 1), "f.json")


def test_nan_and_infinity_are_not_json(root: Path) -> None:
    text = json.dumps(_bad(confidence=float("nan")))
    with pytest.raises(ProfileFormatError, match="not valid JSON"):
        store_mod.decode_profile(text.encode(), "f.json")


def test_write_refuses_invalid_profile_without_touching_disk(
    store: ProfileStore, root: Path
) -> None:
    before = sorted(os.listdir(root))
    with pytest.raises(ProfileFormatError, match="cpus_per_gpu"):
        store.write(make_profile(cpus_per_gpu=0))
    with pytest.raises(ValueError):  # ProfileFormatError is a ValueError for callers
        store.write(make_profile(signature="bogus"))
    assert sorted(os.listdir(root)) == before


def test_fit_is_read_only_and_profiles_compare_by_value(store: ProfileStore) -> None:
    store.write(make_profile())
    p = store.read(SIG)
    assert p is not None and p.fit is not None
    with pytest.raises(TypeError):
        p.fit["model"] = "x"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.cpus_per_gpu = 3  # type: ignore[misc]


def test_file_name_must_match_signature(store: ProfileStore, root: Path) -> None:
    path = store.write(make_profile())
    other = root / f"{profile_stem('workload:1000:other')}.json"
    os.rename(path, other)
    with pytest.raises(ProfileFormatError, match="file name does not match its signature"):
        read_profile_file(other, store.trusted_uids)


# -------------------------------------------------------------------------------- atomicity


def _rewrite_loop(root: str, iterations: int, done: Any) -> None:
    st = ProfileStore(Path(root))
    small = make_profile(cpus_per_gpu=4, n_samples=1)
    big = make_profile(cpus_per_gpu=16, n_samples=200)  # ~30x the size of `small`
    try:
        for i in range(iterations):
            st.write(big if i % 2 else small)
    finally:
        done.set()


def test_reader_never_sees_partial_file_while_writer_rewrites(
    store: ProfileStore, root: Path, logs: Logs
) -> None:
    iterations = 3000
    store.write(make_profile(cpus_per_gpu=4, n_samples=1))
    cache = ProfileCache(root, logs, full_rescan_every=1)
    done = _MP.Event()
    writer = _MP.Process(target=_rewrite_loop, args=(str(root), iterations, done))
    writer.start()
    seen: set[int] = set()
    refreshes = direct_reads = 0
    path = store.path_for(SIG)
    try:
        while not done.is_set():
            cache.refresh()
            refreshes += 1
            seen.add(cache.snapshot()[SIG].cpus_per_gpu)
            # Also read the file directly, without the cache's "keep the last good copy".
            p = read_profile_file(path, store.trusted_uids)
            assert p.cpus_per_gpu in (4, 16)
            assert len(p.samples) in (1, 200)
            direct_reads += 1
    finally:
        writer.join(60)
    assert writer.exitcode == 0
    assert logs.lines == [], logs.lines
    assert seen <= {4, 16}
    assert refreshes > 10 and direct_reads > 10
    assert sorted(n for n in os.listdir(root) if n.endswith(".tmp")) == []


def test_crash_mid_write_leaves_old_file_and_ignored_temp(
    store: ProfileStore, root: Path, logs: Logs, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.write(make_profile(cpus_per_gpu=8))
    # A writer that died between creating and renaming its temp file:
    leftover = root / f".{profile_stem(SIG)}.k3j2h1.tmp"
    leftover.write_bytes(encode_profile(make_profile(cpus_per_gpu=99))[:40])
    cache = ProfileCache(root, logs)
    cache.refresh()
    assert cache.snapshot()[SIG].cpus_per_gpu == 8
    assert logs.lines == []

    # A write whose rename fails removes its own temp file and leaves the old profile.
    def boom(src: str, dst: str) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(store_mod.os, "replace", boom)
    with pytest.raises(OSError):
        store.write(make_profile(cpus_per_gpu=12))
    monkeypatch.undo()
    assert store.read(SIG).cpus_per_gpu == 8  # type: ignore[union-attr]
    assert [n for n in os.listdir(root) if n.endswith(".tmp")] == [leftover.name]

    # The sweeper removes old leftovers only.
    assert store.remove_stale_temp_files(older_than_s=3600) == 0
    old = time.time() - 7200
    os.utime(leftover, (old, old))
    assert store.remove_stale_temp_files(older_than_s=3600) == 1
    assert not leftover.exists()


# -------------------------------------------------------------------------------- bad files


def _corrupt(kind: str, path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Break the profile at ``path`` in one way; return a fragment of the expected log."""
    good = path.read_bytes()
    if kind == "corrupt":
        write_in_place(path, b"\x00\xffnot json at all")
        return "not valid JSON"
    if kind == "truncated":
        write_in_place(path, good[: len(good) // 2])
        return "not valid JSON"
    if kind == "empty":
        write_in_place(path, b"")
        return "empty file"
    if kind == "foreign-version":
        d = json.loads(good)
        d["format_version"] = FORMAT_VERSION + 1
        write_in_place(path, json.dumps(d).encode())
        return "upgrade coda-slurm on the controller"
    if kind == "wrong-owner":
        os.chown(path, USER_UID, USER_UID)
        return f"owned by uid {USER_UID}"
    if kind == "group-writable":
        os.chmod(path, 0o664)
        return "group/other-writable"
    if kind == "symlink":
        target = path.with_name("elsewhere")
        target.write_bytes(good)
        os.unlink(path)
        os.symlink(target, path)
        return "symbolic link"
    if kind == "unreadable":
        # Root reads any mode, so inject the I/O error an NFS server or disk would give.
        real = store_mod._read_all

        def eio(fd: int, limit: int) -> bytes:
            if os.fstat(fd).st_ino == path.stat().st_ino:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            return real(fd, limit)

        monkeypatch.setattr(store_mod, "_read_all", eio)
        os.utime(path)  # a new mtime, as the failing write would have made
        return "cannot read: Input/output error"
    raise AssertionError(kind)


BAD_KINDS = [
    "corrupt",
    "truncated",
    "empty",
    "foreign-version",
    "wrong-owner",
    "group-writable",
    "symlink",
    "unreadable",
]


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_bad_file_logged_once_and_last_good_copy_keeps_serving(
    kind: str, store: ProfileStore, root: Path, logs: Logs, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = store.write(make_profile(cpus_per_gpu=8))
    other = store.write(make_profile(signature="workload:1000:other", cpus_per_gpu=3))
    cache = ProfileCache(root, logs, full_rescan_every=1)  # every refresh scans
    cache.refresh()
    assert cache.snapshot()[SIG].cpus_per_gpu == 8

    needle = _corrupt(kind, path, monkeypatch)
    for _ in range(5):
        stats = cache.refresh()
        assert cache.snapshot()[SIG].cpus_per_gpu == 8  # the last good copy
        assert cache.snapshot()["workload:1000:other"].cpus_per_gpu == 3
    assert stats.skipped is False
    errors = logs.errors()
    assert len(errors) == 1, errors
    assert needle in errors[0]
    assert str(path) in errors[0]
    assert "still serving the last good copy" in errors[0]
    assert str(other) not in errors[0]

    # Repaired: the new content serves and the recovery is logged.
    monkeypatch.undo()
    if path.is_symlink():
        path.unlink()
    store.write(make_profile(cpus_per_gpu=10))
    cache.refresh()
    assert cache.snapshot()[SIG].cpus_per_gpu == 10
    assert any("readable again" in m for lvl, m in logs.lines if lvl == "info")
    assert len(logs.errors()) == 1


def test_bad_file_logged_again_only_when_it_changes(
    store: ProfileStore, root: Path, logs: Logs
) -> None:
    path = store.write(make_profile())
    cache = ProfileCache(root, logs, full_rescan_every=1)
    cache.refresh()
    write_in_place(path, b"{")
    cache.refresh()
    cache.refresh()
    assert len(logs.errors()) == 1
    time.sleep(0.01)
    write_in_place(path, b"{{")  # a different broken version: one more line
    cache.refresh()
    cache.refresh()
    assert len(logs.errors()) == 2


def test_planted_user_file_is_never_served(store: ProfileStore, root: Path, logs: Logs) -> None:
    path = store.path_for("workload:*:train")
    path.write_bytes(encode_profile(make_profile(signature="workload:*:train", cpus_per_gpu=64)))
    os.chown(path, USER_UID, USER_UID)
    cache = ProfileCache(root, logs)
    stats = cache.refresh()
    assert "workload:*:train" not in cache.snapshot()
    assert stats.errors == 1 and stats.changed == 0
    assert len(logs.errors()) == 1 and "owned by uid 12345" in logs.errors()[0]
    # ...unless the store's owner is configured to be that uid (e.g. NFS root_squash).
    cache2 = ProfileCache(root, Logs(), trusted_uids=frozenset({0, USER_UID}))
    cache2.refresh()
    assert cache2.snapshot()["workload:*:train"].cpus_per_gpu == 64
    # ProfileStore.read refuses it too (so merge_samples cannot launder it into root's name).
    with pytest.raises(UntrustedProfileError):
        store.read("workload:*:train")


@pytest.mark.parametrize("problem", ["mode", "owner", "missing", "not-a-dir"])
def test_insecure_or_missing_root_raises_store_unavailable_and_keeps_snapshot(
    problem: str, store: ProfileStore, root: Path, logs: Logs, tmp_path: Path
) -> None:
    store.write(make_profile())
    cache = ProfileCache(root, logs)
    cache.refresh()
    before = cache.snapshot()
    if problem == "mode":
        os.chmod(root, 0o777)
    elif problem == "owner":
        os.chown(root, USER_UID, USER_UID)
    elif problem == "missing":
        os.rename(root, tmp_path / "moved")
    else:
        os.rename(root, tmp_path / "moved")
        root.write_text("")
    with pytest.raises(StoreUnavailable):
        cache.refresh()
    assert cache.snapshot() is before
    assert SIG in cache.snapshot()


def test_hand_dropped_json_is_logged_once_as_info(root: Path, logs: Logs) -> None:
    (root / "mytrain.json").write_text("{}")
    (root / "README").write_text("notes")
    cache = ProfileCache(root, logs, full_rescan_every=1)
    cache.refresh()
    cache.refresh()
    assert logs.errors() == []
    infos = [m for lvl, m in logs.lines if lvl == "info"]
    assert len(infos) == 1 and "mytrain.json" in infos[0]


def test_iter_profiles_reports_good_and_bad(store: ProfileStore, root: Path) -> None:
    store.write(make_profile())
    bad = store.write(make_profile(signature="workload:1000:bad"))
    write_in_place(bad, b"[")
    (root / ".junk.tmp").write_text("x")
    items = dict(store.iter_profiles())
    assert isinstance(items[store.path_for(SIG)], Profile)
    assert isinstance(items[bad], ProfileFormatError)
    assert len(items) == 2


# -------------------------------------------------------------------------------- the cache


def test_deleted_files_disappear_from_snapshot(store: ProfileStore, root: Path, logs: Logs) -> None:
    sigs = [f"workload:1000:w{i}" for i in range(3)]
    for s in sigs:
        store.write(make_profile(signature=s))
    cache = ProfileCache(root, logs)
    assert cache.refresh().changed == 3
    assert set(cache.snapshot()) == set(sigs)
    assert store.delete(sigs[0]) is True
    assert store.delete(sigs[0]) is False
    os.unlink(store.path_for(sigs[1]))
    stats = cache.refresh()
    assert stats.removed == 2
    assert set(cache.snapshot()) == {sigs[2]}
    assert logs.lines == []


def test_snapshot_is_immutable_and_replaced_not_mutated(store: ProfileStore, root: Path) -> None:
    store.write(make_profile(cpus_per_gpu=8))
    cache = ProfileCache(root, Logs())
    cache.refresh()
    snap = cache.snapshot()
    assert isinstance(snap, MappingProxyType)
    with pytest.raises(TypeError):
        snap["x"] = snap[SIG]  # type: ignore[index]
    store.write(make_profile(cpus_per_gpu=9))
    cache.refresh()
    assert snap[SIG].cpus_per_gpu == 8  # a reader holding the old snapshot is undisturbed
    assert cache.snapshot()[SIG].cpus_per_gpu == 9
    # A refresh that changes nothing keeps the same mapping object.
    same = cache.snapshot()
    cache.refresh()
    assert cache.snapshot() is same


class Counters:
    """Counts the syscalls and parses a refresh makes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.stat = self.scandir = self.parse = 0
        real_stat, real_scandir, real_load = os.stat, os.scandir, store_mod._load_json

        def stat(*a: Any, **k: Any) -> Any:
            self.stat += 1
            return real_stat(*a, **k)

        def scandir(*a: Any, **k: Any) -> Any:
            self.scandir += 1
            return real_scandir(*a, **k)

        def load(data: bytes) -> Any:
            self.parse += 1
            return real_load(data)

        monkeypatch.setattr(store_mod.os, "stat", stat)
        monkeypatch.setattr(store_mod.os, "scandir", scandir)
        monkeypatch.setattr(store_mod, "_load_json", load)

    def take(self) -> tuple[int, int, int]:
        out = (self.stat, self.scandir, self.parse)
        self.stat = self.scandir = self.parse = 0
        return out


def test_unchanged_refresh_is_one_stat_and_no_parsing(
    store: ProfileStore, root: Path, logs: Logs, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(20):
        store.write(make_profile(signature=f"workload:1000:w{i}"))
    age_dir(root)
    cache = ProfileCache(root, logs, full_rescan_every=1000)
    counters = Counters(monkeypatch)
    assert cache.refresh().changed == 20
    assert counters.take() == (1, 1, 20)

    for _ in range(3):
        stats = cache.refresh()
        assert stats.skipped and stats.scanned == 0
        assert counters.take() == (1, 0, 0)  # one stat of the directory, nothing else

    store.write(make_profile(signature="workload:1000:w7", cpus_per_gpu=31))
    age_dir(root, 300)
    stats = cache.refresh()
    assert (stats.skipped, stats.changed, stats.scanned) == (False, 1, 20)
    assert counters.take() == (1, 1, 1)  # one stat, one scandir, one parse
    assert cache.snapshot()["workload:1000:w7"].cpus_per_gpu == 31


def test_recent_directory_mtime_is_not_trusted(store: ProfileStore, root: Path) -> None:
    """A change in the same timestamp tick as the last scan must not be missed."""
    store.write(make_profile())
    cache = ProfileCache(root, Logs(), full_rescan_every=1000)
    cache.refresh()
    assert cache.refresh().skipped is False  # mtime is seconds-fresh: scan again
    age_dir(root)
    cache.refresh()
    assert cache.refresh().skipped is True


def test_periodic_full_rescan_catches_in_place_edits(
    store: ProfileStore, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = store.write(make_profile(cpus_per_gpu=8))
    age_dir(root)
    cache = ProfileCache(root, Logs(), full_rescan_every=3)
    cache.refresh()
    dir_mtime_ns = root.stat().st_mtime_ns
    # An in-place edit does not change the directory's mtime.
    write_in_place(path, encode_profile(make_profile(cpus_per_gpu=5)))
    assert root.stat().st_mtime_ns == dir_mtime_ns
    assert cache.refresh().skipped is True
    assert cache.refresh().skipped is True
    stats = cache.refresh()  # the third refresh since the last scan
    assert stats.skipped is False and stats.changed == 1
    assert cache.snapshot()[SIG].cpus_per_gpu == 5


def test_io_errors_are_retried_on_the_next_scan(
    store: ProfileStore, root: Path, logs: Logs, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = store.write(make_profile(cpus_per_gpu=8))
    cache = ProfileCache(root, logs, full_rescan_every=1)
    real = store_mod._read_all
    flaky = {"fail": True}

    def maybe_eio(fd: int, limit: int) -> bytes:
        if flaky["fail"]:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd, limit)

    monkeypatch.setattr(store_mod, "_read_all", maybe_eio)
    assert cache.refresh().errors == 1
    assert cache.refresh().errors == 1  # retried, same problem: not logged again
    assert SIG not in cache.snapshot()
    flaky["fail"] = False
    cache.refresh()  # same file, same stat key: retried because it was an I/O error
    assert cache.snapshot()[SIG].cpus_per_gpu == 8
    assert len(logs.errors()) == 1 and str(path) in logs.errors()[0]


# -------------------------------------------------------------------------------- merges


def _merge_worker(root: str, worker: int, rounds: int, per_round: int) -> None:
    st = ProfileStore(Path(root))

    def refit(candidate: Profile) -> Profile:
        best = max(candidate.samples, key=lambda s: s.throughput)
        return dataclasses.replace(candidate, cpus_per_gpu=max(1, int(best.cores)))

    for r in range(rounds):
        new = [
            Sample(
                cores=float(worker + 1),
                throughput=float(r * per_round + k),
                gpus=1,
                nodes=1,
                node=f"node{worker}",
            )
            for k in range(per_round)
        ]
        st.merge_samples(SIG, new, refit, source=f"node{worker}", max_samples=100_000)


def test_concurrent_merge_samples_from_processes_loses_nothing(
    store: ProfileStore, root: Path
) -> None:
    workers, rounds, per_round = 6, 25, 2
    procs = [
        _MP.Process(target=_merge_worker, args=(str(root), w, rounds, per_round))
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * workers
    merged = store.read(SIG)
    assert merged is not None
    expected = {(f"node{w}", float(i)) for w in range(workers) for i in range(rounds * per_round)}
    got = [(s.node, s.throughput) for s in merged.samples]
    assert len(got) == len(expected) == merged.n_samples
    assert set(got) == expected
    assert [n for n in os.listdir(root) if n.endswith(".tmp")] == []


def test_concurrent_merge_samples_from_threads_loses_nothing(store: ProfileStore) -> None:
    threads = [
        threading.Thread(target=_merge_worker, args=(str(store.root), w, 10, 3)) for w in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    merged = store.read(SIG)
    assert merged is not None and merged.n_samples == len(merged.samples) == 120


def test_merge_samples_semantics(store: ProfileStore) -> None:
    s = [Sample(cores=float(i), throughput=float(i), gpus=1, nodes=1) for i in range(10)]
    with pytest.raises(ValueError, match="no refit function"):
        store.merge_samples(SIG, s[:2])

    def refit(c: Profile) -> Profile:
        return dataclasses.replace(c, cpus_per_gpu=7, confidence=0.5)

    created = store.merge_samples(SIG, s[:4], refit, now_unix_s=123.0, max_samples=6)
    assert (created.workload, created.cpus_per_gpu, created.n_samples) == ("train", 7, 4)
    assert created.updated_unix_s == 123.0 and created.source == "coda-node"
    # Without refit, the fitted fields stay and the samples grow (most recent kept).
    merged = store.merge_samples(SIG, s[4:], max_samples=6, source="node9")
    assert merged.cpus_per_gpu == 7 and merged.n_samples == 10
    assert [x.cores for x in merged.samples] == [4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    assert store.read(SIG) == merged and merged.source == "node9"

    with pytest.raises(ValueError, match="changed the signature"):
        store.merge_samples(
            SIG, s[:1], lambda c: dataclasses.replace(c, signature="workload:1000:x")
        )
    with pytest.raises(ProfileFormatError):  # refit produced something invalid: not written
        store.merge_samples(SIG, s[:1], lambda c: dataclasses.replace(c, cpus_per_gpu=0))
    assert store.read(SIG) == merged
    with pytest.raises(TypeError):
        store.merge_samples(SIG, [{"cores": 1}])  # type: ignore[list-item]


def test_merge_samples_leaves_unusable_file_alone(store: ProfileStore) -> None:
    path = store.write(make_profile())
    d = json.loads(path.read_bytes())
    d["format_version"] = FORMAT_VERSION + 1
    write_in_place(path, json.dumps(d).encode())
    before = path.read_bytes()
    with pytest.raises(ProfileFormatError, match="newer coda"):
        store.merge_samples(SIG, [Sample(1.0, 1.0, 1, 1)])
    assert path.read_bytes() == before


def _hold_lock(root: str, locked: Any, release: Any) -> None:
    st = ProfileStore(Path(root))
    with st._locked(SIG):
        locked.set()
        release.wait(30)


def test_lock_is_exclusive_across_processes_and_times_out(root: Path) -> None:
    locked, release = _MP.Event(), _MP.Event()
    holder = _MP.Process(target=_hold_lock, args=(str(root), locked, release))
    holder.start()
    try:
        assert locked.wait(10)
        impatient = ProfileStore(root, lock_timeout_s=0.3)
        t0 = time.monotonic()
        with pytest.raises(StoreLockTimeout):
            impatient.write(make_profile())
        assert time.monotonic() - t0 >= 0.3
        # Another signature uses another byte of the lock file: not blocked.
        impatient.write(make_profile(signature="workload:1000:other"))
    finally:
        release.set()
        holder.join(10)
    ProfileStore(root, lock_timeout_s=5).write(make_profile())


# -------------------------------------------------------------------------------- reloader


def test_reloader_refreshes_logs_errors_once_and_survives(
    store: ProfileStore, root: Path, tmp_path: Path
) -> None:
    logs = Logs()
    store.write(make_profile(cpus_per_gpu=8))
    cache = ProfileCache(root, logs)
    ticks: list[int] = []
    reloader = Reloader(cache, 0.01, on_tick=lambda: ticks.append(1)).start()
    try:
        _wait_for(lambda: SIG in cache.snapshot())
        store.write(make_profile(cpus_per_gpu=9))
        _wait_for(lambda: cache.snapshot()[SIG].cpus_per_gpu == 9)

        os.rename(root, tmp_path / "away")  # the NFS mount went away
        _wait_for(lambda: len(logs.errors()) == 1)
        time.sleep(0.1)
        assert len(logs.errors()) == 1  # not once per tick
        assert "keeping the last 1 profiles" in logs.errors()[0]
        assert cache.snapshot()[SIG].cpus_per_gpu == 9

        os.rename(tmp_path / "away", root)
        _wait_for(lambda: any("readable again" in m for _, m in logs.lines))
        assert reloader.alive and ticks
    finally:
        reloader.stop()
    assert not reloader.alive


def test_reloader_survives_unexpected_exceptions_and_retargets(root: Path) -> None:
    logs = Logs()

    class Flaky(ProfileCache):
        calls = 0

        def refresh(self) -> Any:
            Flaky.calls += 1
            if Flaky.calls <= 3:
                raise RuntimeError("bug")
            return super().refresh()

    def bad_tick() -> None:
        raise KeyError("tick")

    reloader = Reloader(Flaky(root, logs), 0.01, logs, on_tick=bad_tick).start()
    try:
        _wait_for(lambda: reloader.refreshes >= 2)
        assert "profile refresh failed: RuntimeError: bug" in logs.errors()
        assert any("reload tick failed: KeyError" in m for m in logs.errors())
        other = ProfileCache(root, logs)
        reloader.retarget(other, 0.02)
        _wait_for(lambda: reloader.cache is other and reloader.refreshes >= 4)
        assert reloader.alive
    finally:
        reloader.stop()
    with pytest.raises(ValueError):
        Reloader(ProfileCache(root, logs), 0)


def _wait_for(cond: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


# -------------------------------------------------------------------------------- timing


@pytest.fixture
def big_store(tmp_path: Path) -> Iterator[tuple[ProfileStore, int]]:
    n = 10_000
    st = ProfileStore(tmp_path / "big")
    st.ensure_root()
    samples = tuple(
        Sample(cores=float(c), throughput=10.0 * c, gpus=4, nodes=1, gpu_model="H100", node="g1")
        for c in range(1, 17)
    )
    for i in range(n):
        p = make_profile(signature=f"workload:{1000 + i % 50}:job{i}", samples=samples)
        # Direct writes: 10,000 fsyncs would only time the disk, not the reader.
        st.path_for(p.signature).write_bytes(encode_profile(p))
    yield st, n


def test_refresh_timing_with_10000_profiles(
    big_store: tuple[ProfileStore, int],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A timing report (not an assertion on time); the structural costs are asserted."""
    st, n = big_store
    age_dir(st.root)
    cache = ProfileCache(st.root, Logs(), full_rescan_every=1_000_000)
    counters = Counters(monkeypatch)
    report: list[str] = []

    cold = cache.refresh()
    assert (cold.changed, counters.take()) == (n, (1, 1, n))
    report.append(f"cold load ({n} parses):            {cold.duration_s * 1e3:9.2f} ms")

    unchanged = [cache.refresh() for _ in range(200)]
    assert all(s.skipped for s in unchanged)
    assert counters.take() == (200, 0, 0)
    per_call = sorted(s.duration_s for s in unchanged)[len(unchanged) // 2]
    report.append(f"unchanged refresh (1 stat, median): {per_call * 1e6:9.2f} us")

    one = st.path_for("workload:1000:job0")
    one.write_bytes(encode_profile(make_profile(signature="workload:1000:job0", cpus_per_gpu=3)))
    age_dir(st.root, 300)
    changed = cache.refresh()
    assert (changed.changed, changed.scanned, counters.take()) == (1, n, (1, 1, 1))
    assert cache.snapshot()["workload:1000:job0"].cpus_per_gpu == 3
    report.append(f"one file changed (scandir+1 parse): {changed.duration_s * 1e3:9.2f} ms")

    cache.full_rescan_every = 1
    rescan = cache.refresh()
    assert (rescan.changed, rescan.skipped, counters.take()) == (0, False, (1, 1, 0))
    report.append(f"periodic full rescan, no change:    {rescan.duration_s * 1e3:9.2f} ms")

    t0 = time.perf_counter()
    for _ in range(100_000):
        cache.snapshot().get("workload:1000:job5")
    lookup_s = (time.perf_counter() - t0) / 100_000
    report.append(f"hook lookup snapshot().get():       {lookup_s * 1e9:9.2f} ns")

    with capsys.disabled():
        print(f"\n[profile store timing, {n} profiles, 16 samples each]")
        for line in report:
            print("  " + line)


# -------------------------------------------------------------------------------- usage (v2)


def _usage(model: str | None = "A100", **kw: Any) -> store_mod.UsageRecord:
    fields: dict[str, Any] = {
        "gpu_model": model,
        "gpu_util": 0.8,
        "gpu_mem_bw_util": 0.4,
        "pcie_bytes_per_s_per_gpu": 9e9,
        "iter_per_s_per_gpu": 12.0,
        "ticks": 10,
        "updated_unix_s": 1_700_000_100.0,
    }
    fields.update(kw)
    return store_mod.UsageRecord(**fields)


def test_version_1_file_reads_with_no_usage(store: ProfileStore) -> None:
    d = make_profile().to_json_dict()
    d["format_version"] = 1
    del d["usage"], d["cpu_usage"]
    for sample in d["samples"]:
        del sample["run"]  # version 3 added it
    path = store.path_for(SIG)
    path.write_text(json.dumps(d))
    p = read_profile_file(path, store.trusted_uids)
    assert p.usage == () and p.cpus_per_gpu == 8
    # A version 1 file with a usage key is not something any coda wrote.
    d["usage"] = []
    with pytest.raises(ProfileFormatError, match=r"unknown key\(s\) usage"):
        Profile.from_json_dict(d, "f.json")
    # Rewriting it (any merge) upgrades it to the current version.
    store.merge_usage(SIG, _usage())
    on_disk = json.loads(path.read_bytes())
    assert on_disk["format_version"] == WRITTEN_WITHOUT_FIGURE
    assert len(on_disk["usage"]) == 1 and on_disk["cpu_usage"] is None


def _cpu_usage(bw: float = 3e9, ticks: int = 10, at: float = 1_700_000_100.0) -> CpuUsageRecord:
    return CpuUsageRecord(mem_bw_bytes_per_s_per_cpu=bw, ticks=ticks, updated_unix_s=at)


def test_version_3_file_reads_with_no_cpu_usage(store: ProfileStore) -> None:
    d = make_profile(usage=(_usage(),)).to_json_dict()
    d["format_version"] = 3
    del d["cpu_usage"]
    path = store.path_for(SIG)
    path.write_text(json.dumps(d))
    p = read_profile_file(path, store.trusted_uids)
    assert p.cpu_usage is None and len(p.usage) == 1
    d["cpu_usage"] = None  # a version 3 file with the key is not something any coda wrote
    with pytest.raises(ProfileFormatError, match=r"unknown key\(s\) cpu_usage"):
        Profile.from_json_dict(d, "f.json")


def test_cpu_usage_creates_a_profile_that_predicts_nothing(store: ProfileStore) -> None:
    p = store.merge_cpu_usage("workload:1000:stream", _cpu_usage())
    assert p.cpu_usage == _cpu_usage()
    assert (p.confidence, p.n_samples, p.source, p.workload) == (0.0, 0, "cpu-usage", "stream")
    again = store.read("workload:1000:stream")
    assert again == p
    # The hook's view carries the record; confidence 0 is below any MinConfidence.
    assert to_view(again).cpu_usage == _cpu_usage()


def test_cpu_usage_merges_weighted_by_ticks(store: ProfileStore) -> None:
    store.write(make_profile(usage=(_usage(),)))
    store.merge_cpu_usage(SIG, _cpu_usage(bw=2e9, ticks=30, at=100.0))
    p = store.merge_cpu_usage(SIG, _cpu_usage(bw=6e9, ticks=10, at=50.0))
    assert p.cpu_usage == _cpu_usage(bw=3e9, ticks=40, at=100.0)
    # The GPU side of the profile is untouched.
    assert (p.cpus_per_gpu, len(p.usage), p.samples) == (8, 1, make_profile().samples)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ([], "cpu_usage must be an object or null"),
        ({"mem_bw_bytes_per_s_per_cpu": 1.0, "ticks": 1}, "missing key"),
        ({"mem_bw_bytes_per_s_per_cpu": -1.0, "ticks": 1, "updated_unix_s": 0.0}, "cpu_usage"),
        ({"mem_bw_bytes_per_s_per_cpu": 1.0, "ticks": 0, "updated_unix_s": 0.0}, "ticks"),
        ({"mem_bw_bytes_per_s_per_cpu": "1", "ticks": 1, "updated_unix_s": 0.0}, "cpu_usage"),
    ],
)
def test_bad_cpu_usage_is_refused(value: object, problem: str) -> None:
    d = make_profile().to_json_dict()
    d["cpu_usage"] = value
    with pytest.raises(ProfileFormatError, match=problem):
        Profile.from_json_dict(d, "f.json")


def test_cpu_usage_refuses_a_bad_record_and_writes_nothing(store: ProfileStore) -> None:
    with pytest.raises((ValueError, ProfileFormatError)):
        store.merge_cpu_usage("workload:1000:x", _cpu_usage(bw=float("nan")))
    with pytest.raises(TypeError):
        store.merge_cpu_usage("workload:1000:x", _usage())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="signature"):
        store.merge_cpu_usage("nonsense", _cpu_usage())
    assert store.read("workload:1000:x") is None


def test_usage_round_trip(store: ProfileStore) -> None:
    usage = (_usage("A100"), _usage("V100", pcie_bytes_per_s_per_gpu=None, iter_per_s_per_gpu=None))
    p = make_profile(usage=usage)
    path = store.write(p)
    d = json.loads(path.read_bytes())
    assert d["format_version"] == WRITTEN_WITHOUT_FIGURE
    assert d["usage"][1] == {
        "gpu_model": "V100",
        "gpu_util": 0.8,
        "gpu_mem_bw_util": 0.4,
        "pcie_bytes_per_s_per_gpu": None,
        "iter_per_s_per_gpu": None,
        "ticks": 10,
        "updated_unix_s": 1_700_000_100.0,
    }
    assert store.read(SIG) == p
    assert to_view(p).usage == usage


def test_version_2_file_must_have_usage() -> None:
    with pytest.raises(ProfileFormatError, match=r"missing key\(s\) usage"):
        Profile.from_json_dict(_bad(usage=_DELETE), "f.json")


def _bad_usage(**changes: Any) -> dict[str, Any]:
    entry = store_mod.usage_to_json_dict(_usage())
    for key, value in changes.items():
        if value is _DELETE:
            del entry[key]
        else:
            entry[key] = value
    return _bad(usage=[entry])


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        (_bad(usage={}), "usage must be a list"),
        (_bad(usage=[1]), "usage[0] must be an object"),
        (_bad_usage(gpu_util=1.5), "usage[0].gpu_util must be a number within 0..1"),
        (_bad_usage(gpu_util=-0.1), "usage[0].gpu_util must be a number within 0..1"),
        (_bad_usage(gpu_util=None), "usage[0].gpu_util must be a number within 0..1, got null"),
        (_bad_usage(gpu_mem_bw_util=2), "usage[0].gpu_mem_bw_util must be a number within 0..1"),
        (
            _bad_usage(pcie_bytes_per_s_per_gpu=-1),
            "usage[0].pcie_bytes_per_s_per_gpu must be a number >= 0 or null",
        ),
        (_bad_usage(iter_per_s_per_gpu="fast"), "usage[0].iter_per_s_per_gpu must be a number"),
        (_bad_usage(ticks=0), "usage[0].ticks must be an integer >= 1"),
        (_bad_usage(ticks=2.5), "usage[0].ticks must be an integer >= 1"),
        (_bad_usage(gpu_model=""), "usage[0].gpu_model must be a non-empty string or null"),
        (_bad_usage(ticks=_DELETE), "usage[0]: missing key(s) ticks"),
        (_bad_usage(watts=300), "usage[0]: unknown key(s) watts"),
        (
            _bad(usage=[store_mod.usage_to_json_dict(_usage("A100"))] * 2),
            "usage[1]: a second record for GPU model 'A100'",
        ),
        (
            _bad(
                usage=[
                    store_mod.usage_to_json_dict(_usage("A100")),
                    store_mod.usage_to_json_dict(_usage("a100")),
                ]
            ),
            "one record per model",
        ),
    ],
)
def test_usage_rejects(doc: Any, needle: str) -> None:
    with pytest.raises(ProfileFormatError) as info:
        Profile.from_json_dict(doc, "/store/abc.json")
    assert str(info.value).startswith("/store/abc.json: ")
    assert needle in str(info.value)


def test_nan_in_usage_is_rejected() -> None:
    text = json.dumps(_bad_usage(gpu_util=float("nan")))
    with pytest.raises(ProfileFormatError, match="not valid JSON"):
        store_mod.decode_profile(text.encode(), "f.json")


def test_merge_usage_weights_by_ticks_and_keeps_other_models(store: ProfileStore) -> None:
    v100 = _usage("V100", gpu_util=0.5, ticks=3)
    store.write(make_profile(usage=(_usage("A100", ticks=10), v100)))
    new = _usage(
        "a100",  # same model, other spelling: merged, not a second record
        gpu_util=0.2,
        gpu_mem_bw_util=0.1,
        pcie_bytes_per_s_per_gpu=None,  # not measured this time: the old value stays
        iter_per_s_per_gpu=24.0,
        ticks=30,
        updated_unix_s=1_700_000_500.0,
    )
    merged = store.merge_usage(SIG, new)
    assert merged is not None and store.read(SIG) == merged
    a100, other = merged.usage
    assert other == v100
    assert a100.ticks == 40
    assert a100.gpu_util == pytest.approx((0.8 * 10 + 0.2 * 30) / 40)
    assert a100.gpu_mem_bw_util == pytest.approx((0.4 * 10 + 0.1 * 30) / 40)
    assert a100.pcie_bytes_per_s_per_gpu == 9e9
    assert a100.iter_per_s_per_gpu == pytest.approx((12.0 * 10 + 24.0 * 30) / 40)
    assert a100.updated_unix_s == 1_700_000_500.0
    # An older record does not move the timestamp back; a new model is appended.
    again = store.merge_usage(SIG, _usage("H100", updated_unix_s=1.0))
    assert again is not None
    assert [u.gpu_model for u in again.usage] == ["a100", "V100", "H100"]
    # The CPU prediction is untouched.
    assert (again.cpus_per_gpu, again.samples, again.updated_unix_s) == (
        merged.cpus_per_gpu,
        merged.samples,
        merged.updated_unix_s,
    )


def test_merge_usage_fills_a_field_the_old_record_lacked(store: ProfileStore) -> None:
    store.write(make_profile(usage=(_usage(iter_per_s_per_gpu=None, ticks=5),)))
    merged = store.merge_usage(SIG, _usage(iter_per_s_per_gpu=7.0, ticks=1))
    assert merged is not None
    assert merged.usage[0].iter_per_s_per_gpu == 7.0
    assert merged.usage[0].ticks == 6


def test_merge_usage_without_profile_writes_nothing(store: ProfileStore, root: Path) -> None:
    assert store.merge_usage(SIG, _usage()) is None
    assert [n for n in os.listdir(root) if not n.startswith(".")] == []


def test_merge_usage_refuses_invalid_record_and_unusable_file(store: ProfileStore) -> None:
    path = store.write(make_profile())
    before = path.read_bytes()
    with pytest.raises(ProfileFormatError, match=r"gpu_util must be a number within 0\.\.1"):
        store.merge_usage(SIG, _usage(gpu_util=1.2))
    with pytest.raises(TypeError):
        store.merge_usage(SIG, {"gpu_util": 0.5})  # type: ignore[arg-type]
    assert path.read_bytes() == before
    d = json.loads(before)
    d["format_version"] = FORMAT_VERSION + 1
    write_in_place(path, json.dumps(d).encode())
    with pytest.raises(ProfileFormatError, match="newer coda"):
        store.merge_usage(SIG, _usage())


def test_cache_serves_usage_to_the_hook(root: Path, logs: Logs) -> None:
    st = ProfileStore(root)
    st.write(make_profile())
    cache = ProfileCache(root, logs)
    cache.refresh()
    assert cache.snapshot()[SIG].usage == ()
    st.merge_usage(SIG, _usage())
    cache.full_rescan_every = 1
    cache.refresh()
    assert cache.snapshot()[SIG].usage == (_usage(),)


@pytest.mark.parametrize("levels", [17, 500])
def test_a_fit_nested_too_deep_is_refused_when_read(levels: int) -> None:
    # `coda-slurm profiles show/export` re-encode the fit: a file the reader accepted must
    # not be one they cannot write back (RecursionError at 500 levels).
    fit: dict[str, Any] = {}
    inner = fit
    for _ in range(levels - 1):
        inner["k"] = {}
        inner = inner["k"]
    with pytest.raises(ProfileFormatError, match="nested deeper than 16 levels"):
        Profile.from_json_dict(_bad(fit=fit), "/store/deep.json")


def test_a_fit_as_deep_as_allowed_is_read_and_written_back() -> None:
    fit: dict[str, Any] = {}
    inner = fit
    for _ in range(15):
        inner["k"] = {}
        inner = inner["k"]
    profile = Profile.from_json_dict(_bad(fit=fit), "/store/ok.json")
    assert json.loads(json.dumps(profile.to_json_dict()))["fit"] == fit
