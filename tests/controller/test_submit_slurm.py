"""job_submit/coda inside a real slurmctld: plain sbatch in, rewritten job out.

Every test here submits real jobs to the session's local Slurm (tests/conftest.py)
and reads slurmctld's own record with ``scontrol -o show job``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coda_common.signature import parse_coda_directives, workload_signature
from coda_common.store.profiles import Profile, ProfileStore, profile_stem
from slurm_plugin.decision.decide import parse_admin_record
from slurm_plugin.devtools.cluster import DevCluster, parse_scontrol_line
from tests.conftest import LogWatch, gres, require_slurm

pytestmark = pytest.mark.slurm

SCRIPT = "#!/bin/sh\nsleep 300\n"


def put_profile(
    cluster: DevCluster,
    signature: str,
    cpus_per_gpu: int,
    *,
    confidence: float = 0.95,
    n_samples: int = 8,
) -> Path:
    workload = signature.rsplit(":", 1)[-1]
    return ProfileStore(cluster.profile_store).write(
        Profile(
            signature=signature,
            workload=workload,
            cpus_per_gpu=cpus_per_gpu,
            confidence=confidence,
            n_samples=n_samples,
            updated_unix_s=time.time(),
            source="test",
        )
    )


def wait_for_reload(cluster: DevCluster, timeout_s: float = 10.0, min_profiles: int = 0) -> None:
    """Wait until the hook's reloader has ticked at least once after now (and, with
    ``min_profiles``, holds at least that many profiles)."""
    t0 = time.time()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            stats = json.loads(cluster.hook_stats_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            stats = {}
        # A tick that started after t0 wrote its stats after t0 + one interval.
        if stats.get("written_unix_s", 0) > t0 + 1.05 and stats.get("profiles", 0) >= min_profiles:
            return
        time.sleep(0.1)
    raise AssertionError("the hook's reloader did not tick")


def submit(
    cluster: DevCluster, args: list[str], script: str = SCRIPT, hold: bool = True
) -> tuple[int, dict[str, str], str]:
    job_id, said = cluster.sbatch((["--hold"] if hold else []) + args, script)
    return job_id, cluster.show_job(job_id), said


def cpus_per_tres(fields: dict[str, str]) -> str | None:
    return fields.get("CpusPerTres") or None


@pytest.fixture
def coda_conf(cluster: DevCluster) -> Iterator[Path]:
    """coda.conf of the live cluster; restored (and reloaded) after the test."""
    original = cluster.coda_conf.read_text()
    yield cluster.coda_conf
    if cluster.coda_conf.read_text() != original:
        cluster.coda_conf.write_text(original)
        wait_for_reload(cluster)


def set_conf(cluster: DevCluster, log: LogWatch, extra: str) -> None:
    text = cluster.coda_conf.read_text()
    cluster.coda_conf.write_text(text + extra + "\n")
    # Same second, same size is possible: make the change visible to a stat().
    os.utime(cluster.coda_conf, ns=(time.time_ns(), time.time_ns()))
    log.wait_for(r"job_submit/coda: reloaded ")


@pytest.fixture(autouse=True)
def _cancel_jobs(cluster: DevCluster) -> Iterator[None]:
    yield
    cluster.run(["scancel", "--user=root"], check=False)


def test_profiled_workload_runs_with_predicted_cores(cluster: DevCluster) -> None:
    put_profile(cluster, "workload:*:resnet50", 6)
    wait_for_reload(cluster)
    job_id, fields, said = submit(
        cluster, ["--gpus-per-node=2", "--comment=coda:workload=resnet50"], hold=False
    )
    assert cpus_per_tres(fields) == gres("gres:gpu:6")
    assert 'coda (if Slurm accepts the job): --cpus-per-gpu=6 for workload "resnet50"' in said
    record = parse_admin_record(fields["AdminComment"])
    assert record["action"] == "set" and record["cpg"] == "6"
    # The user notices the cores when the job runs: 2 GPUs x 6 cores.
    deadline = time.monotonic() + 20
    while cluster.show_job(job_id)["JobState"] != "RUNNING":
        assert time.monotonic() < deadline, cluster.show_job(job_id)
        time.sleep(0.2)
    assert cluster.show_job(job_id)["NumCPUs"] == "12"


def test_a_repeated_job_gets_what_the_first_got_and_is_counted(cluster: DevCluster) -> None:
    # The second and third submissions match the first byte for byte, so the hook answers
    # them from its decision memo: the user and the admin must not be able to tell.
    put_profile(cluster, "workload:*:bert", 5)
    wait_for_reload(cluster)
    before = json.loads(cluster.hook_stats_file.read_text())
    args = ["--gpus-per-node=1", "--comment=coda:workload=bert", "--job-name=repeat-me"]
    answers = [submit(cluster, args) for _ in range(3)]
    assert [cpus_per_tres(fields) for _, fields, _ in answers] == [gres("gres:gpu:5")] * 3
    # The same record but for each submission's own token (coda-slurm status matches it).
    records = [parse_admin_record(fields["AdminComment"]) for _, fields, _ in answers]
    tokens = {r.pop("tok") for r in records}
    assert len(tokens) == 3
    assert records[0] == records[1] == records[2]
    assert len({said for _, _, said in answers}) == 1
    assert '--cpus-per-gpu=5 for workload "bert"' in answers[0][2]
    wait_for_reload(cluster)
    after = json.loads(cluster.hook_stats_file.read_text())
    assert after["changed"] - before["changed"] == 3
    assert after["gpu_jobs"] - before["gpu_jobs"] == 3
    deadline = time.monotonic() + 10
    while True:  # the journal is flushed once a second
        lines = cluster.decision_journal.read_text().splitlines()
        mine = [e for e in map(json.loads, lines) if e.get("job") == "repeat-me"]
        if len(mine) == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [(e["action"], e["cpg"]) for e in mine] == [("set", 5)] * 3
    assert {e["tok"] for e in mine} == tokens  # C's records carry the tokens it wrote


def test_gres_and_gpus_forms_are_all_right_sized(cluster: DevCluster) -> None:
    put_profile(cluster, "workload:*:bert", 2)
    wait_for_reload(cluster)
    for opts in (
        ["--gres=gpu:a100:2"],
        ["--gpus=1"],
        ["--gpus-per-task=1", "--ntasks=2"],
        ["--gres=gpu:1"],
    ):
        _, fields, _ = submit(cluster, [*opts, "--comment=coda:workload=bert"])
        assert cpus_per_tres(fields) == gres("gres:gpu:2"), (opts, fields)


def test_signature_from_script_ignores_sbatch_lines(cluster: DevCluster) -> None:
    body = "python train.py --epochs 90\n"
    script_a = "#!/bin/bash\n#SBATCH --time=10\n" + body
    script_b = "#!/bin/bash\n#SBATCH --time=20\n#SBATCH --mem=1G\n" + body
    sig = workload_signature(0, "train-imagenet", script_a, parse_coda_directives(None))
    assert sig.key.startswith("script:0:")
    put_profile(cluster, sig.key, 5)
    wait_for_reload(cluster)
    _, fields_a, _ = submit(cluster, ["-J", "train-imagenet", "--gpus-per-node=1"], script_a)
    _, fields_b, _ = submit(cluster, ["-J", "train-imagenet", "--gpus-per-node=1"], script_b)
    _, fields_c, _ = submit(
        cluster, ["-J", "train-imagenet", "--gpus-per-node=1"], script_a + "echo another workload\n"
    )
    assert cpus_per_tres(fields_a) == gres("gres:gpu:5")
    assert cpus_per_tres(fields_b) == gres("gres:gpu:5")
    assert cpus_per_tres(fields_c) is None  # a different script is a different workload


def test_unprofiled_gpu_job_gets_slurm_default_and_is_recorded(cluster: DevCluster) -> None:
    job_id, fields, said = submit(cluster, ["--gpus-per-node=1", "-J", "never-seen"], hold=False)
    # Nothing from coda; once scheduled, slurmctld shows its own default ("gpu:4").
    assert cpus_per_tres(fields) in (None, "gpu:4")
    record = parse_admin_record(fields["AdminComment"])
    assert record["action"] == "skip" and record["sig"].startswith("script:0:")
    assert "coda" not in said
    deadline = time.monotonic() + 20
    while cluster.show_job(job_id)["JobState"] != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    # The partition's DefCpuPerGPU=4 still applies.
    assert cluster.show_job(job_id)["NumCPUs"] == "4"


def test_unprofiled_gpu_job_gets_configured_default(
    cluster: DevCluster, coda_conf: Path, ctld_log: LogWatch
) -> None:
    set_conf(cluster, ctld_log, "DefaultCpusPerGpu=3")
    _, fields, said = submit(cluster, ["--gpus-per-node=2", "-J", "new-model"])
    assert cpus_per_tres(fields) == gres("gres:gpu:3")
    assert parse_admin_record(fields["AdminComment"])["action"] == "default"
    assert "--cpus-per-gpu=3" in said


def test_first_run_asking_too_little_is_raised_to_the_nodes_share(
    cluster: DevCluster, coda_conf: Path, ctld_log: LogWatch
) -> None:
    # The node: 32 CPUs over 4 GPUs, so a GPU's share is 8 cores.
    set_conf(cluster, ctld_log, "DefaultCpusPerGpu=share\nUnprofiledUserValue=raise")
    job_id, raised, said = submit(
        cluster, ["--gpus-per-node=1", "--cpus-per-gpu=2", "-J", "first-run"], hold=False
    )
    assert cpus_per_tres(raised) == gres("gres:gpu:8")
    assert parse_admin_record(raised["AdminComment"])["action"] == "raise"
    assert "raises --cpus-per-gpu=2" in said
    deadline = time.monotonic() + 20
    while cluster.show_job(job_id)["JobState"] != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert cluster.show_job(job_id)["NumCPUs"] == "8"
    # A user who asked for more than the share keeps it; one who asked nothing gets it.
    _, more, _ = submit(cluster, ["--gpus-per-node=1", "--cpus-per-gpu=12", "-J", "greedy"])
    assert cpus_per_tres(more) == gres("gres:gpu:12")
    _, none, _ = submit(cluster, ["--gpus-per-node=2", "-J", "silent"])
    assert cpus_per_tres(none) == gres("gres:gpu:8")


def test_cpu_only_job_is_never_touched(
    cluster: DevCluster, coda_conf: Path, ctld_log: LogWatch
) -> None:
    set_conf(cluster, ctld_log, "DefaultCpusPerGpu=3")
    _, fields, said = submit(cluster, ["--ntasks=4", "--comment=coda:workload=resnet50"])
    assert cpus_per_tres(fields) is None
    assert fields.get("AdminComment", "") == ""
    assert fields["NumCPUs"] == "4"
    assert said.strip() == ""


def test_explicit_user_value_kept_then_replaced_after_live_conf_change(
    cluster: DevCluster, coda_conf: Path, ctld_log: LogWatch
) -> None:
    put_profile(cluster, "workload:*:vgg16", 6)
    wait_for_reload(cluster)
    args = ["--gpus-per-node=1", "--cpus-per-gpu=3", "--comment=coda:workload=vgg16"]
    _, kept, said = submit(cluster, args)
    assert cpus_per_tres(kept) == gres("gres:gpu:3")
    assert "kept your --cpus-per-gpu=3" in said
    # No slurmctld restart, no scontrol reconfigure: the hook rereads coda.conf.
    set_conf(cluster, ctld_log, "UserValue=replace")
    _, replaced, _ = submit(cluster, args)
    assert cpus_per_tres(replaced) == gres("gres:gpu:6")
    # --cpus-per-task is replaced too, per task: one task, one GPU x 6.
    _, from_cpt, said = submit(
        cluster, ["--gpus-per-node=1", "--cpus-per-task=9", "--comment=coda:workload=vgg16"]
    )
    assert cpus_per_tres(from_cpt) is None
    assert from_cpt["CPUs/Task"] == "6"
    assert "--cpus-per-task=6" in said and "replaces --cpus-per-task=9" in said


def _components(cluster: DevCluster, job_id: int) -> list[dict[str, str]]:
    """``scontrol -o show job`` of every component of a heterogeneous job, or every task
    of an array, in order."""
    out = cluster.run(["scontrol", "-o", "show", "job", str(job_id)]).stdout
    return [parse_scontrol_line(line.strip()) for line in out.splitlines() if line.strip()]


def test_each_component_of_a_het_job_and_an_array_is_decided_as_asked(
    cluster: DevCluster, coda_conf: Path, ctld_log: LogWatch
) -> None:
    put_profile(cluster, "workload:*:hetero", 6)
    set_conf(cluster, ctld_log, "UserValue=replace")
    wait_for_reload(cluster, min_profiles=1)
    comment = "--comment=coda:workload=hetero"
    # Component 0 per GPU, component 1 per task (2 GPUs x 6 over 3 tasks), component 2 none.
    components = (
        [comment, "--gpus-per-node=1", "--cpus-per-gpu=2"],
        [comment, "-n3", "-c1", "--gpus-per-node=2"],
        ["-n1"],
    )
    job_id, _ = cluster.sbatch(["--hold", *" : ".join(map(" ".join, components)).split()], SCRIPT)
    first, second, third = _components(cluster, job_id)
    assert cpus_per_tres(first) == gres("gres:gpu:6")
    assert (cpus_per_tres(second), second["CPUs/Task"]) == (None, "4")
    assert parse_admin_record(second["AdminComment"])["cpt"] == "4"
    assert third.get("AdminComment", "") == "" and third["CPUs/Task"] == "1"
    # An array is one submission: one decision for all its tasks.
    array_id, _ = cluster.sbatch(
        ["--hold", comment, "--array=0-2", "-c2", "--gpus-per-node=1"], SCRIPT
    )
    tasks = _components(cluster, array_id)
    assert tasks and all(t["CPUs/Task"] == "6" and cpus_per_tres(t) is None for t in tasks)


TASK_CPUS_SCRIPT = (
    "#!/bin/sh\n"
    'echo "batch=$SLURM_CPUS_PER_TASK"\n'
    "srun sh -c 'echo \"task=$SLURM_CPUS_PER_TASK\"'\n"
)


def _run_to_end(cluster: DevCluster, args: list[str], out: Path) -> tuple[dict[str, str], str]:
    """Run a job of TASK_CPUS_SCRIPT to its end: (its record while it ran, its output)."""
    job_id, _ = cluster.sbatch([*args, f"--output={out}"], TASK_CPUS_SCRIPT)
    seen: dict[str, str] = {}
    deadline = time.monotonic() + 60
    while True:
        fields = cluster.show_job(job_id)
        if fields.get("JobState") in ("RUNNING", "COMPLETING", "COMPLETED"):
            seen = seen or fields
        if fields.get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            break
        assert time.monotonic() < deadline, fields
        time.sleep(0.2)
    assert fields["JobState"] == "COMPLETED", fields
    return seen, out.read_text()


def _task_cpus(output: str) -> tuple[str, list[str]]:
    """(SLURM_CPUS_PER_TASK of the batch step, of each srun task), from the job's output."""
    batch = [line.split("=", 1)[1] for line in output.splitlines() if line.startswith("batch=")]
    tasks = [line.split("=", 1)[1] for line in output.splitlines() if line.startswith("task=")]
    assert len(batch) == 1 and len(tasks) == 2, output
    return batch[0], sorted(tasks)


