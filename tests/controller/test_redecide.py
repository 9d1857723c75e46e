"""The re-decision of a pending job an update changed (slurm_plugin.decision.redecide): which
updates call for one, and what it writes, by table."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest

from coda_common.config.codaconf import CodaConfig
from slurm_plugin.decision.decide import NO_VAL, ProfileView, parse_admin_record
from slurm_plugin.decision.redecide import (
    Kept,
    PendingJob,
    Redecision,
    UpdateFields,
    redecide,
    update_job_id,
    update_triggers,
)
from slurm_plugin.hook.journal import journal_entry, reconcile, summarize_decisions
from slurm_plugin.hook.modify import ModifyWorker

UID = 1000
PROFILES = {
    "workload:*:wide": ProfileView("workload:*:wide", "wide", 16, 0.95, 8, None),
}
RECORD = "coda:sig=workload:1000:wide;cpg=16;was=;action=set;src=global;gpn=1;nodes=1"
TOKEN = "00000000000000aa"


def cap_32_cpus(gpus_per_node: int) -> int | None:
    """A 32-CPU node with 4 GPUs: the most CPUs per GPU a job of that many GPUs gets."""
    return 32 // gpus_per_node if gpus_per_node <= 4 else None


def pending(**fields: Any) -> PendingJob:
    base: dict[str, Any] = {
        "job_id": 7,
        "uid": UID,
        "pending": True,
        "in_array": False,
        "name": "train",
        "admin_comment": f"{RECORD};tok={TOKEN} coda: --cpus-per-gpu=16 for workload wide",
        "comment": "coda:workload=wide",
        "cpus_per_tres": "gres:gpu:16",
        "tres_per_node": "gres:gpu:4",
        "num_nodes": 1,
        "num_tasks": 1,
    }
    base.update(fields)
    return PendingJob(**base)


def cfg(**fields: Any) -> CodaConfig:
    return dataclasses.replace(CodaConfig(), **fields)


def run(job: PendingJob, config: CodaConfig | None = None) -> Redecision | Kept:
    return redecide(job, config or CodaConfig(), PROFILES, cap_32_cpus, token="00000000000000bb")


@pytest.mark.parametrize(
    ("update", "job_id"),
    [
        (UpdateFields("12", tres_per_node="gres:gpu:4"), 12),
        (UpdateFields("12", tres_per_job="gres/gpu:4"), 12),
        (UpdateFields("12", tres_per_task="gres:gpu:1"), 12),
        (UpdateFields("12", num_tasks=4), 12),
        (UpdateFields("12", min_nodes=2), 12),
        (UpdateFields("12", ntasks_per_node=2), 12),
        (UpdateFields("12", partition="gpu_b"), 12),
        (UpdateFields(None, job_id=12, tres_per_node="gres:gpu:4"), 12),
        # Cores in the update itself win.
        (UpdateFields("12", tres_per_node="gres:gpu:4", cpus_per_tres="gres:gpu:2"), None),
        (UpdateFields("12", tres_per_node="gres:gpu:4", cpus_per_task=4), None),
        (UpdateFields("12", tres_per_node="gres:gpu:4", min_cpus=8), None),
        (UpdateFields("12", tres_per_node="gres:gpu:4", pn_min_cpus=8), None),
        # Nothing of the job's shape.
        (UpdateFields("12"), None),
        # Not one plain job.
        (UpdateFields("12_3", tres_per_node="gres:gpu:4"), None),
        (UpdateFields("12+1", tres_per_node="gres:gpu:4"), None),
        (UpdateFields("", tres_per_node="gres:gpu:4"), None),
        (UpdateFields(None, tres_per_node="gres:gpu:4"), None),
        (UpdateFields("99999999999", tres_per_node="gres:gpu:4"), None),
        (UpdateFields("١٢", tres_per_node="gres:gpu:4"), None),
    ],
)
def test_which_updates_trigger(update: UpdateFields, job_id: int | None) -> None:
    assert update_triggers(update) == job_id


def test_update_job_id_bounds() -> None:
    assert update_job_id(None, 0) is None
    assert update_job_id(None, NO_VAL) is None
    assert update_job_id(" 5 ", NO_VAL) == 5
    assert update_job_id("0", NO_VAL) is None


def test_four_gpus_get_what_the_node_gives() -> None:
    out = run(pending())
    assert isinstance(out, Redecision)
    assert out.cpus_per_tres == "gres:gpu:8"
    assert out.min_cpus is None  # Slurm derives it from the new cores
    rec = parse_admin_record(out.admin_comment)
    assert (rec["cpg"], rec["action"], rec["gpn"], rec["was"], rec["tok"]) == (
        "8",
        "set",
        "4",
        "",
        "00000000000000bb",
    )
    assert out.was_record == f"{RECORD};tok={TOKEN}"
    # The user's line follows the new record, and says why.
    assert out.admin_comment.endswith("(after an update of the job)")
    assert "--cpus-per-gpu=8" in out.admin_comment
    assert "cpg 16 -> 8" in out.log_msg


def test_other_text_in_the_admin_comment_stays() -> None:
    out = run(pending(admin_comment=f"site:abc {RECORD};tok={TOKEN} other:plugin"))
    assert isinstance(out, Redecision)
    assert out.admin_comment.startswith("site:abc coda:sig=")
    assert out.admin_comment.endswith(" other:plugin")


@pytest.mark.parametrize(
    ("job", "config", "reason"),
    [
        (pending(admin_comment=None), None, "no coda record"),
        (pending(admin_comment="site text"), None, "no coda record"),
        (pending(pending=False), None, "not pending"),
        (pending(in_array=True), None, "job array"),
        (pending(), cfg(mode="advise"), "Mode=advise"),
        # A user's own value stays the user's.
        (
            pending(admin_comment=RECORD.replace("was=", "was=cpg:6").replace("set", "keep")),
            None,
            "action=keep was=cpg:6",
        ),
        (pending(admin_comment=RECORD.replace("action=set", "action=advise")), None, "advise"),
        # Someone changed the cores since coda set them.
        (pending(cpus_per_tres="gres:gpu:2"), None, "changed since coda set it"),
        (pending(cpus_per_tres=None), None, "changed since coda set it"),
        # The same shape: nothing to write.
        (pending(tres_per_node="gres:gpu:1"), None, "unchanged"),
    ],
)
def test_kept(job: PendingJob, config: CodaConfig | None, reason: str) -> None:
    out = run(job, config)
    assert isinstance(out, Kept), out
    assert reason in out.reason


def test_same_cores_new_shape_updates_the_record() -> None:
    out = run(pending(tres_per_node="gres:gpu:2"))  # 16 x 2 fits the node
    assert isinstance(out, Redecision)
    assert out.cpus_per_tres == "gres:gpu:16"
    assert parse_admin_record(out.record)["gpn"] == "2"


def test_partition_coda_does_not_manage_gives_slurms_default() -> None:
    out = run(pending(partition="other"), cfg(exclude_partitions=("other",)))
    assert isinstance(out, Redecision)
    assert out.cpus_per_tres == ""  # cleared: DefCpuPerGPU applies, as without coda
    assert out.min_cpus == 1  # the task's own, not what coda's 16 per GPU made it
    rec = parse_admin_record(out.record)
    assert (rec["cpg"], rec["action"], rec["gpn"], rec["nodes"]) == ("", "skip", "4", "1")


def test_profile_gone_and_no_default_gives_slurms_default() -> None:
    out = redecide(pending(), CodaConfig(), {}, cap_32_cpus)
    assert isinstance(out, Redecision)
    assert out.cpus_per_tres == ""


def test_default_action_is_decided_again() -> None:
    record = RECORD.replace("action=set;src=global", "action=default;src=default")
    out = redecide(
        pending(admin_comment=record, comment=None),
        cfg(default_cpus_per_gpu=16),
        {},
        cap_32_cpus,
    )
    assert isinstance(out, Redecision)
    assert out.cpus_per_tres == "gres:gpu:8"
    assert parse_admin_record(out.record)["action"] == "default"


def test_placement_fields_of_the_submission_are_carried() -> None:
    out = run(pending(admin_comment=f"{RECORD};prefer=gpu_a100;tok={TOKEN}"))
    assert isinstance(out, Redecision)
    assert parse_admin_record(out.record)["prefer"] == "gpu_a100"


def test_journal_entry_of_a_redecision_and_its_reconcile() -> None:
    submit = journal_entry(1.0, NO_VAL, UID, "train", 0, 1, "set", RECORD, 1000, False, token=0xAA)
    new = f"{RECORD.replace('cpg=16', 'cpg=8').replace('gpn=1', 'gpn=4')}"
    again = journal_entry(
        2.0, 7, UID, "train", 0, 1, "set", new, 1000, False, None, 0xBB, "cpg 16 -> 8", TOKEN
    )
    assert (again["update"], again["was_tok"], again["cpg"], again["gpus"]) == (
        "cpg 16 -> 8",
        TOKEN,
        8,
        4,
    )
    assert "update" not in submit
    # The job holds only the new token: the submission counts as kept through it.
    out = reconcile(
        [submit, again],
        {"00000000000000bb"},
        queried_unix_s=100.0,
        min_job_age_s=300.0,
        settle_s=1.0,
    )
    assert (out.kept, out.refused) == (2, 0)
    summary = summarize_decisions(out.entries)
    assert (summary["decisions"], summary["updates"]) == (1, 1)


def test_worker_queues_each_job_once_and_is_bounded() -> None:
    started, gate = threading.Event(), threading.Event()
    seen: list[int] = []

    def work(job_id: int) -> None:
        started.set()
        gate.wait(5)
        seen.append(job_id)

    worker = ModifyWorker(work, lambda _level, _msg: None, max_queued=2)
    assert worker.notice(1)
    assert started.wait(5)  # the thread holds job 1; the queue is empty
    assert worker.notice(2) and worker.notice(2) and worker.notice(3)
    assert not worker.notice(4)  # full: dropped, counted
    assert worker.dropped == 1
    gate.set()
    deadline = time.monotonic() + 5
    while worker.done < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.stop(timeout_s=5)
    assert seen == [1, 2, 3]
    assert not worker.notice(6)  # stopped


def test_worker_survives_a_failing_job() -> None:
    done = threading.Event()
    logged: list[str] = []

    def work(job_id: int) -> None:
        if job_id == 1:
            raise RuntimeError("boom")
        done.set()

    worker = ModifyWorker(work, lambda _level, msg: logged.append(msg))
    worker.notice(1)
    worker.notice(2)
    assert done.wait(5)
    worker.stop()
    assert any("boom" in line for line in logged)
