"""Every GPU request form x every ``UserValue`` mode, submitted and run.

One table row per (request form, the user's own CPU option, ``UserValue``): the job is
submitted to the session's real Slurm (tests/conftest.py), runs, and the CPUs slurmctld
allocated to the running job (``NumCPUs``) must be what the rules of docs/config.md and
docs/user-guide.md say, computed here from the planted profile, the GPUs the form puts on
the node and the user's own value, not from the hook's code:

* no user value: the profile's CPUs per GPU for each GPU (action ``set``);
* ``keep``: the user's own CPUs (``--cpus-per-gpu`` x GPUs, or ``--cpus-per-task`` x tasks);
* ``lower``: the profile's value where it is below the user's per GPU, else the user's;
* ``replace``: the profile's value.

The admin record (``AdminComment``) must name the same action, with the profile's value as
``cpg=``.  Rows of a workload without a profile check the ground the table stands on:
Slurm's ``DefCpuPerGPU`` when the hook writes nothing.  A failure also shows the GPUs the job
holds (``scontrol -d``): a ``--gpus-per-socket`` job holds what its request says only where
gres.conf ties each GPU to its socket's cores (``Cores=``).

All rows are submitted first (the decision is taken at submission; one ``coda.conf``
rewrite per mode), then drained: each job is read once it runs and cancelled at once, so
that the node's 4 GPUs go to the next ones.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import pytest

from slurm_plugin.decision.decide import parse_admin_record
from slurm_plugin.devtools.cluster import DevCluster, DevClusterError, parse_scontrol_line
from tests.conftest import LogWatch
from tests.test_submit_slurm import put_profile, wait_for_reload

pytestmark = pytest.mark.slurm

PREDICTED = 3
"""CPUs per GPU of the planted profile; the partition's DefCpuPerGPU (4) differs, so a job
the hook left alone shows."""
ABOVE, BELOW = 5, 2
"""The user's own CPUs per GPU, above and below PREDICTED (``lower`` differs on them)."""
DEF_CPU_PER_GPU = 4
"""The dev cluster's partition default (DevCluster.def_cpu_per_gpu)."""
WORKLOAD = "forms-profiled"
UNPROFILED = "forms-unprofiled"
MODES = ("keep", "lower", "replace")
SCRIPT = "#!/bin/sh\nsleep 30\n"
RAN = frozenset({"RUNNING", "COMPLETING", "COMPLETED"})
STALL_S = 70.0
"""Jobs still pending after this long with none of ours starting will not start (the main
scheduler's periodic pass comes once a minute)."""
_HELD_GPUS = re.compile(r"gpu(?::[^:(,\s]+)?:(\d+)\(IDX:")


@dataclass(frozen=True, slots=True)
class Form:
    """A GPU request as a user types it, and what it puts on the one node."""

    args: tuple[str, ...]
    gpus: int
    """GPUs the job gets on its node."""
    tasks: int = 1
    """Tasks on the node."""

    def __str__(self) -> str:
        return " ".join(self.args)


FORMS = (
    Form(("--gpus=1",), 1),
    Form(("--gpus=a100:2",), 2),
    Form(("--gpus-per-node=1",), 1),
    Form(("--gpus-per-node=2",), 2),
    Form(("--ntasks-per-node=2", "--gpus-per-node=2"), 2, tasks=2),
    Form(("--gres=gpu:2",), 2),
    Form(("--gres=gpu:a100:1",), 1),
    Form(("--ntasks=1", "--gpus-per-task=2"), 2),
    Form(("--ntasks=2", "--gpus-per-task=1"), 2, tasks=2),
    # Both sockets of the node: one GPU on each.  With --sockets-per-node=1 the GPU count
    # is Slurm's choice, not the request's (the option is a minimum: Slurm may spread the
    # cores over both sockets and then gives a GPU on each, which 22.05 counts as one GPU
    # for the CPUs and 24.11 as two; --distribution=block:block keeps 22.05 on one socket
    # but not 24.11), so no row could say what such a job should get.
    Form(("--gpus-per-socket=1", "--sockets-per-node=2"), 2),
)