def test_raise_keeps_what_every_task_sees_per_task(
    cluster: DevCluster, coda_conf: Path, ctld_log: LogWatch, tmp_path: Path
) -> None:
    """-n2 -c2 --gpus-per-node=1, raised to the node's share of 8 CPUs per GPU: each task
    gets 4 CPUs and sees 4 wherever it saw the 2 it asked for without coda."""
    set_conf(cluster, ctld_log, "DefaultCpusPerGpu=share\nUnprofiledUserValue=raise")
    args = ["-n2", "-c2", "--gpus-per-node=1", "-J", "per-task"]
    plain, plain_out = _run_to_end(cluster, [*args, "--comment=coda:off"], tmp_path / "off.out")
    raised, raised_out = _run_to_end(cluster, args, tmp_path / "raised.out")
    assert (plain["NumCPUs"], plain["CPUs/Task"]) == ("4", "2")
    assert (raised["NumCPUs"], raised["CPUs/Task"]) == ("8", "4")
    record = parse_admin_record(raised["AdminComment"])
    assert (record["action"], record["cpt"], record["was"]) == ("raise", "4", "cpt:2")
    plain_batch, plain_tasks = _task_cpus(plain_out)
    raised_batch, raised_tasks = _task_cpus(raised_out)
    assert plain_batch == "2" and raised_batch == "4"
    # srun's tasks inherit -c as this Slurm does it, with coda's value in place of the user's.
    assert raised_tasks == ["4" if v == "2" else v for v in plain_tasks]


