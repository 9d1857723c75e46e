"""Slurm accounting for the dev cluster: slurmdbd on a private MariaDB server.

Everything lives under ``<cluster root>/accounting``: the MariaDB data directory, its unix
socket, slurmdbd's ``slurmdbd.conf`` (next to ``slurm.conf``: slurmdbd reads it from the
directory of ``SLURM_CONF``), logs and a state file of the process ids this module started.
MariaDB listens on 127.0.0.1 only, on a port picked free at configuration time; no system
service of the host is touched.  :meth:`DevAccounting.stop` ends both daemons, and
:meth:`DevAccounting.start` first ends what a cluster that was never stopped left running.

Slurm's accounting setup, which this follows: https://slurm.schedmd.com/accounting.html
(slurmdbd.conf: https://slurm.schedmd.com/slurmdbd.conf.html).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from slurm_plugin.devtools.procs import free_ports, pid_alive, stop_pid

DB_NAME = "slurm_acct_db"
DB_USER = "slurm"
STATE_FILE = "accounting.json"
START_TIMEOUT_S = 60.0
"""Bounds our waiting only; slurmdbd's first start creates its tables (a few seconds)."""
TOOLS = ("mariadb-install-db", "mariadbd", "mariadb", "slurmdbd", "sacctmgr", "sacct")


class AccountingError(RuntimeError):
    """Accounting could not be set up, started or stopped; says why."""


def missing_tools() -> list[str]:
    """The programs accounting needs that are not on PATH (Debian: mariadb-server, slurmdbd)."""
    return [t for t in TOOLS if shutil.which(t) is None]


