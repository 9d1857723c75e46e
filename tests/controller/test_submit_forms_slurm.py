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

A second table runs on a node with ``RestrictedCoresPerGPU`` (Slurm 24.05 on; 22.05's
slurmctld refuses the key and the table is skipped there): the profile's CPUs per GPU are
capped at what Slurm lets a job with that many of the node's GPUs have, and Slurm's own
bounds (coda off, a CPU-only job) are checked beside them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from slurm_plugin.decision.decide import parse_admin_record
from slurm_plugin.devtools.cluster import (
    DevCluster,
    DevClusterError,
    NodeSpec,
    parse_scontrol_line,
    slurm_version,
)
from tests.conftest import LogWatch, require_slurm, started
from tests.controller.test_submit_slurm import put_profile, wait_for_reload

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
    left_alone: bool = False
    """A form the hook leaves as submitted (no admin record, the user's own CPU option or
    none): GPUs per socket, whose count, and so CPUs, Slurm picks (the row checks that the
    job is as submitted, not Slurm's NumCPUs)."""

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
    # Both sockets of the node: one GPU on each.  The hook leaves GPUs per socket alone:
    # the count is Slurm's choice, not the request's (--sockets-per-node is a minimum: Slurm
    # may spread the cores over both sockets and then gives a GPU on each, which 22.05
    # counts as one GPU for the CPUs and 24.11 as two), so the job gets Slurm's own answer.
    Form(("--gpus-per-socket=1", "--sockets-per-node=2"), 2, left_alone=True),
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


def submit(cluster: DevCluster, name: str, args: Sequence[str]) -> Outcome:
    """The job sbatch made of ``args``, or sbatch's refusal."""
    outcome = Outcome()
    try:
        outcome.job_id, _ = cluster.sbatch([f"--job-name={name}", *args], SCRIPT)
    except DevClusterError as exc:
        said = " / ".join(str(a) for a in exc.args[1:]).replace("\n", " / ")
        outcome.error = f"sbatch refused it: {said}"
    return outcome


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
                results[row] = submit(cluster, f"forms-{index}", row.args)
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
    if row.form.left_alone:
        _check_left_alone(outcomes[row], row)
        return
    cpus, action, cpg = row.expected()
    want = f"NumCPUs={cpus} (action={action} cpg={cpg})"
    # A --cpus-per-task request stays per task: each task gets its share of the CPUs.
    per_task = row.ask.kind == "cpt"
    if per_task:
        want += f" CPUs/Task={cpus // row.form.tasks}"
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
    if per_task:
        actual += f" CPUs/Task={fields.get('CPUs/Task')}"
    if actual != want:
        pytest.fail(
            f"[{row.label}] expected {want} with {row.form.gpus} GPUs, got {actual} with "
            f"{held_gpus(fields)} GPUs; job: {_shown(fields)}",
            pytrace=False,
        )


def _check_left_alone(got: Outcome, row: Row) -> None:
    asked = row.ask.args(row.form)
    # Slurm shows the partition's DefCpuPerGPU as the job's CpusPerTres when it gave none.
    per_gpu = row.ask.per_gpu if row.ask.kind == "cpg" else DEF_CPU_PER_GPU
    cpg = None if row.ask.kind == "cpt" else f"gpu:{per_gpu}"
    cpt = asked[0].split("=")[1] if row.ask.kind == "cpt" else "1"
    want = f"no coda record, CpusPerTres={cpg} CPUs/Task={cpt}"
    if got.error:
        pytest.fail(f"[{row.label}] expected {want}, but {got.error}", pytrace=False)
    fields = got.fields
    shown = fields.get("CpusPerTres")
    actual = (
        f"{'a coda record' if 'coda:sig=' in fields.get('AdminComment', '') else 'no coda record'}"
        f", CpusPerTres={shown and shown.removeprefix('gres/').removeprefix('gres:')} "
        f"CPUs/Task={fields.get('CPUs/Task')}"
    )
    if actual != want:
        pytest.fail(f"[{row.label}] expected {want}, got {actual}; job: {_shown(fields)}")


# -- a node with RestrictedCoresPerGPU -----------------------------------------------------

RESTRICTED_CORES_PER_GPU = 3
RESTRICTED_NODE = NodeSpec(
    cpus=16, sockets=2, gpus=4, restricted_cores_per_gpu=RESTRICTED_CORES_PER_GPU
)
"""2 sockets x 8 cores, 2 GPUs on each (gres.conf ``Cores=``): 12 cores are restricted to
GPU jobs, 4 are not."""
RESTRICTED_PROFILE = 12
"""The profile's CPUs per GPU: more than a job with fewer than 4 GPUs can have there."""
RESTRICTED_SINCE = (24, 5)