def test_lower_mode_only_lowers(cluster: DevCluster, coda_conf: Path, ctld_log: LogWatch) -> None:
    put_profile(cluster, "workload:*:inception", 6)
    set_conf(cluster, ctld_log, "UserValue=lower")
    _, lowered, _ = submit(
        cluster, ["--gpus-per-node=1", "--cpus-per-gpu=10", "--comment=coda:workload=inception"]
    )
    _, kept, _ = submit(
        cluster, ["--gpus-per-node=1", "--cpus-per-gpu=4", "--comment=coda:workload=inception"]
    )
    assert cpus_per_tres(lowered) == gres("gres:gpu:6")
    assert cpus_per_tres(kept) == gres("gres:gpu:4")


def test_prediction_is_capped_by_the_node(cluster: DevCluster) -> None:
    # 32 CPUs and 4 GPUs: a 4-GPU job can get at most 8 cores per GPU.
    put_profile(cluster, "workload:*:lenet", 20)
    wait_for_reload(cluster)
    _, fields, _ = submit(cluster, ["--gpus-per-node=4", "--comment=coda:workload=lenet"])
    assert cpus_per_tres(fields) == gres("gres:gpu:8")


def test_invalid_directive_is_rejected_with_a_clear_message(cluster: DevCluster) -> None:
    proc = cluster.run(
        ["sbatch", "--hold", "--gpus=1", "--comment=coda:workload=bad!name", "--wrap=true"],
        check=False,
    )
    assert proc.returncode != 0
    assert 'invalid workload name "bad!name"' in proc.stderr


