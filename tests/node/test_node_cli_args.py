"""``coda-node limit`` and ``release`` given absurd job ids and reasons, as a tired admin or
a script types them: a usage error that says why, and the limits already recorded stay as
they were and can still be changed."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from coda_node.cli import cli
from coda_node.enforce.state import LIMITS_FILE, Limit, load_limits, save_limits

JOB = 4242


def _conf(tmp_path: Path) -> Path:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    conf = tmp_path / "coda.conf"
    conf.write_text(
        f"NodeRoot={tmp_path / 'root'}\nNodeStateDir={state_dir}\n"
        f"NodeRuntimeDir={tmp_path / 'run'}\n"
    )
    save_limits(state_dir, {JOB: Limit(cores=2, reason="kept")})
    return conf


def _coda_node(conf: Path, command: str, *args: str) -> Result:
    return CliRunner().invoke(cli, [command, "--conf", str(conf), *args], prog_name="coda-node")


@pytest.mark.parametrize("job_id", ["0", str(1 << 32), str(1 << 70), "00", "1e3", "x" * 10_000])
@pytest.mark.parametrize("command", ["limit", "release"])
def test_a_job_id_slurm_never_gives_is_a_usage_error_and_the_limits_stay(
    tmp_path: Path, command: str, job_id: str
) -> None:
    conf = _conf(tmp_path)
    limits_file = tmp_path / "state" / LIMITS_FILE
    before = limits_file.read_bytes()
    extra = ["--cores", "1"] if command == "limit" else []
    done = _coda_node(conf, command, job_id, *extra)
    assert done.exit_code == 2, done.output
    assert "Invalid value for 'JOB_ID'" in done.output
    assert limits_file.read_bytes() == before
    # The next limit is recorded as ever.
    again = _coda_node(conf, "limit", str(JOB + 1), "--cores", "1")
    assert again.exit_code == 0, again.output
    assert set(load_limits(tmp_path / "state")) == {JOB, JOB + 1}


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        ("x" * 10_000_000, "at most 200 characters, not 10000000"),
        ("x" * 201, "at most 200 characters, not 201"),
        ("noisy\nETL", "one line of printable text"),
        ("noisy \x1b[2J ETL", "one line of printable text"),
        ("\u202enoisy", "one line of printable text"),
    ],
)
def test_a_reason_that_is_not_one_short_line_is_a_usage_error_and_the_limits_stay(
    tmp_path: Path, reason: str, said: str
) -> None:
    """The reason is copied into the view the daemon writes every tick and into each event
    of the job: a 10 MB one made a 30 MB view file, rewritten every interval."""
    conf = _conf(tmp_path)
    limits_file = tmp_path / "state" / LIMITS_FILE
    before = limits_file.read_bytes()
    done = _coda_node(conf, "limit", str(JOB + 1), "--cores", "1", "--reason", reason)
    assert done.exit_code == 2
    assert "Invalid value for '--reason'" in done.output and said in done.output
    assert len(done.output) < 500
    assert limits_file.read_bytes() == before


def test_a_reason_of_one_line_in_any_script_is_recorded(tmp_path: Path) -> None:
    reason = "Zoë's ETL — 节流 " + "x" * 180
    conf_dir = tmp_path
    conf = _conf(conf_dir)
    done = _coda_node(conf, "limit", str(JOB + 1), "--cores", "1", "--reason", reason)
    assert done.exit_code == 0, done.output
    assert load_limits(conf_dir / "state")[JOB + 1].reason == reason


@pytest.mark.parametrize("command", [["run", "--once"], ["check"], ["restore"], ["release", "7"]])
def test_a_node_root_that_is_a_file_is_named_in_a_one_line_error(
    tmp_path: Path, command: list[str]
) -> None:
    conf = _conf(tmp_path)
    (tmp_path / "root").write_text("not a directory\n")
    done = _coda_node(conf, command[0], *command[1:])
    assert done.exit_code == 1, done.output
    assert done.exception is None or isinstance(done.exception, SystemExit), done.exception
    assert f"NodeRoot={tmp_path / 'root'}" in done.output
