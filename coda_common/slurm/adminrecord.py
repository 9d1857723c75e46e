"""The submit hook's record of its decision, written into a job's ``AdminComment``.

Pure and stdlib-only: the decision (:mod:`slurm_plugin.decision.decide`) writes it, the hook, the
journal, ``coda-slurm status``/``job`` and the node daemon (:mod:`coda_node.system.slurmjobs`) read
it back with :func:`parse_admin_record`.

Admin record (``Decision.admin_comment``), one token without blanks, < 300 characters::

    coda:sig=<KEY>;cpg=<N>;was=<WAS>;action=<ACTION>;src=<SRC>[;would=<ACTION>];gpn=<N>;nodes=<N>

    sig     signature key (coda_common.signature), e.g. workload:1000:resnet50,
            script:1000:0123456789abcdef, name:1000:0123456789abcdef
    cpg     CPUs per GPU CODA chose: written (set/default/raise/lower/replace), suggested
            (keep/advise); empty when there is none (skip of an unknown workload)
    was     the user's explicit request before CODA: cpg:<N> (--cpus-per-gpu=N),
            cpt:<N> (--cpus-per-task=N), empty when none
    action  Decision.action
    src     profile (the user's own key), global (workload:*:<NAME> its directive
            named), prior:<NAME> (workload:*:<NAME> its job name or script named, used as
            a floor; slurm_plugin.decision.priors), default (DefaultCpusPerGpu), none (no
            confident profile)
    would   only with action=advise: the action enforce mode would have taken
    gpn     GPUs per node as CODA computed it;  nodes: node count assumed
    mn      only for a multi-node job given its profile's measured multi-node figure
            (MultiNodeMinSamples): how many per-node figures it is from
    cpt     only where the user asked ``--cpus-per-task`` and CODA rewrote it (or, with
            action=advise, would): the CPUs per task written (cpg x gpn over the tasks
            on a node)

Placement fields, appended only when the hook changed the job that way::

    pcie    1: PCIe-heavy, one unit of the PcieSpreadGres GRES added per node
    prefer  the node feature set as --prefer (PreferGpuTypes)
    membw   N: a memory-bound CPU-only job, N units of the MemBwSpreadGres GRES added per
            node (advise mode: would-membw=N)

A CPU-only job's record (``MemBwSpreadGres`` set) has ``cpg=``, ``was=``, ``action=skip``,
``src=none`` and ``gpn=0``: it names the workload, for coda-node's measurements.

Fields are ``;``-separated ``key=value`` pairs; values never hold ``;``, ``=`` or blanks.
:func:`parse_admin_record` reads it back (also from inside a longer admin comment).
"""

from __future__ import annotations

ADMIN_PREFIX = "coda:sig="
"""Where the record starts, in an admin comment that may hold other text too."""


def parse_admin_record(s: str) -> dict[str, str]:
    """The fields of the admin record in ``s`` (``{"sig": ..., "cpg": ..., ...}``).

    ``s`` may be the record alone or a longer admin comment holding it (the record runs
    from ``coda:sig=`` to the next blank).  Raises ValueError when there is no record or
    it is malformed.
    """
    start = s.find(ADMIN_PREFIX)
    if start < 0:
        raise ValueError("no coda record (coda:sig=...) in the admin comment")
    end = start
    while end < len(s) and not s[end].isspace():
        end += 1
    fields: dict[str, str] = {}
    for part in s[start + len("coda:") : end].split(";"):
        key, eq, value = part.partition("=")
        if not eq or not key or "=" in value:
            raise ValueError(f"malformed field {part!r} in coda record")
        if key in fields:
            raise ValueError(f"field {key!r} twice in coda record")
        fields[key] = value
    for key in ("sig", "cpg", "was", "action", "src"):
        if key not in fields:
            raise ValueError(f"coda record lacks {key}=")
    return fields