@dataclass(frozen=True, slots=True)
class Ask:
    """The user's own CPU option: ``--cpus-per-gpu`` (``cpg``) or ``--cpus-per-task``
    (``cpt``), for ``per_gpu`` CPUs per GPU; ``kind=""``: none."""

    kind: str
    per_gpu: int = 0

    def args(self, form: Form) -> tuple[str, ...]:
        if self.kind == "cpg":
            return (f"--cpus-per-gpu={self.per_gpu}",)
        if self.kind == "cpt":
            cpus = self.per_gpu * form.gpus
            assert cpus % form.tasks == 0, (form, self)
            return (f"--cpus-per-task={cpus // form.tasks}",)
        return ()


ASKS = (Ask(""), Ask("cpg", ABOVE), Ask("cpg", BELOW), Ask("cpt", ABOVE), Ask("cpt", BELOW))


@dataclass(frozen=True, slots=True)
class Row:
    form: Form
    ask: Ask
    mode: str
    profiled: bool = True

    @property
    def args(self) -> list[str]:
        workload = WORKLOAD if self.profiled else UNPROFILED
        return [*self.form.args, *self.ask.args(self.form), f"--comment=coda:workload={workload}"]

    @property
    def label(self) -> str:
        asked = " ".join(self.ask.args(self.form)) or "no CPU option"
        what = ", no profile" if not self.profiled else ""
        return f"{self.form} | {asked} | UserValue={self.mode}{what}"

    def expected(self) -> tuple[int, str, str]:
        """(NumCPUs, action, cpg) by the documented rules."""
        gpus = self.form.gpus
        if not self.profiled:
            assert not self.ask.kind
            return DEF_CPU_PER_GPU * gpus, "skip", ""
        profile = PREDICTED * gpus, str(PREDICTED)
        if not self.ask.kind:
            return profile[0], "set", profile[1]
        if self.mode == "replace":
            return profile[0], "replace", profile[1]
        if self.mode == "lower" and self.ask.per_gpu > PREDICTED:
            return profile[0], "lower", profile[1]
        return self.ask.per_gpu * gpus, "keep", profile[1]


ROWS = [Row(form, ask, mode) for mode in MODES for form in FORMS for ask in ASKS] + [
    Row(form, Ask(""), "keep", profiled=False) for form in FORMS
]


@dataclass(slots=True)
class Outcome:
    job_id: int | None = None
    fields: dict[str, str] = field(default_factory=dict)
    """``scontrol -o -d show job`` when the job was seen running (or last seen)."""
    error: str = ""
    """Why there is no running job to read: sbatch's refusal, or the state it stayed in."""


def held_gpus(fields: dict[str, str]) -> int:
    """GPUs the job holds on its node (the detail line's ``GRES=gpu:a100:2(IDX:0-1)``)."""
    return sum(int(n) for n in _HELD_GPUS.findall(fields.get("GRES", "")))


def set_user_value(cluster: DevCluster, base: str, mode: str) -> None:
    log = LogWatch(cluster.ctld_log)
    cluster.coda_conf.write_text(base + f"UserValue={mode}\n")
    log.wait_for(rf"job_submit/coda: reloaded .* user_value={mode}\b")


def all_jobs(cluster: DevCluster) -> dict[int, dict[str, str]]:
    out = cluster.run(["scontrol", "-o", "-d", "show", "job"]).stdout
    jobs: dict[int, dict[str, str]] = {}
    for line in out.splitlines():
        if line.strip():
            fields = parse_scontrol_line(line.strip())
            jobs[int(fields["JobId"])] = fields
    return jobs


