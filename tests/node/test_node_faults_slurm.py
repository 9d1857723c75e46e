"""coda-node killed at random points on the confined dev cluster (tests/node/node_faults.py):
after every restart each job holds what its current limit says, or Slurm's allocation.

A few kills here; bench/bench_fault_injection.py runs a hundred and more."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_plugin.devtools.cluster import DevCluster
from tests.conftest import require_slurm, started
from tests.node.node_faults import fault_cluster, injector
from tests.node.test_node_slurm import _cgroup_v1_reason

pytestmark = pytest.mark.slurm

KILLS = 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    require_slurm()
    reason = _cgroup_v1_reason()
    if reason:
        pytest.skip(reason)
    yield from started(fault_cluster(tmp_path_factory.mktemp("faults")))


def test_sigkill_at_random_points_never_leaves_a_job_wrong(cluster: DevCluster) -> None:
    with injector(cluster, seed=22) as inj:
        outcome = inj.run(KILLS)
        print(outcome.summary())
        assert outcome.wrong == []
        assert outcome.kills == KILLS
        assert len(outcome.converge_s) + outcome.restarts_right == KILLS
        # With no limit and coda-node restore, every job is back as Slurm set it.
        inj.kill_daemon()
        inj.limits = {}
        assert inj.restore() == []
    assert not list(Path("/sys/fs/cgroup/cpu/coda").glob("job_*"))
