"""The submit-time decision (slurm_plugin.decision.decide.decide)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from coda_common.config.codaconf import CodaConfig
from coda_common.signature import Directives, workload_signature
from slurm_plugin.decision.decide import (
    ACTIONS,
    NO_VAL,
    NO_VAL16,
    Decision,
    JobRequest,
    ProfileView,
    decide,
    parse_admin_record,
    predict_cpus_per_gpu,
)
from slurm_plugin.decision.tres import gpu_count

UID = 1000
SCRIPT = "#!/bin/bash\n#SBATCH --gpus-per-node=2\npython train.py\n"
SCRIPT_KEY = workload_signature(UID, "train", SCRIPT, Directives()).key


def _profile(key: str, cpg: int, conf: float = 0.93, n: int = 12, mn: int | None = None):
    return ProfileView(key, key.rsplit(":", 1)[-1], cpg, conf, n, mn)


PROFILES: dict[str, ProfileView] = {
    p.signature: p
    for p in (
        _profile("workload:1000:resnet50", 6),
        _profile("workload:1000:weak", 5, conf=0.5, n=2),
        _profile("workload:1000:mn", 8, mn=5),
        _profile("workload:1000:big", 200),
        _profile("workload:1000:one", 1),
        _profile("workload:*:bert", 10, conf=0.95, n=40),
        _profile("workload:1000:bert", 3, conf=0.4, n=1),  # weak own profile
        _profile("workload:*:shared-weak", 7, conf=0.1, n=1),
        _profile(SCRIPT_KEY, 5),
    )
}


def no_cap(gpus_per_node: int) -> int | None:
    return None


def cap16(gpus_per_node: int) -> int | None:
    return 16


def cap0(gpus_per_node: int) -> int | None:
    return 0


def job(**fields: Any) -> JobRequest:
    base: dict[str, Any] = {
        "uid": UID,
        "job_name": "train",
        "tres_per_node": "gres:gpu:2",
        "comment": "coda:workload=resnet50",
        "script": SCRIPT,
    }
    base.update(fields)
    return JobRequest(**base)


def cfg(**fields: Any) -> CodaConfig:
    return dataclasses.replace(CodaConfig(), **fields)


def run(req: JobRequest, config: CodaConfig | None = None, cap=no_cap) -> Decision:
    return decide(req, config or CodaConfig(), PROFILES, cap)


# ------------------------------------------------------------ the full decision table

Case = tuple[str, JobRequest, CodaConfig, Callable[[int], int | None], str, str | None, int | None]

CASES: list[Case] = [
    # id, request, config, node cap, action, cpus_per_tres written, cpus_per_task written
    # -- jobs CODA never touches
    ("cpu-only", job(tres_per_node=None), cfg(), no_cap, "skip", None, None),
    ("cpu-only-shard", job(tres_per_node="gres:shard:2"), cfg(), no_cap, "skip", None, None),
    ("zero-gpus", job(tres_per_node="gres:gpu:0"), cfg(), no_cap, "skip", None, None),
    ("gpu-license-only", job(tres_per_node="license:gpu:1"), cfg(), no_cap, "skip", None, None),
    ("mode-off", job(), cfg(mode="off"), no_cap, "skip", None, None),
    ("coda-off", job(comment="coda:off"), cfg(), no_cap, "skip", None, None),
    (
        "coda-off-with-workload",
        job(comment="coda:workload=resnet50 coda:off"),
        cfg(),
        no_cap,
        "skip",
        None,
        None,
    ),
    ("bad-tres", job(tres_per_node="gres:gpu:-2"), cfg(), no_cap, "skip", None, None),
    ("bad-tres-job", job(tres_per_job="gres:gpu:9999999"), cfg(), no_cap, "skip", None, None),
    ("bad-cpus-per-tres", job(cpus_per_tres="gres::4"), cfg(), no_cap, "skip", None, None),
    ("bad-directive", job(comment="coda:workload="), cfg(), no_cap, "reject", None, None),
    ("unknown-directive", job(comment="coda:fast"), cfg(), no_cap, "reject", None, None),
    (
        "bad-directive-cpu-job",
        job(tres_per_node=None, comment="coda:bogus"),
        cfg(),
        no_cap,
        "skip",
        None,
        None,
    ),
    (
        "bad-directive-advise",
        job(comment="coda:bogus"),
        cfg(mode="advise"),
        no_cap,
        "skip",
        None,
        None,
    ),
    # -- partition filters
    ("part-in", job(partition="gpu"), cfg(partitions=("gpu",)), no_cap, "set", "gres:gpu:6", None),
    ("part-out", job(partition="cpu"), cfg(partitions=("gpu",)), no_cap, "skip", None, None),
    ("part-mixed", job(partition="gpu,cpu"), cfg(partitions=("gpu",)), no_cap, "skip", None, None),
    ("part-none", job(partition=None), cfg(partitions=("gpu",)), no_cap, "skip", None, None),
    (
        "part-excluded",
        job(partition="debug"),
        cfg(exclude_partitions=("debug",)),
        no_cap,
        "skip",
        None,
        None,
    ),
    (
        "part-excluded-wins",
        job(partition="gpu,debug"),
        cfg(partitions=("gpu", "debug"), exclude_partitions=("debug",)),
        no_cap,
        "skip",
        None,
        None,
    ),
    (
        "part-none-exclude-only",
        job(partition=None),
        cfg(exclude_partitions=("debug",)),
        no_cap,
        "set",
        "gres:gpu:6",
        None,
    ),
    # -- no user value: the profile decides
    ("set", job(), cfg(), no_cap, "set", "gres:gpu:6", None),
    ("set-typed", job(tres_per_node="gres:gpu:a100:2"), cfg(), no_cap, "set", "gres:gpu:6", None),
    (
        "set-keeps-other-cpus-per-tres",
        job(cpus_per_tres="gres:shard:1"),
        cfg(),
        no_cap,
        "set",
        "gres:shard:1,gres:gpu:6",
        None,
    ),
    ("set-from-script", job(comment=None), cfg(), no_cap, "set", "gres:gpu:5", None),
    (
        "set-global",
        job(uid=2000, comment="coda:workload=bert"),
        cfg(),
        no_cap,
        "set",
        "gres:gpu:10",
        None,
    ),
    (
        "weak-own-confident-global",
        job(comment="coda:workload=bert"),
        cfg(),
        no_cap,
        "set",
        "gres:gpu:10",
        None,
    ),
    ("other-user-no-profile", job(uid=2000), cfg(), no_cap, "skip", None, None),
    ("unknown", job(comment="coda:workload=new"), cfg(), no_cap, "skip", None, None),
    ("weak", job(comment="coda:workload=weak"), cfg(), no_cap, "skip", None, None),
    (
        "weak-but-threshold-lowered",
        job(comment="coda:workload=weak"),
        cfg(min_confidence=0.5),
        no_cap,
        "set",
        "gres:gpu:5",
        None,
    ),
    (
        # A weak shared profile is not used as the workload's profile, but its name is in
        # the job's text: a prior (PriorsFromNames=yes, the default).
        "shared-weak-prior",
        job(comment="coda:workload=shared-weak"),
        cfg(),
        no_cap,
        "default",
        "gres:gpu:7",
        None,
    ),
    (
        "shared-weak",
        job(comment="coda:workload=shared-weak"),
        cfg(priors_from_names=False),
        no_cap,
        "skip",
        None,
        None,
    ),
    (
        "unknown-default",
        job(comment="coda:workload=new"),
        cfg(default_cpus_per_gpu=4),
        no_cap,
        "default",
        "gres:gpu:4",
        None,
    ),
    (
        "weak-default",
        job(comment="coda:workload=weak"),
        cfg(default_cpus_per_gpu=4),
        no_cap,
        "default",
        "gres:gpu:4",
        None,
    ),
    (
        "default-node-capped",
        job(comment="coda:workload=new"),
        cfg(default_cpus_per_gpu=32),
        cap16,
        "default",
        "gres:gpu:16",
        None,
    ),
    # -- clamping
    ("clamp-max", job(comment="coda:workload=big"), cfg(), no_cap, "set", "gres:gpu:64", None),
    (
        "clamp-min",
        job(comment="coda:workload=one"),
        cfg(min_cpus_per_gpu=2),
        no_cap,
        "set",
        "gres:gpu:2",
        None,
    ),
    ("clamp-node", job(comment="coda:workload=big"), cfg(), cap16, "set", "gres:gpu:16", None),
    (
        "node-cap-beats-min",
        job(),
        cfg(min_cpus_per_gpu=32, max_cpus_per_gpu=64),
        cap16,
        "set",
        "gres:gpu:16",
        None,
    ),
    ("node-cap-zero-floors-at-1", job(), cfg(), cap0, "set", "gres:gpu:1", None),
    # -- GPUs per node and the multi-node rule (profile 6/GPU, cap 2)
    (
        "multi-node-per-node",
        job(tres_per_node="gres:gpu:4", min_nodes=2),
        cfg(),
        no_cap,
        "set",
        "gres:gpu:3",  # ceil(6 * 2 / 4)
        None,
    ),
    (
        "multi-node-two-gpus",
        job(tres_per_node="gres:gpu:2", min_nodes=4),
        cfg(),
        no_cap,
        "set",
        "gres:gpu:6",  # min(2, cap) / 2 = 1
        None,
    ),
    (
        "multi-node-cap-4",
        job(tres_per_node="gres:gpu:8", min_nodes=2),
        cfg(multi_node_gpu_cap=4),
        no_cap,
        "set",
        "gres:gpu:3",  # ceil(6 * 4 / 8)
        None,
    ),
    (
        "multi-node-measured",
        job(tres_per_node="gres:gpu:4", min_nodes=2, comment="coda:workload=mn"),
        cfg(),
        no_cap,
        "set",
        "gres:gpu:5",
        None,
    ),
    (
        "single-node-ignores-measured",
        job(tres_per_node="gres:gpu:4", min_nodes=1, comment="coda:workload=mn"),
        cfg(),
        no_cap,
        "set",
        "gres:gpu:8",
        None,
    ),
    (
        "per-job-over-nodes",
        job(tres_per_node=None, tres_per_job="gres:gpu:8", min_nodes=2),
        cfg(),
        no_cap,
        "set",
        "gres:gpu:3",  # 4 GPUs per node on 2 nodes
        None,
    ),
    (
        "per-job-one-node",
        job(tres_per_node=None, tres_per_job="gres:gpu:1"),
        cfg(),
        no_cap,
        "set",
        "gres:gpu:6",
        None,
    ),
    (
        "per-task",
        job(tres_per_node=None, tres_per_task="gres:gpu:1", ntasks_per_node=4, min_nodes=2),
        cfg(),
        no_cap,
        "set",
        "gres:gpu:3",
        None,
    ),
    (
        "per-task-num-tasks",  # 8 tasks on 2 nodes: 4 tasks, 4 GPUs per node
        job(tres_per_node=None, tres_per_task="gres:gpu:1", num_tasks=8, min_nodes=2),
        cfg(),
        no_cap,
        "set",
        "gres:gpu:3",
        None,
    ),
    (
        "per-socket",  # the GPU count follows the sockets Slurm picks
        job(tres_per_node=None, tres_per_socket="gres:gpu:1"),
        cfg(),
        no_cap,
        "skip",
        None,
        None,
    ),
    (
        "mig",
        job(tres_per_node="gres:gpu:1g.10gb:3,gres:shard:2"),
        cfg(),
        no_cap,
        "set",
        "gres:gpu:6",
        None,
    ),
    # -- the user gave a value
    ("keep-cpg", job(cpus_per_tres="gres:gpu:12"), cfg(), no_cap, "keep", None, None),
    ("keep-cpt", job(cpus_per_task=8), cfg(), no_cap, "keep", None, None),
    (
        "lower-cpg",
        job(cpus_per_tres="gres:gpu:12"),
        cfg(user_value="lower"),
        no_cap,
        "lower",
        "gres:gpu:6",
        None,
    ),
    (
        "lower-not-needed",
        job(cpus_per_tres="gres:gpu:4"),
        cfg(user_value="lower"),
        no_cap,
        "keep",
        None,
        None,
    ),
    (
        "lower-equal-keeps",
        job(cpus_per_tres="gres:gpu:6"),
        cfg(user_value="lower"),
        no_cap,
        "keep",
        None,
        None,
    ),
    (
        "lower-cpt",  # 16 CPUs per task, 1 task, 2 GPUs: 8 per GPU > 6
        job(cpus_per_task=16),
        cfg(user_value="lower"),
        no_cap,
        "lower",
        None,
        12,
    ),
    (
        "lower-cpt-not-needed",  # 8 per task, 1 task, 2 GPUs: 4 per GPU < 6
        job(cpus_per_task=8),
        cfg(user_value="lower"),
        no_cap,
        "keep",
        None,
        None,
    ),
    (
        "lower-cpt-many-tasks",  # 6 per GPU x 2 GPUs over 4 tasks: 3 per task < 4
        job(cpus_per_task=4, ntasks_per_node=4),
        cfg(user_value="lower"),
        no_cap,
        "lower",
        None,
        3,
    ),
    (
        "lower-cpt-num-tasks",  # 1 per GPU x 2 GPUs over ceil(6 tasks / 2 nodes): 1 < 4
        job(cpus_per_task=4, num_tasks=6, min_nodes=2, comment="coda:workload=one"),
        cfg(user_value="lower"),
        no_cap,
        "lower",
        None,
        1,
    ),
    (
        "replace-cpg",
        job(cpus_per_tres="gres:gpu:2"),
        cfg(user_value="replace"),
        no_cap,
        "replace",
        "gres:gpu:6",
        None,
    ),
    (
        "replace-cpt",  # 6 per GPU x 2 GPUs, one task
        job(cpus_per_task=2),
        cfg(user_value="replace"),
        no_cap,
        "replace",
        None,
        12,
    ),
    (
        "replace-unknown-keeps",
        job(cpus_per_tres="gres:gpu:2", comment="coda:workload=new"),
        cfg(user_value="replace", default_cpus_per_gpu=4),
        no_cap,
        "keep",
        None,
        None,
    ),
    # -- advise mode writes nothing
    ("advise-set", job(), cfg(mode="advise"), no_cap, "advise", None, None),
    (
        "advise-replace",
        job(cpus_per_task=2),
        cfg(mode="advise", user_value="replace"),
        no_cap,
        "advise",
        None,
        None,
    ),
    (
        "advise-default",
        job(comment="coda:workload=new"),
        cfg(mode="advise", default_cpus_per_gpu=4),
        no_cap,
        "advise",
        None,
        None,
    ),
    (
        "advise-keep",
        job(cpus_per_tres="gres:gpu:12"),
        cfg(mode="advise"),
        no_cap,
        "keep",
        None,
        None,
    ),
    ("advise-cpu-only", job(tres_per_node=None), cfg(mode="advise"), no_cap, "skip", None, None),
]


@pytest.mark.parametrize(
    ("req", "config", "cap", "action", "cpus_per_tres", "cpus_per_task"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_decision_table(
    req: JobRequest,
    config: CodaConfig,
    cap: Callable[[int], int | None],
    action: str,
    cpus_per_tres: str | None,
    cpus_per_task: int | None,
) -> None:
    d = decide(req, config, PROFILES, cap)
    assert (d.action, d.cpus_per_tres, d.cpus_per_task) == (action, cpus_per_tres, cpus_per_task)
    assert d.action in ACTIONS
    # One-line messages only.
    assert "\n" not in d.log_msg and d.log_msg.startswith("coda: ")
    assert d.user_msg is None or ("\n" not in d.user_msg and d.user_msg.startswith("coda: "))
    assert (d.reason and d.reason in d.log_msg) or d.action == "reject"
    if d.admin_comment is not None:
        record = parse_admin_record(d.admin_comment)
        assert len(d.admin_comment) < 200
        assert record["action"] == d.action
        if d.cpus_per_tres is not None:
            assert d.cpus_per_tres.endswith(f"gres:gpu:{record['cpg']}") or (
                f"gres:gpu:{record['cpg']}," in d.cpus_per_tres
            )
    if d.action in {"set", "default", "lower", "replace"}:
        written = d.cpus_per_tres is not None or d.cpus_per_task is not None
        assert written and d.user_msg is not None
    else:
        assert d.cpus_per_tres is None and d.cpus_per_task is None
    if d.cpus_per_task is not None and d.cpus_per_tres is not None:
        # -c that sbatch derived from --cpus-per-gpu x --gpus-per-task follows it.
        assert "cpt" not in record
        assert d.cpus_per_task == int(record["cpg"]) * gpu_count(req.tres_per_task)
    elif d.cpus_per_task is not None:
        # A per-task request stays per task: never both fields, and raise never lowers.
        assert req.cpus_per_task != NO_VAL16
        assert record.get("cpt") == str(d.cpus_per_task)
        if d.action == "raise":
            assert d.cpus_per_task > req.cpus_per_task
        if d.action == "lower":
            assert d.cpus_per_task < req.cpus_per_task


# ------------------------------------------------------------------- specific outputs


def test_set_messages_and_record() -> None:
    d = run(job(tres_per_node="gres:gpu:2"))
    assert d.user_msg == (
        'coda: --cpus-per-gpu=6 for workload "resnet50" (profile, 12 samples, confidence 0.93)'
    )
    assert d.admin_comment == (
        "coda:sig=workload:1000:resnet50;cpg=6;was=;action=set;src=profile;gpn=2;nodes=1"
    )
    assert "sig=workload:1000:resnet50" in d.log_msg
    assert 'job "train" uid=1000' in d.log_msg


@pytest.mark.parametrize(
    ("req", "config", "record"),
    [
        (job(tres_per_node=None), cfg(), None),  # CPU-only: no record
        (job(comment="coda:off"), cfg(), None),
        (job(), cfg(mode="off"), None),
        (job(partition="cpu"), cfg(partitions=("gpu",)), None),
        (job(tres_per_node="gres:gpu:x:y:z"), cfg(), None),
        (job(comment="coda:nope"), cfg(), None),  # reject
        (
            job(comment="coda:workload=new"),
            cfg(),
            {"sig": "workload:1000:new", "cpg": "", "was": "", "action": "skip", "src": "none"},
        ),
        (
            job(comment="coda:workload=new", cpus_per_task=4),
            cfg(default_cpus_per_gpu=3),
            {"cpg": "3", "was": "cpt:4", "action": "keep", "src": "default"},
        ),
        (
            job(uid=7, comment="coda:workload=bert", tres_per_node="gres:gpu:4", min_nodes=3),
            cfg(),
            {"sig": "workload:7:bert", "cpg": "5", "src": "global", "gpn": "4", "nodes": "3"},
        ),
        (
            job(cpus_per_tres="gres:gpu:12"),
            cfg(),
            {"cpg": "6", "was": "cpg:12", "action": "keep", "src": "profile"},
        ),
        (
            job(cpus_per_task=2),
            cfg(mode="advise", user_value="replace"),
            {"cpg": "6", "was": "cpt:2", "action": "advise", "would": "replace"},
        ),
        (
            job(tres_per_node=None, tres_per_task="gres:gpu:2", num_tasks=3),
            cfg(),
            {"gpn": "6", "nodes": "1"},
        ),
    ],
)
def test_admin_record(req: JobRequest, config: CodaConfig, record: dict[str, str] | None) -> None:
    d = run(req, config)
    if record is None:
        assert d.admin_comment is None
        return
    assert d.admin_comment is not None
    parsed = parse_admin_record(d.admin_comment)
    assert {k: parsed[k] for k in record} == record
    if d.action != "advise":
        assert "would" not in parsed


def test_record_stays_short_for_longest_names() -> None:
    name = "w" * 64
    profiles = {f"workload:4294967294:{name}": _profile(f"workload:4294967294:{name}", 65533)}
    req = job(
        uid=4294967294,
        comment=f"coda:workload={name}",
        cpus_per_task=65533,
        tres_per_node="gres:gpu:1000000",
        min_nodes=4294967293,
    )
    d = decide(
        req, cfg(mode="advise", user_value="replace", max_cpus_per_gpu=65533), profiles, no_cap
    )
    assert d.admin_comment is not None
    assert len(d.admin_comment) < 200
    assert parse_admin_record(d.admin_comment)["would"] == "replace"


def test_reject_message_is_the_directive_error() -> None:
    d = run(job(comment='coda:workload="a b"'))
    assert d.action == "reject"
    assert d.user_msg is not None
    assert d.user_msg.startswith('coda: invalid workload name "a b" in --comment')


def test_advise_mode_reports_bad_directive_but_accepts() -> None:
    d = run(job(comment="coda:bogus"), cfg(mode="advise"))
    assert d.action == "skip"
    assert d.user_msg is not None and "coda:bogus" in d.user_msg


def test_coda_off_tells_the_user() -> None:
    d = run(job(comment="nightly; coda:off"))
    assert d.user_msg is not None and "coda:off" in d.user_msg
    assert "coda:off" in d.reason


def test_malformed_tres_fails_open_with_reason() -> None:
    d = run(job(tres_per_node="gres:gpu:1,gres::2"))
    assert d.action == "skip"
    assert "malformed" in d.log_msg and "gres::2" in d.log_msg
    assert d.user_msg is None


def test_cpu_only_job_untouched_even_with_cpus_per_task() -> None:
    d = run(job(tres_per_node=None, cpus_per_task=8), cfg(user_value="replace"))
    assert (d.action, d.cpus_per_tres, d.cpus_per_task, d.admin_comment) == (
        "skip",
        None,
        None,
        None,
    )


def test_keep_tells_user_what_profile_suggests() -> None:
    d = run(job(cpus_per_tres="gres:gpu:12"))
    assert d.user_msg is not None
    assert "--cpus-per-gpu=12" in d.user_msg and "--cpus-per-gpu=6" in d.user_msg
    same = run(job(cpus_per_tres="gres:gpu:6"))
    assert same.action == "keep" and same.user_msg is None


def test_lower_and_replace_messages_name_the_user_flag() -> None:
    lowered = run(job(cpus_per_task=16), cfg(user_value="lower"))
    assert lowered.user_msg is not None and "--cpus-per-task=16" in lowered.user_msg
    replaced = run(job(cpus_per_tres="gres:gpu:2"), cfg(user_value="replace"))
    assert replaced.user_msg is not None and "--cpus-per-gpu=2" in replaced.user_msg


def test_advise_message_says_nothing_changed() -> None:
    d = run(job(), cfg(mode="advise"))
    assert d.user_msg is not None
    assert d.user_msg.startswith("coda: would set --cpus-per-gpu=6")
    assert "job unchanged" in d.user_msg


def test_shared_profile_named_in_message() -> None:
    d = run(job(uid=2000, comment="coda:workload=bert"))
    assert d.user_msg is not None and "shared profile, 40 samples" in d.user_msg


def test_weak_profile_reason_mentions_confidence() -> None:
    d = run(job(comment="coda:workload=weak"))
    assert "confidence 0.50" in d.reason


def test_clamp_is_explained() -> None:
    d = run(job(comment="coda:workload=big"))
    assert d.user_msg is not None and "MaxCpusPerGpu=64" in d.user_msg
    capped = run(job(comment="coda:workload=big"), cap=cap16)
    assert capped.user_msg is not None and "no node gives a job of" in capped.user_msg


def test_node_cap_is_asked_for_gpus_per_node() -> None:
    asked: list[int] = []

    def spy(gpus_per_node: int) -> int | None:
        asked.append(gpus_per_node)
        return None

    decide(job(tres_per_node=None, tres_per_job="gres:gpu:12", min_nodes=3), cfg(), PROFILES, spy)
    assert asked == [4]


def test_hostile_job_name_and_comment() -> None:
    name = "x\n\x00\udcff\"';" * 300
    comment = ("noise; " * 1500) + "coda:workload=resnet50"
    assert len(comment) > 10_000
    d = run(job(job_name=name, comment=comment))
    assert d.action == "set"
    assert d.log_msg.isprintable()
    assert len(d.log_msg) < 400


def test_unset_numbers_are_unset() -> None:
    explicit_unset = job(
        cpus_per_task=NO_VAL16, min_nodes=NO_VAL, max_nodes=NO_VAL, num_tasks=NO_VAL
    )
    assert run(explicit_unset) == run(job())
    assert run(job(min_nodes=0xFFFFFFFF)) == run(job())  # INFINITE


@pytest.mark.parametrize("cpus_per_task", [0, 0xFFFF])
def test_a_cpus_per_task_sbatch_never_sends_leaves_the_job_alone(cpus_per_task: int) -> None:
    # -c 65536 arrives as 0 (uint16), -c 65535 as INFINITE16: Slurm, not coda, says what
    # they mean, so nothing is written beside them.
    d = run(job(cpus_per_task=cpus_per_task))
    assert d.action == "skip"
    assert d.cpus_per_tres is None and d.cpus_per_task is None
    assert "not understood" in d.log_msg


def test_jobrequest_defaults_are_unset_markers() -> None:
    req = JobRequest(uid=1)
    assert (req.cpus_per_task, req.ntasks_per_node) == (NO_VAL16, NO_VAL16)
    assert (req.min_nodes, req.max_nodes, req.num_tasks) == (NO_VAL, NO_VAL, NO_VAL)
    assert req.tres_per_node is None and req.script is None


# ------------------------------------------------------------------ model rule, record


@pytest.mark.parametrize(
    ("cpg", "mn", "gpn", "nodes", "cap", "expected"),
    [
        (6, None, 4, 1, 2, 6),
        (6, None, 4, 2, 2, 3),
        (7, None, 4, 2, 2, 4),  # ceil(3.5)
        (6, None, 2, 2, 2, 6),
        (6, None, 1, 8, 2, 6),
        (6, None, 8, 2, 4, 3),
        (6, 5, 4, 2, 2, 5),
        (6, 5, 4, 1, 2, 6),
    ],
)
def test_predict_cpus_per_gpu(
    cpg: int, mn: int | None, gpn: int, nodes: int, cap: int, expected: int
) -> None:
    profile = ProfileView("k", "w", cpg, 1.0, 1, mn)
    assert predict_cpus_per_gpu(profile, gpn, nodes, cap) == expected


def test_parse_admin_record_inside_longer_comment() -> None:
    text = (
        "admin note: broken node  "
        "coda:sig=script:5:abc;cpg=4;was=;action=set;src=profile;gpn=1;nodes=1 more"
    )
    assert parse_admin_record(text) == {
        "sig": "script:5:abc",
        "cpg": "4",
        "was": "",
        "action": "set",
        "src": "profile",
        "gpn": "1",
        "nodes": "1",
    }


@pytest.mark.parametrize(
    "text",
    [
        "",
        "no record here",
        "coda:sig=a;cpg=1;was=;action=set",  # src missing
        "coda:sig=a;cpg=1;cpg=2;was=;action=set;src=none",
        "coda:sig=a;cpg;was=;action=set;src=none",
        "coda:sig=a=b;cpg=1;was=;action=set;src=none",
    ],
)
def test_parse_admin_record_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_admin_record(text)


def test_decision_is_immutable() -> None:
    d = run(job())
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.action = "skip"  # type: ignore[misc]


# What sbatch of Slurm 24.11 and 26.05 sends (see tests/controller/test_tres.py), and what is
# written.
SLASH_CASES = [
    ("--gpus-per-node=2", {"tres_per_node": "gres/gpu:2"}, "set", "gres/gpu:6", None),
    ("--gpus=2", {"tres_per_node": None, "tres_per_job": "gres/gpu:2"}, "set", "gres/gpu:6", None),
    (
        "-n2 --gpus-per-task=1",
        {"tres_per_node": None, "tres_per_task": "gres/gpu=1", "num_tasks": 2},
        "set",
        "gres/gpu:6",
        None,
    ),
    (
        "--gpus-per-node=2 --cpus-per-gpu=3, replace",
        {"tres_per_node": "gres/gpu:2", "cpus_per_tres": "gres/gpu:3"},
        "replace",
        "gres/gpu:6",
        None,
    ),
    (
        "-n1 -c 9 --gpus-per-task=1, replace",
        {"tres_per_node": None, "tres_per_task": "cpu=9,gres/gpu=1", "cpus_per_task": 9},
        "replace",
        None,
        6,
    ),
]


@pytest.mark.parametrize(
    ("fields", "action", "written", "cpus_per_task"),
    [c[1:] for c in SLASH_CASES],
    ids=[c[0] for c in SLASH_CASES],
)
def test_jobs_of_slurm_24_11_are_written_in_its_spelling(
    fields: dict[str, Any], action: str, written: str | None, cpus_per_task: int | None
) -> None:
    d = run(job(**fields), cfg(user_value="replace"))
    assert (d.action, d.cpus_per_tres, d.cpus_per_task) == (action, written, cpus_per_task)


@pytest.mark.parametrize("sockets_per_node", [2, 1, NO_VAL16])
def test_gpus_per_socket_leave_the_job_as_submitted(sockets_per_node: int) -> None:
    # Slurm gives that many GPUs on each socket the job's cores land on: a CPU request of
    # coda's could itself add GPUs, so nothing is written, with or without
    # --sockets-per-node (a minimum, not a limit).
    req = job(tres_per_node=None, tres_per_socket="gres:gpu:1", sockets_per_node=sockets_per_node)
    for conf in (cfg(), cfg(user_value="replace", default_cpus_per_gpu=4)):
        for user in ({}, {"cpus_per_task": 4}, {"cpus_per_tres": "gres:gpu:2"}):
            d = run(dataclasses.replace(req, **user), conf)
            assert d.action == "skip" and "per socket" in d.reason
            assert (d.cpus_per_tres, d.cpus_per_task, d.admin_comment) == (None, None, None)


def test_a_per_task_value_is_rewritten_per_task_and_the_node_cap_bounds_the_rounding() -> None:
    # 6 per GPU x 2 GPUs over 5 tasks is 2.4 per task: rounded up to 3 (15 CPUs) ...
    req = job(cpus_per_task=1, ntasks_per_node=5)
    assert run(req, cfg(user_value="replace")).cpus_per_task == 3
    # ... unless the node cap (at most 6 per GPU, 12 CPUs for 2 GPUs) forbids 15: then 2.
    d = decide(req, cfg(user_value="replace"), PROFILES, lambda gpn: 6)
    assert (d.action, d.cpus_per_task) == ("replace", 2)
    assert "--cpus-per-task=2" in (d.user_msg or "") and "replaces --cpus-per-task=1" in (
        d.user_msg or ""
    )


def test_raise_never_gives_a_task_fewer_cpus_than_it_asked() -> None:
    # -n2 -c2 --gpus-per-node=1 with an 8-per-GPU default: 8 CPUs over 2 tasks, 4 each.
    conf = cfg(default_cpus_per_gpu=8, unprofiled_user_value="raise")
    new = job(tres_per_node="gres:gpu:1", comment="coda:workload=new", num_tasks=2)
    raised = run(dataclasses.replace(new, cpus_per_task=2), conf)
    assert (raised.action, raised.cpus_per_tres, raised.cpus_per_task) == ("raise", None, 4)
    assert "--cpus-per-task=4" in (raised.user_msg or "")
    # 4 per task already gives the default: nothing to raise; 5 is above it: kept.
    for cpt in (4, 5):
        kept = run(dataclasses.replace(new, cpus_per_task=cpt), conf)
        assert (kept.action, kept.cpus_per_task) == ("keep", None)
    # The per-GPU form is raised per GPU as before.
    per_gpu = run(dataclasses.replace(new, cpus_per_tres="gres:gpu:2"), conf)
    assert (per_gpu.action, per_gpu.cpus_per_tres, per_gpu.cpus_per_task) == (
        "raise",
        "gres:gpu:8",
        None,
    )


@pytest.mark.parametrize("tres_per_task", ["gres:gpu:2", "cpu=8,gres/gpu=2"])
def test_minus_c_sbatch_derived_from_cpus_per_gpu_follows_it(tres_per_task: str) -> None:
    # -n1 --gpus-per-task=2 --cpus-per-gpu=4: sbatch also sends -c 8, and Slurm refuses a
    # job whose -c is not --cpus-per-gpu x --gpus-per-task.
    req = job(tres_per_node=None, tres_per_task=tres_per_task, num_tasks=1, cpus_per_task=8)
    sep = "/" if "/" in tres_per_task else ":"
    d = run(dataclasses.replace(req, cpus_per_tres=f"gres{sep}gpu:4"), cfg(user_value="replace"))
    assert (d.action, d.cpus_per_tres, d.cpus_per_task) == ("replace", f"gres{sep}gpu:6", 12)
    assert d.min_cpus_rescale is None  # min_cpus moves with -c, once


def test_advise_mode_says_which_cpus_per_task_it_would_write() -> None:
    d = run(job(cpus_per_task=2), cfg(mode="advise", user_value="replace"))
    assert (d.action, d.cpus_per_tres, d.cpus_per_task) == ("advise", None, None)
    record = parse_admin_record(d.admin_comment or "")
    assert (record["would"], record["cpt"]) == ("replace", "12")


@pytest.mark.parametrize(
    ("user_value", "cpus_per_tres", "rescale"),
    [
        ("replace", "gres/gpu:5", (5, 6)),
        ("lower", "gres/gpu:9", (9, 6)),
        ("replace", "gres/gpu:6", None),  # nothing to rescale
        ("keep", "gres/gpu:5", None),  # nothing written
    ],
)
def test_a_rewritten_cpus_per_gpu_says_how_to_rescale_min_cpus(
    user_value: str, cpus_per_tres: str, rescale: tuple[int, int] | None
) -> None:
    d = run(
        job(tres_per_node="gres/gpu:2", cpus_per_tres=cpus_per_tres), cfg(user_value=user_value)
    )
    assert d.min_cpus_rescale == rescale


def test_a_prediction_cut_by_a_bound_says_so_in_the_log_line() -> None:
    huge = {
        "workload:*:big": ProfileView(
            signature="workload:*:big",
            workload="big",
            cpus_per_gpu=100_000,
            confidence=0.95,
            n_samples=8,
            multi_node_cpus_per_gpu=None,
        )
    }
    d = decide(job(comment="coda:workload=big"), cfg(max_cpus_per_gpu=32), huge, no_cap)
    assert d.cpus_per_tres == "gres:gpu:32"
    assert d.log_msg.endswith("confident profile; capped at MaxCpusPerGpu=32")
