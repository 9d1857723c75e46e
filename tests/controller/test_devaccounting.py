"""The dev cluster's accounting configuration, without starting anything."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from slurm_plugin.devtools import accounting as devaccounting
from slurm_plugin.devtools.accounting import AccountingError, DevAccounting


def _acct(tmp_path: Path) -> DevAccounting:
    (tmp_path / "etc").mkdir()
    return DevAccounting(tmp_path, tmp_path / "etc", tmp_path / "munge" / "munge.socket")


def test_configure_writes_a_private_slurmdbd_conf_and_points_slurm_conf_at_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devaccounting, "missing_tools", list)
    acct = _acct(tmp_path)
    lines = acct.configure()
    conf = dict(
        line.split("=", 1) for line in acct.slurmdbd_conf.read_text().splitlines() if "=" in line
    )
    # slurmdbd refuses a slurmdbd.conf that others can read (it holds StoragePass).
    assert stat.S_IMODE(acct.slurmdbd_conf.stat().st_mode) == 0o600
    assert conf["DbdAddr"] == "127.0.0.1" and conf["StorageHost"] == "127.0.0.1"
    assert conf["AuthInfo"] == f"socket={tmp_path / 'munge' / 'munge.socket'}"
    assert conf["StorageLoc"] == "slurm_acct_db"
    slurm = dict(line.split("=", 1) for line in lines.splitlines())
    assert slurm["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert slurm["AccountingStoragePort"] == conf["DbdPort"]
    assert slurm["AccountingStoragePass"] == str(tmp_path / "munge" / "munge.socket")
    assert slurm["AccountingStorageTRES"] == "gres/gpu"
    assert acct.status() == {}  # configured, nothing started


def test_missing_packages_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "slurmdbd" else "/bin/x")
    with pytest.raises(AccountingError, match="slurmdbd not found") as err:
        _acct(tmp_path).configure()
    assert "mariadb-server and slurmdbd" in str(err.value)


def test_stop_without_a_start_does_nothing(tmp_path: Path) -> None:
    acct = _acct(tmp_path)
    acct.stop()
    assert not acct.dir.exists()
