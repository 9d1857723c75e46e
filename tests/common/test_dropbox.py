"""The drop directory's collector and writer without munged: munge's answer is a stand-in
(``decode``), so these cover what coda decides after munge has spoken, and the file
handling. tests/common/test_dropbox_slurm.py runs the same paths against a real munged."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from coda_common.publish import dropbox, munge
from coda_common.publish.dropbox import (
    MAX_DROP_FILE_BYTES,
    Collector,
    Drop,
    DropError,
    HostFilter,
)
from coda_common.store.profiles import CpuUsageRecord, ProfileStore, Sample, UsageRecord

NOW_S = 1_800_000_000.0
SIG = "workload:1000:train"


def _drop(signature: str = SIG, made_s: float = NOW_S) -> Drop:
    run = f"gpu1:7:{int(made_s)}"
    samples = tuple(
        Sample(float(c), t, 1, 1, "a100", "gpu1", run) for c, t in ((1, 0.6), (2, 1.0), (4, 1.0))
    )
    return Drop(signature, "gpu1", samples, made_s)


class FakeMunge:
    """``decode``: the credential is ``<uid>|<host>|<time>|<payload>`` (or munge's status)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, credential: bytes, _socket: Path) -> munge.Decoded:
        self.calls += 1
        uid, host, made, payload = credential.split(b"|", 3)
        return munge.Decoded(
            status=0,
            status_text="Success",
            uid=int(uid),
            gid=0,
            encode_host=host.decode(),
            encode_time_unix_s=int(made),
            ttl_s=300,
            payload=payload,
        )


def _cred(drop: Drop, uid: int = 0, host: str = "10.0.0.5") -> bytes:
    return f"{uid}|{host}|{int(drop.made_unix_s)}|".encode() + drop.to_json_bytes()


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Collector, Path, list[str], FakeMunge]:
    drop_dir = tmp_path / "drop"
    drop_dir.mkdir(mode=0o1777)
    lines: list[str] = []
    fake = FakeMunge()
    collector = Collector(
        drop_dir,
        ProfileStore(tmp_path / "store"),
        tmp_path / "sock",
        accept_uids=[0],
        hosts=HostFilter(["10.0.0.0/24"]),
        log=lambda level, msg: lines.append(f"{level}: {msg}"),
        decode=fake,
        clock=lambda: NOW_S,
    )
    return collector, drop_dir, lines, fake


def _put(drop_dir: Path, data: bytes, name: str = "a" * 32) -> Path:
    path = drop_dir / f"{name}.munge"
    path.write_bytes(data)
    return path


def test_accepted_samples_are_merged_and_the_file_removed(setup) -> None:
    collector, drop_dir, lines, _ = setup
    path = _put(drop_dir, _cred(_drop()))
    stats = collector.collect()
    assert (stats.accepted, stats.refused, stats.samples) == (1, 0, 3)
    assert not path.exists()
    prof = collector.store.read(SIG)
    assert prof is not None and prof.n_samples == 3 and prof.source == "coda-node:gpu1"
    assert len(lines) == 1 and "3 samples of workload:1000:train from node gpu1 merged" in lines[0]


def test_a_credential_consumed_before_is_refused_even_when_munged_forgot_it(setup) -> None:
    # A restarted munged has an empty replay cache; the record in the store does not.
    collector, drop_dir, lines, _ = setup
    cred = _cred(_drop())
    _put(drop_dir, cred)
    collector.collect()
    _put(drop_dir, cred, "b" * 32)
    stats = collector.collect()
    assert stats.refused == 1 and "replayed munge credential" in stats.refusals[0]
    assert "consumed before" in lines[-1] and collector.store.read(SIG).n_samples == 3
    assert (collector.store.root / dropbox.SEEN_FILE_NAME).stat().st_mode & 0o077 == 0


@pytest.mark.parametrize(
    ("cred", "why"),
    [
        (_cred(_drop(), uid=1000), "made by uid 1000, only uid 0 accepted"),
        (_cred(_drop(), host="192.0.2.7"), "made on host 192.0.2.7, which is not a node"),
        (_cred(_drop("workload:1000:x\n")), "contains control characters"),
        (b"0|10.0.0.5|1|" + b'{"format": "coda-drop"}', "format_version None"),
        (b"0|10.0.0.5|1|" + b"\xff\xfe", "payload is not JSON"),
        (b"0|10.0.0.5|1|" + b"[" * 100_000, "payload is not JSON: nested too deeply"),
    ],
)
def test_refusals_each_give_one_line_and_merge_nothing(setup, cred: bytes, why: str) -> None:
    collector, drop_dir, lines, _ = setup
    path = _put(drop_dir, cred)
    stats = collector.collect()
    assert stats.refused == 1 and stats.accepted == 0
    assert len(lines) == 1 and why in lines[0] and "nothing merged" in lines[0]
    assert not path.exists() and collector.store.read(SIG) is None


