"""coda beside what sites already run, on a real slurmctld and slurmdbd (MariaDB):

- a site job_submit.lua that sets ``admin_comment`` (one that appends, one that replaces:
  chosen by the job's name) and ``cpus_per_tres=gres:gpu:2`` for GPU jobs without a value,
  with ``JobSubmitPlugins=lua,coda`` and ``coda,lua``;
- Princeton jobstats' slurmctld epilog, which replaces the job's ``AdminComment`` with
  ``JS1:<base64>`` at job end (``sacctmgr update job``).

What an admin sees is asserted: ``scontrol -o show job``, ``sacct -o AdminComment,AllocTRES``
and ``coda-slurm job``; each order's jobs are compared with the same submission that coda
leaves alone (``--comment=coda:off``). Two clusters (one per order), jobs submitted together.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from coda_common.store.jobsummary import JobSummary
from coda_common.store.summaries import SummaryStore
from slurm_plugin.devtools.accounting import missing_tools
from slurm_plugin.devtools.cluster import DevCluster
from tests.conftest import gres, require_slurm, started

pytestmark = pytest.mark.slurm

CODA_SLURM = [sys.executable, "-m", "slurm_plugin.cli.main"]
DEFAULT_CPG = 3
LUA_CPG = 2
JS1 = "JS1:" + base64.b64encode(b'{"gpus":{"gpu01":[0,1]},"nodes":1}').decode()
HOSTILE = "replace|evil\nname \\"
"""A job the Lua replaces the admin comment of, named with sacct's delimiter, a line break,
a blank and a backslash."""
JS1_STORED = (JS1, JS1.lower())
"""What sacct shows after the epilog: Slurm 22.05's sacctmgr lowercases the value it sets."""
SLEEP = "#!/bin/sh\nsleep 2\n"

SITE_LUA = f"""
-- A site's job_submit.lua: an admin comment of its own, and 2 cores per GPU for GPU jobs
-- that ask none.
function slurm_job_submit(job_desc, part_list, submit_uid)
  local name = job_desc.name or ""
  if string.sub(name, 1, 7) == "replace" or job_desc.admin_comment == nil then
    job_desc.admin_comment = "site:lua"
  else
    job_desc.admin_comment = job_desc.admin_comment .. " site:lua"
  end
  local gpus = job_desc.tres_per_job or job_desc.tres_per_node or job_desc.tres_per_task
  if gpus ~= nil and string.find(gpus, "gpu") and job_desc.cpus_per_tres == nil then
    job_desc.cpus_per_tres = "{gres("gres:gpu:")}{LUA_CPG}"
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end
"""


def _epilog(c: DevCluster) -> str:
    """jobstats' slurmctldepilog.sh as it stands: the summary replaces AdminComment once
    slurmdbd has the job's end (before that, slurmctld's end record would overwrite it)."""
    sacct, sacctmgr = shutil.which("sacct"), shutil.which("sacctmgr")
    return f"""#!/bin/sh
export SLURM_CONF={c.slurm_conf}
i=0
while [ $i -lt 60 ] && {sacct} -n -X -j "$SLURM_JOB_ID" -o End | grep -q Unknown; do
  sleep 0.5; i=$((i + 1))
done
{sacctmgr} -i update job where jobid="$SLURM_JOB_ID" set 'AdminComment="{JS1}"'
"""


def _require_accounting() -> None:
    require_slurm()
    missing = missing_tools()
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (mariadb-server, slurmdbd)")


