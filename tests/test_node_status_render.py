"""`coda-node status` rendering of the adaptive loop's per-job state (progress, profiling)."""

from __future__ import annotations

from coda_node.cli import render_status


def _view(jobs: list[dict]) -> dict:
    return {
        "daemon": {
            "running": True,
            "node_name": "gpu01",
            "version": "0.1.0",
            "pid": 1,
            "enforce": ["cpuset", "quota"],
            "profiling": "on",
            "contention": "NodeEnforce includes neither quota nor a usable rdt",
        },
        "node": {"capabilities": [], "errors": []},
        "jobs": jobs,
        "events": [
            {"unix_s": 0.0, "job_id": 7, "what": "throttle", "reason": "CPU capped at 1 of 2"}
        ],
    }


def _job(job_id: int, **extra: object) -> dict:
    base = {
        "job_id": job_id,
        "user": "alice",
        "kind": "dnn",
        "gpus": [{"slurm_index": 0}],
        "cpus_allocated": "0-3",
        "cpus_now": "0",
        "cpu_rate_cores": 0.5,
        "quota_cores": None,
        "target_reason": "probe: 1 cores",
    }
    base.update(extra)
    return base


def test_progress_and_profile_columns_say_what_the_loop_is_doing() -> None:
    text = render_status(
        _view(
            [
                _job(
                    5,
                    progress={"phase": "train", "rate": 97.4, "source": "iterations"},
                    profiling={"state": "probing", "cores_now": 1},
                ),
                _job(
                    6,
                    progress={"phase": "val", "rate": 12.0, "source": "gpu_util"},
                    profiling={"state": "done", "sweet_spot_cores": 3, "confidence": 0.987},
                ),
                _job(7, kind="cpu", progress=None, profiling=None, quota_cores=1.0),
            ]
        ),
        None,
    )
    lines = text.splitlines()
    assert "profiling: on; contention: NodeEnforce includes neither quota" in text
    row5 = next(line for line in lines if line.lstrip().startswith("5 "))
    assert "train 97.4/s" in row5 and "probing 1c" in row5
    row6 = next(line for line in lines if line.lstrip().startswith("6 "))
    assert "val 12%" in row6 and "done 3c 0.99" in row6
    row7 = next(line for line in lines if line.lstrip().startswith("7 "))
    assert row7.split()[7] == "1" and " - " in row7  # quota shown, no progress/profile


def test_a_state_view_from_before_the_loop_still_renders() -> None:
    old = _job(5)  # no progress/profiling keys at all (a state file from an older daemon)
    view = _view([old])
    del view["daemon"]["profiling"], view["daemon"]["contention"]
    text = render_status(view, None)
    assert "profiling: ?; contention: ?" in text
    assert any(line.lstrip().startswith("5 ") for line in text.splitlines())