def test_a_100_mb_file_is_refused_unread(setup) -> None:
    collector, drop_dir, lines, fake = setup
    path = drop_dir / f"{'c' * 32}.munge"
    with path.open("wb") as f:
        f.truncate(100 * 1024 * 1024)  # sparse: its size is what the collector sees first
    stats = collector.collect()
    assert stats.refused == 1 and fake.calls == 0
    assert f"104857600 bytes, more than {MAX_DROP_FILE_BYTES} (not read)" in lines[0]
    assert not path.exists()


def test_symlinks_hard_links_and_fifos_are_left_alone_and_their_targets_untouched(
    setup, tmp_path: Path
) -> None:
    collector, drop_dir, lines, fake = setup
    victim = tmp_path / "victim"
    victim.write_bytes(_cred(_drop()))
    (drop_dir / f"{'1' * 32}.munge").symlink_to(victim)
    os.link(victim, drop_dir / f"{'2' * 32}.munge")
    os.mkfifo(drop_dir / f"{'3' * 32}.munge")
    (drop_dir / "notes.txt").write_text("not ours")
    stats = collector.collect()
    assert (stats.accepted, stats.refused, stats.left_alone) == (0, 0, 3)
    assert fake.calls == 0 and collector.store.read(SIG) is None
    assert victim.read_bytes() == _cred(_drop())
    assert sorted(p.name for p in drop_dir.iterdir()) == sorted(
        [f"{'1' * 32}.munge", f"{'2' * 32}.munge", f"{'3' * 32}.munge", "notes.txt"]
    )
    assert [line.split(": ", 2)[2] for line in lines] == [
        "a symbolic link; left alone, not read",
        "2 hard links; left alone, not read",
        "not a regular file; left alone, not read",
    ]
    collector.collect()
    assert len(lines) == 3  # logged once per inode


def test_the_writer_never_writes_through_a_planted_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_dir = tmp_path / "drop"
    drop_dir.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    monkeypatch.setattr(dropbox.munge, "encode", lambda payload, *a, **k: b"CRED" + payload)
    monkeypatch.setattr(dropbox.secrets, "token_hex", lambda _n: "f" * 32)
    (drop_dir / f".{'f' * 32}.tmp").symlink_to(victim)
    with pytest.raises(DropError, match="cannot create"):
        dropbox.drop(_drop(), drop_dir, tmp_path / "sock", ttl_s=60)
    (drop_dir / f".{'f' * 32}.tmp").unlink()
    (drop_dir / f"{'f' * 32}.munge").symlink_to(victim)
    with pytest.raises(DropError, match="cannot write"):
        dropbox.drop(_drop(), drop_dir, tmp_path / "sock", ttl_s=60)
    assert victim.read_text() == "precious"
    assert sorted(p.name for p in drop_dir.iterdir()) == [f"{'f' * 32}.munge"]


def test_host_filter_names_addresses_networks_and_slurm_nodes() -> None:
    fixed = HostFilter(["10.1.0.0/16", "192.0.2.9", "localhost"])
    assert fixed.allowed("10.1.200.3") and fixed.allowed("192.0.2.9")
    assert fixed.allowed("127.0.0.1")  # localhost resolved
    assert not fixed.allowed("10.2.0.1") and not fixed.allowed("nonsense")
    calls: list[int] = []

    def nodes() -> frozenset[str]:
        calls.append(1)
        return frozenset({"10.0.0.5"})

    from_slurm = HostFilter([], nodes, refresh_s=3600)
    assert from_slurm.allowed("10.0.0.5") and not from_slurm.allowed("10.0.0.6")
    assert len(calls) == 1


def test_payload_round_trip() -> None:
    d = _drop()
    assert Drop.from_json_bytes(d.to_json_bytes(), "x") == d


def test_a_writer_crash_leaves_a_temp_file_swept_after_an_hour(setup) -> None:
    collector, drop_dir, _, _ = setup
    old = drop_dir / f".{'d' * 32}.tmp"
    fresh = drop_dir / f".{'e' * 32}.tmp"
    for path in (old, fresh):
        path.write_bytes(b"MUNGE:half")
    stale_s = NOW_S - dropbox.STALE_TEMP_S - 1
    os.utime(old, (stale_s, stale_s))
    os.utime(fresh, (NOW_S, NOW_S))
    collector.collect()
    assert not old.exists() and fresh.exists()