def restricted_cpus(gpus: int) -> int:
    """slurm.conf(5) and select/cons_tres: a job holding ``gpus`` of the node's GPUs gets
    every core but those restricted to the other GPUs."""
    node = RESTRICTED_NODE
    return node.cpus - RESTRICTED_CORES_PER_GPU * (node.gpus - gpus)


@dataclass(frozen=True, slots=True)
class RestrictedRow:
    args: tuple[str, ...]
    cpus: int | None
    """NumCPUs of the running job; None: it never runs (sbatch refuses it, or it pends)."""

    def __str__(self) -> str:
        return " ".join(self.args)


def _profiled(gpus: int) -> RestrictedRow:
    per_gpu = min(RESTRICTED_PROFILE, restricted_cpus(gpus) // gpus)
    return RestrictedRow((f"--gpus={gpus}", "--comment=coda:workload=restricted"), per_gpu * gpus)


RESTRICTED_ROWS = (
    # coda caps the profile's 12 per GPU: 7, 5, 4 and 4 per GPU.
    *(_profiled(gpus) for gpus in (1, 2, 3, 4)),
    # DefaultCpusPerGpu=share without a profile: the node's 16 / 4 per GPU (a workload
    # whose name does not name "restricted", which would make that profile its prior).
    RestrictedRow(("--gpus=2", "--comment=coda:workload=unprofiled"), 8),
    # Slurm's own bounds, coda off: the cap is exactly what Slurm gives, no core more.
    RestrictedRow(("--gpus=1", f"--cpus-per-gpu={restricted_cpus(1)}", "--comment=coda:off"), 7),
    RestrictedRow(("-c", "4"), 4),  # a CPU-only job: the 4 unrestricted cores at most
    # Last, so that jobs which never start cannot hold the others back.
    RestrictedRow(
        ("--gpus=1", f"--cpus-per-gpu={restricted_cpus(1) + 1}", "--comment=coda:off"), None
    ),
    RestrictedRow(("-c", "5"), None),
)


@pytest.fixture(scope="module")
def restricted_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    require_slurm()
    major, minor = slurm_version()
    if (major, minor) < RESTRICTED_SINCE:
        pytest.skip(
            "RestrictedCoresPerGPU is a key of Slurm 24.05 and later: the slurmctld of "
            f'Slurm {major}.{minor:02d} refuses it ("Parsing error at unrecognized key", '
            '"Unable to process configuration file")'
        )
    root: Path = tmp_path_factory.mktemp("slurm-restricted")
    yield from started(
        DevCluster(root, node=RESTRICTED_NODE, coda_conf_extra="DefaultCpusPerGpu=share\n")
    )


@pytest.fixture(scope="module")
def restricted_outcomes(restricted_cluster: DevCluster) -> dict[RestrictedRow, Outcome]:
    cluster = restricted_cluster
    node = parse_scontrol_line(
        cluster.run(["scontrol", "-o", "show", "node"]).stdout.strip().splitlines()[0]
    )
    assert node.get("RestrictedCoresPerGPU", "").startswith(f"{RESTRICTED_CORES_PER_GPU}("), node
    put_profile(cluster, "workload:*:restricted", RESTRICTED_PROFILE)
    wait_for_reload(cluster)
    results: dict[RestrictedRow, Outcome] = {}
    try:
        for index, row in enumerate(RESTRICTED_ROWS):
            results[row] = submit(cluster, f"rcores-{index}", row.args)
        drain(cluster, results)
    finally:
        cluster.run(["scancel", "--user=root"], check=False)
    return results


@pytest.mark.parametrize("row", RESTRICTED_ROWS, ids=str)
def test_restricted_cores_bound_what_a_job_gets(
    restricted_outcomes: dict[RestrictedRow, Outcome], row: RestrictedRow
) -> None:
    got = restricted_outcomes[row]
    if row.cpus is None:
        if not got.error:
            pytest.fail(
                f"[{row}] expected it never to run on the RestrictedCoresPerGPU node, but it "
                f"ran: {_shown(got.fields)}",
                pytrace=False,
            )
        return
    if got.error:
        pytest.fail(f"[{row}] expected NumCPUs={row.cpus}, but {got.error}", pytrace=False)
    if got.fields.get("NumCPUs") != str(row.cpus):
        pytest.fail(
            f"[{row}] expected NumCPUs={row.cpus}, got {got.fields.get('NumCPUs')}; job: "
            f"{_shown(got.fields)}",
            pytrace=False,
        )
