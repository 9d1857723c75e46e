"""A workload with no confident profile yet: ``DefaultCpusPerGpu=share`` and
``UnprofiledUserValue=raise``.

A first run that asks for too few cores is starved for its whole run (Slurm cannot grow a
running job), and coda-node can only probe below what the job was given, so its profile
comes out censored. With these two keys such a job gets at least its GPUs' even share of
the node's cores.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from coda_common.config.codaconf import CodaConfig, parse_config
from coda_common.slurm.conffile import ConfigError
from coda_common.slurm.slurmconf import NodeShape
from slurm_plugin.config.nodecap import NodeCap, node_share_cpus_per_gpu
from slurm_plugin.decision.decide import (
    Decision,
    JobRequest,
    ProfileView,
    decide,
    parse_admin_record,
)
from slurm_plugin.hook.journal import summarize_decisions

# Two node shapes: 8 GPUs over 96 cores (12 per GPU), 4 GPUs over 32 cores (8 per GPU).
NODES = (NodeShape("big", 96, 8), NodeShape("small", 32, 4))
NODE_CAP = NodeCap(NODES, "slurm.conf")
PROFILES = {
    "workload:*:resnet50": ProfileView("workload:*:resnet50", "resnet50", 6, 0.95, 40, None)
}


def job(**fields: Any) -> JobRequest:
    base: dict[str, Any] = {
        "uid": 1000,
        "job_name": "train",
        "tres_per_node": "gres:gpu:1",
        "comment": "coda:workload=new-model",
    }
    base.update(fields)
    return JobRequest(**base)


def conf(text: str) -> CodaConfig:
    config, _ = parse_config(text)
    return config


SHARE_RAISE = conf("DefaultCpusPerGpu=share\nUnprofiledUserValue=raise")


def run(req: JobRequest, config: CodaConfig = SHARE_RAISE) -> Decision:
    return decide(req, config, PROFILES, NODE_CAP, node_share=NODE_CAP.share)


def test_share_is_the_leanest_node_that_can_hold_the_job() -> None:
    # 1-4 GPUs fit both shapes: the small one's 8 per GPU; 5-8 GPUs only fit the big one.
    assert [node_share_cpus_per_gpu(NODES, g) for g in (1, 4, 5, 8, 9)] == [8, 8, 12, 12, None]
    share = NodeCap(NODES, "slurm.conf").share
    assert [share(g) for g in (1, 4, 5, 8, 9)] == [8, 8, 12, 12, None]
    assert node_share_cpus_per_gpu((), 1) is None
    assert node_share_cpus_per_gpu(NODES, 0) is None


def test_no_user_value_gets_the_share() -> None:
    d = run(job())
    assert d.action == "default"
    assert d.cpus_per_tres == "gres:gpu:8"
    assert "the node's share of 8 per GPU" in (d.user_msg or "")
    d8 = run(job(tres_per_node="gres:gpu:8"))
    assert d8.cpus_per_tres == "gres:gpu:12"


@pytest.mark.parametrize(
    ("fields", "action", "written"),
    [
        # A user who asked for less than the share is raised to it, in the form asked...
        ({"cpus_per_tres": "gres:gpu:2"}, "raise", "gres:gpu:8"),
        ({"cpus_per_task": 4}, "raise", 8),  # one task, one GPU x 8
        # ...one who asked for the share or more keeps their value (their own judgement
        # until coda-node has measured the workload).
        ({"cpus_per_tres": "gres:gpu:8"}, "keep", None),
        ({"cpus_per_tres": "gres:gpu:20"}, "keep", None),
    ],
)
def test_a_low_user_value_is_raised_without_a_profile(
    fields: dict[str, Any], action: str, written: str | int | None
) -> None:
    d = run(job(**fields))
    assert d.action == action
    # ... a per-task value stays per task (what each task sees is raised too).
    assert (d.cpus_per_task if "cpus_per_task" in fields else d.cpus_per_tres) == written
    if action == "raise":
        assert "raises --cpus-per-" in (d.user_msg or "")
        assert parse_admin_record(d.admin_comment or "")["action"] == "raise"


def test_raise_is_off_by_default_and_a_profile_wins() -> None:
    plain = conf("DefaultCpusPerGpu=share")
    assert run(job(cpus_per_tres="gres:gpu:2"), plain).action == "keep"
    # A confident profile is used by UserValue's rules, whatever UnprofiledUserValue says.
    profiled = job(cpus_per_tres="gres:gpu:2", comment="coda:workload=resnet50")
    assert run(profiled).action == "keep"  # UserValue=keep
    replaced = run(profiled, dataclasses.replace(SHARE_RAISE, user_value="replace"))
    assert (replaced.action, replaced.cpus_per_tres) == ("replace", "gres:gpu:6")


def test_a_number_as_default_is_raised_to_as_well() -> None:
    d = run(job(cpus_per_tres="gres:gpu:2"), conf("DefaultCpusPerGpu=5\nUnprofiledUserValue=raise"))
    assert (d.action, d.cpus_per_tres) == ("raise", "gres:gpu:5")


def test_advise_mode_says_it_would_raise_and_writes_nothing() -> None:
    d = run(job(cpus_per_tres="gres:gpu:2"), dataclasses.replace(SHARE_RAISE, mode="advise"))
    assert d.action == "advise" and d.cpus_per_tres is None
    assert parse_admin_record(d.admin_comment or "")["would"] == "raise"


def test_share_without_node_shapes_leaves_the_job_as_submitted() -> None:
    # slurm.conf could not be read: there is no share to give, nothing is invented.
    empty = NodeCap((), "slurm.conf")
    d = decide(
        job(cpus_per_tres="gres:gpu:2"), SHARE_RAISE, PROFILES, empty, node_share=empty.share
    )
    assert d.action == "keep" and d.cpus_per_tres is None
    assert decide(job(), SHARE_RAISE, PROFILES, empty, node_share=empty.share).action == "skip"


def test_share_is_clamped_like_any_value() -> None:
    d = run(job(), dataclasses.replace(SHARE_RAISE, max_cpus_per_gpu=6))
    assert d.cpus_per_tres == "gres:gpu:6"
    assert "MaxCpusPerGpu=6" in (d.user_msg or "")


def test_conf_parsing() -> None:
    assert conf("DefaultCpusPerGpu=Share").default_cpus_per_gpu == "share"
    assert conf("DefaultCpusPerGpu=3").default_cpus_per_gpu == 3
    assert CodaConfig().unprofiled_user_value == "keep"
    with pytest.raises(ConfigError, match="UnprofiledUserValue=raise needs DefaultCpusPerGpu"):
        conf("UnprofiledUserValue=raise")
    with pytest.raises(ConfigError, match="UnprofiledUserValue"):
        conf("DefaultCpusPerGpu=share\nUnprofiledUserValue=always")
    with pytest.raises(ConfigError, match="DefaultCpusPerGpu"):
        conf("DefaultCpusPerGpu=half")


def test_status_counts_raised_cores_as_added() -> None:
    raised = {
        "t": 1.0,
        "action": "raise",
        "gpus": 1,
        "asked_cores": 2,
        "given_cores": 8,
        "cpg": 8,
        "src": "default",
    }
    summary = summarize_decisions([raised])
    assert summary["by_action"]["raise"] == {"jobs": 1, "gpus": 1}
    assert summary["added"] == {"jobs": 1, "cores": 6}
    assert summary["returned"] == {"jobs": 0, "cores": 0}