# -------------------------------------------------------------------------------- usage records


def _usage(model: str = "a100") -> UsageRecord:
    return UsageRecord(model, 0.9, 0.4, 6e9, 11.5, 30, NOW_S)


def _cpu(bw: float = 4e9) -> CpuUsageRecord:
    return CpuUsageRecord(bw, 30, NOW_S)


def test_samples_only_drops_stay_version_1_for_older_collectors() -> None:
    assert json.loads(_drop().to_json_bytes())["format_version"] == 1
    with_usage = dataclasses.replace(_drop(), samples=(), usage=(_usage(),))
    assert json.loads(with_usage.to_json_bytes())["format_version"] == 2
    for d in (with_usage, dataclasses.replace(with_usage, usage=(), cpu_usage=_cpu())):
        assert Drop.from_json_bytes(d.to_json_bytes(), "x") == d


def test_usage_records_are_merged(setup) -> None:
    collector, drop_dir, lines, _ = setup
    _put(drop_dir, _cred(_drop()), "a" * 32)  # samples make the GPU profile
    collector.collect()
    gpu = dataclasses.replace(_drop(), samples=(), usage=(_usage(),))
    cpu = Drop("workload:1000:stream", "gpu1", (), NOW_S, cpu_usage=_cpu())
    _put(drop_dir, _cred(gpu, host="10.0.0.6"), "b" * 32)
    _put(drop_dir, _cred(cpu, host="10.0.0.7"), "c" * 32)
    stats = collector.collect()
    assert (stats.accepted, stats.refused) == (2, 0)
    prof = collector.store.read(SIG)
    assert prof is not None and prof.usage == (_usage(),) and prof.n_samples == 3
    stream = collector.store.read("workload:1000:stream")
    assert stream is not None and stream.cpu_usage == _cpu() and stream.confidence == 0.0
    assert any("GPU usage on a100 of workload:1000:train from node gpu1 merged" in x for x in lines)
    assert any("4.00 GB/s per CPU over 30 ticks" in x for x in lines)


def test_gpu_usage_without_a_profile_is_said_and_not_kept(setup) -> None:
    collector, drop_dir, lines, _ = setup
    _put(drop_dir, _cred(dataclasses.replace(_drop(), samples=(), usage=(_usage(),))))
    stats = collector.collect()
    assert stats.accepted == 1 and collector.store.read(SIG) is None
    assert "not merged: no profile for it" in lines[-1]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"usage": [], "cpu_usage": None}, "no samples and no usage record"),
        ({"cpu_usage": {"mem_bw_bytes_per_s_per_cpu": -1.0, "ticks": 1}}, "cpu_usage"),
        ({"usage": [{"gpu_model": "a100"}] * 17}, "usage must be a list of at most 16"),
        ({"usage": None}, "usage must be a list"),
        ({"format_version": 3}, "format_version 3 is not 1 to 2"),
        ({"format_version": True}, "format_version True"),
    ],
)
def test_bad_usage_payloads_are_refused(setup, change: dict, why: str) -> None:
    collector, drop_dir, lines, _ = setup
    d = json.loads(dataclasses.replace(_drop(), samples=(), cpu_usage=_cpu()).to_json_bytes())
    d.update(change)
    cred = f"0|10.0.0.5|{int(NOW_S)}|".encode() + json.dumps(d).encode()
    _put(drop_dir, cred)
    stats = collector.collect()
    assert (stats.accepted, stats.refused) == (0, 1)
    assert why in lines[-1] and collector.store.read(SIG) is None


def test_version_1_needs_samples_and_knows_no_usage(setup) -> None:
    collector, drop_dir, lines, _ = setup
    d = json.loads(_drop().to_json_bytes())
    d["samples"] = []
    _put(drop_dir, f"0|10.0.0.5|{int(NOW_S)}|".encode() + json.dumps(d).encode(), "a" * 32)
    d = json.loads(_drop().to_json_bytes())
    d["cpu_usage"] = None
    _put(drop_dir, f"0|10.0.0.6|{int(NOW_S)}|".encode() + json.dumps(d).encode(), "b" * 32)
    stats = collector.collect()
    assert stats.refused == 2
    assert any("samples must be a list of 1 to" in x for x in lines)
    assert any("unknown keys ['cpu_usage']" in x for x in lines)