@dataclass
class Site:
    cluster: DevCluster
    ids: dict[str, int]

    def sacct(self, job: str, field: str) -> str:
        out = self.cluster.run(
            ["sacct", "-n", "-P", "-X", "-j", str(self.ids[job]), f"--format={field}"]
        ).stdout
        return out[:-1]

    def scontrol(self, job: str) -> str:
        return self.cluster.run(["scontrol", "-o", "show", "job", str(self.ids[job])]).stdout

    def report(self, job: str) -> dict[str, Any]:
        return json.loads(self._report(job, "--json"))

    def text(self, job: str) -> str:
        return self._report(job)

    def _report(self, job: str, *extra: str) -> str:
        return subprocess.run(
            [*CODA_SLURM, "job", str(self.ids[job]), "--conf", str(self.cluster.coda_conf), *extra],
            capture_output=True,
            encoding="utf-8",
            errors="replace",
            timeout=60,
            env=self.cluster.env,
            check=True,
        ).stdout


def _site(root: Path, order: str, jobstats: bool, jobs: dict[str, list[str]]) -> Iterator[Site]:
    """A cluster with ``JobSubmitPlugins=order``, the site Lua (and jobstats' epilog), the
    ``jobs`` submitted and ended in slurmdbd (and, with jobstats, their JS1 written)."""
    root.mkdir(parents=True)
    epilog = root / "jobstats-epilog.sh"
    cluster = DevCluster(
        root,
        accounting=True,
        job_submit_plugins=order,
        slurm_conf_extra=f"EpilogSlurmctld={epilog}\n" if jobstats else "",
        coda_conf_extra=f"DefaultCpusPerGpu={DEFAULT_CPG}\n",
    )
    cluster.etc.mkdir(parents=True, exist_ok=True)
    (cluster.etc / "job_submit.lua").write_text(SITE_LUA)
    epilog.write_text(_epilog(cluster))
    epilog.chmod(0o755)
    for c in started(cluster):
        site = Site(c, {job: c.sbatch(args, SLEEP)[0] for job, args in jobs.items()})
        deadline = time.monotonic() + 90
        while True:
            done = [site.sacct(j, "End") not in ("", "Unknown") for j in jobs]
            if jobstats:
                done += [site.sacct(j, "AdminComment") in JS1_STORED for j in jobs]
            if all(done):
                break
            assert time.monotonic() < deadline, {j: site.sacct(j, "End,AdminComment") for j in jobs}
            time.sleep(0.5)
        yield site