@dataclass(frozen=True, slots=True)
class DevAccounting:
    """slurmdbd and MariaDB of the dev cluster in ``cluster_root``."""

    cluster_root: Path
    slurm_etc: Path
    """The directory of the cluster's slurm.conf: slurmdbd.conf must sit next to it."""
    munge_socket: Path
    cluster_name: str = "coda-dev"

    # -- paths ---------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return self.cluster_root / "accounting"

    @property
    def datadir(self) -> Path:
        return self.dir / "mariadb"

    @property
    def db_socket(self) -> Path:
        return self.dir / "mariadb.sock"

    @property
    def slurmdbd_conf(self) -> Path:
        return self.slurm_etc / "slurmdbd.conf"

    @property
    def slurmdbd_log(self) -> Path:
        return self.dir / "slurmdbd.log"

    @property
    def mariadb_log(self) -> Path:
        return self.dir / "mariadb.err"

    @property
    def state_path(self) -> Path:
        return self.dir / STATE_FILE

    # -- configuration -------------------------------------------------------
    def configure(self) -> str:
        """Pick the two ports, write slurmdbd.conf (mode 600, owned by SlurmUser, as
        slurmdbd insists) and return the ``slurm.conf`` lines that point slurmctld at it."""
        missing = missing_tools()
        if missing:
            raise AccountingError(
                f"{', '.join(missing)} not found", "install Debian's mariadb-server and slurmdbd"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        db_port, dbd_port = free_ports(2)
        password = secrets.token_hex(16)
        state = self._load_state()
        state.update(db_port=db_port, dbd_port=dbd_port, password=password)
        self._save_state(state)
        conf = (
            "# Written by coda dev-cluster: slurmdbd of the private dev cluster.\n"
            "AuthType=auth/munge\n"
            f"AuthInfo=socket={self.munge_socket}\n"
            "DbdHost=localhost\n"
            "DbdAddr=127.0.0.1\n"
            f"DbdPort={dbd_port}\n"
            "SlurmUser=root\n"
            "DebugLevel=info\n"
            f"LogFile={self.slurmdbd_log}\n"
            f"PidFile={self.dir / 'slurmdbd.pid'}\n"
            "StorageType=accounting_storage/mysql\n"
            "StorageHost=127.0.0.1\n"
            f"StoragePort={db_port}\n"
            f"StorageUser={DB_USER}\n"
            f"StoragePass={password}\n"
            f"StorageLoc={DB_NAME}\n"
        )
        fd = os.open(self.slurmdbd_conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(conf)
        os.chmod(self.slurmdbd_conf, 0o600)  # an older file keeps its mode through O_TRUNC
        return slurm_conf_lines(dbd_port, self.munge_socket)

    # -- lifecycle -----------------------------------------------------------
    def start(self, env: Mapping[str, str]) -> None:
        """Start MariaDB, create the database user, start slurmdbd and register the
        cluster.  ``env`` is the Slurm clients' environment (``SLURM_CONF``)."""
        state = self._load_state()
        if "dbd_port" not in state:
            raise AccountingError("accounting is not configured", "configure() writes it first")
        self._stop_recorded(state)
        pids: dict[str, int] = {}
        pids["mariadbd"] = self._start_mariadb(int(state["db_port"]))
        state["pids"] = pids
        self._save_state(state)
        self._create_db_user(str(state["password"]))
        with open(self.dir / "slurmdbd.stderr", "ab") as err:
            proc = subprocess.Popen(
                ["slurmdbd", "-D"],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                start_new_session=True,
                cwd=self.dir,
            )
        pids["slurmdbd"] = proc.pid
        self._save_state(state)
        self._wait_for(
            lambda: (
                proc.poll() is not None or self._sacctmgr(env, ["list", "cluster"]).returncode == 0
            ),
            "slurmdbd to answer sacctmgr",
            self.slurmdbd_log,
        )
        if proc.poll() is not None:
            raise AccountingError(
                f"slurmdbd exited {proc.returncode}",
                f"see {self.slurmdbd_log} and {self.dir / 'slurmdbd.stderr'}",
            )
        listed = self._sacctmgr(env, ["-n", "-P", "list", "cluster", "format=Cluster"]).stdout
        if self.cluster_name not in listed.split():
            proc2 = self._sacctmgr(env, ["-i", "add", "cluster", self.cluster_name])
            if proc2.returncode != 0:
                raise AccountingError(
                    f"sacctmgr add cluster {self.cluster_name} exited {proc2.returncode}",
                    proc2.stderr.strip() or proc2.stdout.strip() or "no output",
                )

    def stop(self) -> None:
        """Stop slurmdbd, then MariaDB (slurmdbd flushes to it on the way out)."""
        state = self._load_state()
        self._stop_recorded(state)
        if state.pop("pids", None) is not None:
            self._save_state(state)

    def status(self) -> dict[str, bool]:
        """Whether each daemon this module started is alive (empty when none was)."""
        pids = self._load_state().get("pids", {})
        return {name: pid_alive(int(pid)) for name, pid in pids.items()}

    # -- internals -----------------------------------------------------------
    def _start_mariadb(self, port: int) -> int:
        if not (self.datadir / "mysql").is_dir():
            shutil.rmtree(self.datadir, ignore_errors=True)
            proc = subprocess.run(
                [
                    "mariadb-install-db",
                    f"--datadir={self.datadir}",
                    "--user=root",
                    "--auth-root-authentication-method=socket",
                    "--skip-test-db",
                ],
                capture_output=True,
                text=True,
                timeout=START_TIMEOUT_S,
            )
            if proc.returncode != 0:
                raise AccountingError(
                    f"mariadb-install-db exited {proc.returncode}",
                    (proc.stderr.strip() or proc.stdout.strip())[-800:] or "no output",
                )
        with contextlib.suppress(FileNotFoundError):
            self.db_socket.unlink()  # left by a server that was killed
        with open(self.dir / "mariadbd.stdout", "ab") as out:
            proc2 = subprocess.Popen(
                [
                    "mariadbd",
                    "--no-defaults",  # not the host's /etc/mysql: its socket, port, datadir
                    f"--datadir={self.datadir}",
                    f"--socket={self.db_socket}",
                    f"--port={port}",
                    "--bind-address=127.0.0.1",
                    f"--pid-file={self.dir / 'mariadbd.pid'}",
                    f"--log-error={self.mariadb_log}",
                    "--user=root",
                    "--skip-name-resolve",
                    # slurmdbd's recommended settings (accounting.html, "MySQL Configuration").
                    "--innodb-buffer-pool-size=128M",
                    "--innodb-lock-wait-timeout=900",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                cwd=self.dir,
            )
        self._wait_for(
            lambda: self._sql("SELECT 1").returncode == 0 or proc2.poll() is not None,
            "MariaDB to answer on its socket",
            self.mariadb_log,
        )
        if proc2.poll() is not None:
            raise AccountingError(f"mariadbd exited {proc2.returncode}", f"see {self.mariadb_log}")
        return proc2.pid

    def _create_db_user(self, password: str) -> None:
        statements = [f"CREATE DATABASE IF NOT EXISTS {DB_NAME}"]
        for host in ("127.0.0.1", "localhost"):
            statements += [
                f"CREATE OR REPLACE USER '{DB_USER}'@'{host}' IDENTIFIED BY '{password}'",
                f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'{host}'",
            ]
        proc = self._sql("; ".join(statements))
        if proc.returncode != 0:
            raise AccountingError("cannot create the slurmdbd database user", proc.stderr.strip())

    def _sql(self, statement: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                "mariadb",
                "--no-defaults",
                f"--socket={self.db_socket}",
                "-u",
                "root",
                "-e",
                statement,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )

    def _sacctmgr(
        self, env: Mapping[str, str], args: list[str]
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["sacctmgr", *args],
            env=dict(env),
            capture_output=True,
            encoding="utf-8",
            errors="replace",
            timeout=30,
        )

    def _stop_recorded(self, state: Mapping[str, object]) -> None:
        pids = state.get("pids") or {}
        assert isinstance(pids, dict)
        for name in ("slurmdbd", "mariadbd"):
            pid = pids.get(name)
            if pid and _is_program(int(pid), name):
                stop_pid(int(pid), timeout_s=30.0)

    def _wait_for(self, predicate: Callable[[], bool], what: str, log: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.2)
        raise AccountingError(f"timed out waiting for {what}", f"see {log}")

    def _load_state(self) -> dict:
        try:
            return json.loads(self.state_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def _save_state(self, state: Mapping[str, object]) -> None:
        fd = os.open(self.state_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(state, f)


def slurm_conf_lines(dbd_port: int, munge_socket: Path) -> str:
    """slurm.conf's accounting lines.  ``AccountingStorageTRES=gres/gpu`` makes GPUs a TRES
    (sacct's AllocTRES shows ``gres/gpu=N``); Slurm refuses it without slurmdbd.  With
    slurmdbd, ``AccountingStoragePass`` names the munge socket the clients' connections to
    it use (slurm.conf(5)); ``AuthInfo`` does not cover them."""
    return (
        "AccountingStorageType=accounting_storage/slurmdbd\n"
        "AccountingStorageHost=127.0.0.1\n"
        f"AccountingStoragePort={dbd_port}\n"
        f"AccountingStoragePass={munge_socket}\n"
        "AccountingStorageTRES=gres/gpu\n"
        # jobacct_gather's poll of running steps (sacct's TRESUsageInTot); default 30 s.
        "JobAcctGatherFrequency=task=10\n"
    )


def _is_program(pid: int, name: str) -> bool:
    """``pid`` is alive and runs ``name`` (a recycled pid is someone else's process)."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return False
    return pid_alive(pid) and comm == name[:15]