@pytest.mark.parametrize(
    "comment",
    [
        "x" * 10_000,
        "coda:workload=resnet50 " + "y" * 9_000,
        "caf\xe9 \u2603 \U0001f600",
    ],
)
def test_hostile_comments_pass(cluster: DevCluster, comment: str) -> None:
    proc = cluster.run(
        ["sbatch", "--hold", "--parsable", "--gpus=1", f"--comment={comment}", "--wrap=true"],
        check=False,
    )
    # slurmctld itself refuses comments over its length limit; that refusal must be
    # Slurm's own, and the controller must live on.
    if proc.returncode != 0:
        assert "too long" in proc.stderr, proc.stderr
        assert len(comment.encode()) > 1024
    assert cluster.run(["scontrol", "ping"]).returncode == 0


def test_non_utf8_comment_passes(cluster: DevCluster, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_bytes(b'#!/bin/sh\n#SBATCH --comment="\xff\xfe bad bytes coda:workload=x"\ntrue\n')
    proc = cluster.run(["sbatch", "--hold", "--parsable", "--gpus=1", str(script)], check=False)
    assert proc.returncode == 0, proc.stderr
    assert cluster.run(["scontrol", "ping"]).returncode == 0


def test_broken_profiles_leave_jobs_as_submitted(cluster: DevCluster, ctld_log: LogWatch) -> None:
    store = cluster.profile_store
    cases = {
        "corrupt": b"{not json",
        "truncated": b'{"format": "coda-profile", "format_version": 1, "signa',
        "future": json.dumps({"format": "coda-profile", "format_version": 99}).encode(),
    }
    for name, data in cases.items():
        path = store / f"{profile_stem(f'workload:*:{name}')}.json"
        path.write_bytes(data)
        path.chmod(0o644)
    planted = put_profile(cluster, "workload:*:planted", 6)
    os.chown(planted, 12345, 12345)  # a user-owned file must never be trusted
    wait_for_reload(cluster)
    for name in [*cases, "planted"]:
        _, fields, _ = submit(cluster, ["--gpus-per-node=1", f"--comment=coda:workload={name}"])
        assert cpus_per_tres(fields) is None, name
    text = ctld_log.text()
    assert "planted" in text or "12345" in text
    assert text.count("future") >= 1 or "format_version" in text


def test_corrupted_profile_keeps_serving_last_good_copy(
    cluster: DevCluster, ctld_log: LogWatch
) -> None:
    path = put_profile(cluster, "workload:*:yolo", 7)
    wait_for_reload(cluster)
    path.write_bytes(b"garbage")
    wait_for_reload(cluster)
    _, fields, _ = submit(cluster, ["--gpus-per-node=1", "--comment=coda:workload=yolo"])
    assert cpus_per_tres(fields) == gres("gres:gpu:7")
    ctld_log.wait_for(r"error: job_submit/coda: .*" + path.name)


def test_unusable_store_leaves_every_job_as_submitted(
    cluster: DevCluster, coda_conf: Path, ctld_log: LogWatch, tmp_path: Path
) -> None:
    not_a_dir = tmp_path / "store-is-a-file"
    not_a_dir.write_text("")
    set_conf(cluster, ctld_log, f"ProfileStore={not_a_dir}")
    _, fields, _ = submit(
        cluster, ["--gpus-per-node=1", "--cpus-per-gpu=2", "--comment=coda:workload=nothing-here"]
    )
    assert cpus_per_tres(fields) == gres("gres:gpu:2")


def test_over_budget_fails_open_with_one_log_line(
    cluster: DevCluster, coda_conf: Path, ctld_log: LogWatch
) -> None:
    put_profile(cluster, "workload:*:budget", 6)
    set_conf(cluster, ctld_log, "HookBudgetMs=0.000001")
    _, fields, said = submit(cluster, ["--gpus-per-node=1", "--comment=coda:workload=budget"])
    assert cpus_per_tres(fields) is None
    assert "coda" not in said
    line = ctld_log.wait_for(r"job_submit/coda: .*HookBudgetMs.*job passes unchanged")
    assert line


def test_invalid_conf_edit_keeps_last_good_configuration(
    cluster: DevCluster, coda_conf: Path, ctld_log: LogWatch
) -> None:
    put_profile(cluster, "workload:*:keepconf", 5)
    wait_for_reload(cluster)
    cluster.coda_conf.write_text(cluster.coda_conf.read_text() + "UserValue=sometimes\n")
    ctld_log.wait_for(r"invalid .*keeping the last good configuration")
    _, fields, _ = submit(cluster, ["--gpus-per-node=1", "--comment=coda:workload=keepconf"])
    assert cpus_per_tres(fields) == gres("gres:gpu:5")


def test_predict_agrees_with_the_real_hook(cluster: DevCluster, tmp_path: Path) -> None:
    put_profile(cluster, "workload:*:agree", 4)
    wait_for_reload(cluster)
    script = tmp_path / "agree.sh"
    script.write_text("#!/bin/sh\n#SBATCH --gpus-per-node=2\ntrue\n")
    args = ["--comment=coda:workload=agree"]
    out = cluster.run(
        [str(Path(sys.executable).with_name("coda-slurm")), "predict", "--json", *args, str(script)]
    ).stdout
    predicted = json.loads(out)
    _, fields, _ = submit(cluster, args, script.read_text())
    assert predicted["cpus_per_tres_after"] == cpus_per_tres(fields) == gres("gres:gpu:4")


# -- slurmctld with a broken Python: the plugin goes inactive, scheduling goes on --


@pytest.mark.parametrize(
    "ctld_env,expect",
    [
        ({"PYTHONHOME": "/nonexistent"}, r"cannot start Python"),
        ({"CODA_CONF": "/nonexistent/coda.conf"}, r"cannot load /nonexistent/coda.conf"),
    ],
)
def test_plugin_that_cannot_start_leaves_slurm_scheduling(
    tmp_path: Path, ctld_env: dict[str, str], expect: str
) -> None:
    require_slurm()
    c = DevCluster(tmp_path / "broken", ctld_env=ctld_env)
    try:
        c.up()
        job_id, _said = c.sbatch(
            ["--hold", "--gpus-per-node=1", "--cpus-per-gpu=2", "--comment=coda:workload=x"], SCRIPT
        )
        fields = c.show_job(job_id)
        log = c.ctld_log.read_text(errors="replace")
        assert "job_submit/coda: INACTIVE" in log
        assert re.search(expect, log), log[-2000:]
        assert cpus_per_tres(fields) == gres("gres:gpu:2")
        assert fields.get("AdminComment", "") == ""
    finally:
        c.down()


def test_interactive_stderr_stays_the_programs_unless_the_site_says_all(
    cluster: DevCluster, coda_conf: Path, ctld_log: LogWatch
) -> None:
    """``srun`` prints nothing of coda's on stderr by default (scripts read it, and Slurm's
    own tests expect it empty with ``--error=none``) while ``sbatch`` still shows the line;
    with ``UserMessage=all`` srun shows it too. Either way the job runs with coda's cores
    and its admin comment says so."""
    put_profile(cluster, "workload:*:interactive", 3)
    wait_for_reload(cluster)
    args = ["--gpus=1", "--comment=coda:workload=interactive"]

    def srun() -> tuple[str, dict[str, str]]:
        proc = cluster.run(["srun", *args, "sh", "-c", "echo $SLURM_JOB_ID"], timeout_s=60)
        job_id = int(proc.stdout.split()[-1])
        return proc.stderr, parse_admin_record(cluster.show_job(job_id)["AdminComment"])

    for _ in range(2):  # decided in Python, then answered by the C side
        stderr, record = srun()
        assert stderr == "", stderr
        assert record["action"] == "set" and record["cpg"] == "3"
    _, _, said = submit(cluster, args)
    assert "coda (if Slurm accepts the job): --cpus-per-gpu=3" in said, said

    set_conf(cluster, ctld_log, "UserMessage=all")
    for _ in range(2):
        stderr, record = srun()
        assert "srun: coda (if Slurm accepts the job): --cpus-per-gpu=3" in stderr, stderr
        assert record["cpg"] == "3"


def test_a_never_seen_script_naming_a_model_gets_the_models_prior(
    cluster: DevCluster, tmp_path: Path
) -> None:
    """A starter-table profile (confidence far below MinConfidence) is never taken as the
    workload's profile, but a script that names its model gets its cores per GPU."""
    path = put_profile(cluster, "workload:*:priornet", 11, confidence=0.1, n_samples=0)
    try:
        wait_for_reload(cluster)
        script = "#!/bin/sh\nsrun python train.py --arch PriorNet_v2\nsleep 300\n"
        local = tmp_path / "train.sh"
        local.write_text(script)
        coda_slurm = str(Path(sys.executable).with_name("coda-slurm"))
        predicted = json.loads(
            cluster.run([coda_slurm, "predict", "--json", "--gpus-per-node=1", str(local)]).stdout
        )
        _, fields, said = submit(cluster, ["--gpus-per-node=1"], script)
        assert cpus_per_tres(fields) == gres("gres:gpu:11")
        assert predicted["cpus_per_tres_after"] == fields["CpusPerTres"]
        assert predicted["src"] == "prior:priornet"
        record = parse_admin_record(fields["AdminComment"])
        assert (record["action"], record["src"]) == ("default", "prior:priornet")
        assert record["cpg"] == "11"
        assert record["sig"].startswith("script:")  # the job keeps its own identity
        assert 'the job names "priornet"' in said
        # Without the name, the same kind of job is left to Slurm's DefCpuPerGPU.
        _, plain, _ = submit(cluster, ["--gpus-per-node=1"], "#!/bin/sh\nsleep 300\n")
        assert cpus_per_tres(plain) is None
    finally:
        path.unlink()
        wait_for_reload(cluster)