@pytest.fixture(scope="module")
def lua_first(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    _require_accounting()
    yield from _site(
        tmp_path_factory.mktemp("lua-coda") / "c",
        "lua,coda",
        jobstats=True,
        jobs={
            "append": ["--gpus=1", "-J", "train"],
            "replace": ["--gpus=1", "-J", "replace-train"],
            "off": ["--gpus=1", "-J", "train", "--comment=coda:off"],
        },
    )


@pytest.fixture(scope="module")
def coda_first(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    _require_accounting()
    yield from _site(
        tmp_path_factory.mktemp("coda-lua") / "c",
        "coda,lua",
        jobstats=False,
        jobs={
            "append": ["--gpus=1", "-J", "train"],
            "replace": ["--gpus=1", "-J", HOSTILE],
            "off": ["--gpus=1", "-J", "train", "--comment=coda:off"],
        },
    )


def _cores(site: Site, job: str) -> int:
    tres = dict(t.split("=", 1) for t in site.sacct(job, "AllocTRES").split(","))
    return int(tres["cpu"])


def test_lua_then_coda_keeps_coda_s_record_and_takes_lua_s_value_as_the_users(
    lua_first: Site,
) -> None:
    site = lua_first
    for job in ("append", "replace"):
        # coda appends its record to the comment the Lua set, whichever way the Lua set it.
        shown = site.scontrol(job)
        assert " AdminComment=site:lua coda:sig=" in shown
        assert ";was=cpg:2;action=keep;" in shown
    assert " AdminComment=site:lua " in site.scontrol("off")
    assert "coda:sig=" not in site.scontrol("off")
    # Lua's 2 per GPU reached coda as if the user had asked it: the job has what the same
    # submission has without coda.
    assert _cores(site, "append") == _cores(site, "off") == LUA_CPG


def test_jobstats_replaces_the_admin_comment_and_coda_slurm_job_still_says_what_coda_did(
    lua_first: Site,
) -> None:
    site = lua_first
    stored = {job: site.sacct(job, "AdminComment") for job in site.ids}
    assert all(value in JS1_STORED for value in stored.values()), stored
    # What coda-node writes at the job's end: the record it read while the job ran.
    record = site.scontrol("append").split(" AdminComment=site:lua ", 1)[1].split()[0]
    summary = _summary(site.ids["append"], record)
    SummaryStore(site.cluster.profile_store / "jobs").append([summary], "gpu01")

    report = site.report("append")
    assert report["admin_comment"] == stored["append"]
    assert report["coda_source"]["source"] == "summary"
    assert report["coda"]["record"] == record
    assert (report["coda"]["action"], report["coda"]["user_request"]) == ("keep", "cpg:2")
    assert report["gpus_waiting_on_cpu"]["verdict"] == "yes"
    assert report["summaries"][0]["node"] == "gpu01"
    text = site.text("append")
    assert "from coda-node's job summary: the job's AdminComment holds no coda record" in text
    assert "GPUs waiting on CPU  yes:" in text

    # No summary of this one: the journal's entry, by the user, name and submit time.
    report = site.report("replace")
    assert report["coda_source"]["source"] == "journal"
    assert report["coda_source"]["why"].endswith("matched by name and submit time")
    assert report["coda"]["action"] == "keep"
    assert report["gpus_waiting_on_cpu"]["verdict"] == "unknown"
    # The job coda left alone has no decision anywhere; its namesake's journal entry, at
    # the same second, is not taken for it.
    off = site.report("off")
    assert off["coda"] is None
    assert "ambiguous: 2 jobs of its user and name" in off["coda_source"]["why"]


def test_coda_then_lua_a_lua_that_appends_keeps_the_record_one_that_replaces_loses_it(
    coda_first: Site,
) -> None:
    site = coda_first
    shown = site.scontrol("append")
    assert " AdminComment=coda:sig=" in shown and " site:lua " in shown + " "
    assert ";action=default;" in shown
    # coda's value stands (the Lua sets one only where none is): DefaultCpusPerGpu, not
    # the Lua's.
    assert _cores(site, "append") == DEFAULT_CPG
    assert _cores(site, "off") == LUA_CPG
    assert site.sacct("append", "AdminComment").startswith("coda:sig=")

    # The Lua after coda replaced the comment: the job holds no record (coda-node cannot
    # profile it); coda-slurm job finds the decision in the journal and says so.
    assert site.sacct("replace", "AdminComment") == "site:lua"
    report = site.report("replace")
    assert report["name"] == HOSTILE
    assert report["coda_source"]["source"] == "journal"
    assert report["coda"]["action"] == "default"
    assert report["coda"]["cpus_per_gpu"] == DEFAULT_CPG
    text = site.text("replace")
    assert "from the hook's decision journal: the job's AdminComment holds no coda record" in text
    assert "'site:lua'" in text


def _summary(job_id: int, record: str) -> JobSummary:
    now = time.time()
    return JobSummary(
        job_id=job_id,
        node="gpu01",
        user="root",
        uid=0,
        account=None,
        partition="gpu",
        kind="dnn",
        num_nodes=1,
        start_unix_s=now - 3,
        end_unix_s=now,
        sampled_s=2.0,
        gpus=1,
        gpu_model=None,
        cores_allocated=2,
        cores_mean=2.0,
        cpu_used_cores_mean=1.9,
        gpu_util_pct_mean=40.0,
        gpu_sampled_s=2.0,
        gpu_wait_s=2.0,
        idle_core_s=0.2,
        probe_s=0.0,
        probes=0,
        slim_s=0.0,
        throttled_s=0.0,
        protected_s=0.0,
        profile_state="new",
        record=record,
    )