def drain(cluster: DevCluster, outcomes: dict[Row, Outcome]) -> None:
    """Read each submitted job once it runs and cancel it, until all ran or none starts."""
    waiting = {o.job_id: o for o in outcomes.values() if o.job_id is not None}
    last_start = time.monotonic()
    while waiting:
        jobs = all_jobs(cluster)
        started = [j for j in waiting if jobs.get(j, {}).get("JobState") in RAN]
        for job_id in started:
            waiting.pop(job_id).fields = jobs[job_id]
        if started:
            cluster.run(["scancel", *map(str, started)], check=False)
            last_start = time.monotonic()
        for job_id in [j for j in waiting if jobs.get(j, {}).get("JobState") != "PENDING"]:
            o = waiting.pop(job_id)
            o.fields = jobs.get(job_id, {})
            o.error = f"it ended without running (JobState={o.fields.get('JobState')})"
        if waiting and time.monotonic() - last_start > STALL_S:
            for job_id, o in waiting.items():
                o.fields = jobs.get(job_id, {})
                o.error = (
                    f"it never ran (JobState={o.fields.get('JobState')} "
                    f"Reason={o.fields.get('Reason')})"
                )
            return
        time.sleep(0.2)


@pytest.fixture(scope="module")
def outcomes(cluster: DevCluster) -> dict[Row, Outcome]:
    assert cluster.def_cpu_per_gpu == DEF_CPU_PER_GPU
    assert cluster.node.gpus >= 2 and cluster.node.sockets == 2
    cluster.run(["scancel", "--user=root"], check=False)  # the node's GPUs are ours
    original = cluster.coda_conf.read_text()
    base = "".join(
        line + "\n"
        for line in original.splitlines()
        if not re.match(r"\s*uservalue\s*=", line, re.IGNORECASE)
    )
    put_profile(cluster, f"workload:*:{WORKLOAD}", PREDICTED)
    wait_for_reload(cluster)
    results: dict[Row, Outcome] = {}
    try:
        for mode in MODES:
            set_user_value(cluster, base, mode)
            for index, row in enumerate(ROWS):
                if row.mode != mode:
                    continue
                outcome = results[row] = Outcome()
                try:
                    outcome.job_id, _ = cluster.sbatch(
                        [f"--job-name=forms-{index}", *row.args], SCRIPT
                    )
                except DevClusterError as exc:
                    said = " / ".join(str(a) for a in exc.args[1:]).replace("\n", " / ")
                    outcome.error = f"sbatch refused it: {said}"
        drain(cluster, results)
    finally:
        cluster.run(["scancel", "--user=root"], check=False)
        cluster.coda_conf.write_text(original)
        wait_for_reload(cluster)
    return results


def _shown(fields: dict[str, str]) -> str:
    keys = ("JobId", "JobState", "NumCPUs", "CpusPerTres", "CPUs/Task", "MinCPUsNode")
    keys += ("TresPerNode", "TresPerJob", "TresPerTask", "TresPerSocket", "GRES", "AdminComment")
    return " ".join(f"{k}={fields[k]}" for k in keys if k in fields)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.label)
def test_running_job_has_the_cpus_decided(outcomes: dict[Row, Outcome], row: Row) -> None:
    cpus, action, cpg = row.expected()
    want = f"NumCPUs={cpus} (action={action} cpg={cpg})"
    got = outcomes[row]
    if got.error:
        pytest.fail(f"[{row.label}] expected {want}, but {got.error}", pytrace=False)
    fields = got.fields
    try:
        record = parse_admin_record(fields.get("AdminComment", ""))
    except ValueError:
        record = {}
    actual = (
        f"NumCPUs={fields.get('NumCPUs')} (action={record.get('action')} cpg={record.get('cpg')})"
    )
    if actual != want:
        pytest.fail(
            f"[{row.label}] expected {want} with {row.form.gpus} GPUs, got {actual} with "
            f"{held_gpus(fields)} GPUs; job: {_shown(fields)}",
            pytrace=False,
        )
