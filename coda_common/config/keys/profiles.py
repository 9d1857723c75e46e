"""``coda.conf`` keys: the profile store, and how the nodes hand their samples and usage
records to it (``Profile*``, ``MungeSocket``)."""

from coda_common.config.keys import key
from coda_common.config.values import (
    abs_path,
    abs_path_or_none,
    ints,
    one_of,
    partition_list,
    profile_store,
    uids,
)

PROFILE_STORE = key(
    "ProfileStore",
    "path",
    "/var/lib/coda/profiles",
    profile_store,
    "Directory of the workload profile store (absolute path).",
)

PROFILE_PUBLISH = key(
    "ProfilePublish",
    "store|munge",
    "store",
    one_of("store", "munge"),
    "How coda-node hands a probing run's samples and its jobs' usage records to the "
    "controller: store, merged straight "
    "into ProfileStore (which the node daemon must be able to write as root); munge, "
    "written as a munge credential into ProfileDropDir, where coda-slurm profiles collect "
    "on the controller checks and merges it (NFS with root_squash).",
)

PROFILE_DROP_DIR = key(
    "ProfileDropDir",
    "path",
    "/var/spool/coda/drop",
    abs_path,
    "ProfilePublish=munge: the directory the node daemons drop credentials into and "
    "coda-slurm profiles collect reads (absolute path; root-owned, mode 1733 or 1777).",
)

MUNGE_SOCKET = key(
    "MungeSocket",
    "path",
    "/run/munge/munge.socket.2",
    abs_path,
    "ProfilePublish=munge: munged's socket, for munge on the nodes and unmunge on the "
    "controller (absolute path).",
)

PROFILE_DROP_UIDS = key(
    "ProfileDropUids",
    "list",
    "0",
    uids,
    "coda-slurm profiles collect: uids whose credentials are accepted (comma-separated "
    "numbers; the uid coda-node runs as).",
)

PROFILE_DROP_HOSTS = key(
    "ProfileDropHosts",
    "list",
    "",
    partition_list,
    "coda-slurm profiles collect: hosts a credential may come from (munge's ENCODE_HOST): "
    "addresses, CIDR networks or host names, comma-separated; empty = the NodeAddr and "
    "NodeHostName of every node scontrol show node lists.",
)

PROFILE_DROP_TTL_S = key(
    "ProfileDropTtlS",
    "int",
    "3600",
    ints(1, 86400),
    "ProfilePublish=munge: seconds a dropped credential stays valid; one not collected "
    "by then is refused as expired (1..86400; munged refuses more than its --max-ttl, "
    "3600 by default).",
)

JOB_SUMMARY_DIR = key(
    "JobSummaryDir",
    "path",
    "",
    abs_path_or_none,
    "Directory of the job summaries coda-node writes when a job ends (absolute path; "
    "empty = <ProfileStore>/jobs). ProfilePublish=store: the nodes write it as root, like "
    "the profile store; munge: coda-slurm profiles collect writes it.",
)

JOB_SUMMARY_RETENTION_DAYS = key(
    "JobSummaryRetentionDays",
    "int",
    "90",
    ints(1, 3650),
    "Days a job summary is kept (whole days are removed, oldest first; 1..3650).",
)

JOB_SUMMARY_MAX_MIB = key(
    "JobSummaryMaxMiB",
    "int",
    "1024",
    ints(1, 999_999),
    "MiB the job summaries may take on disk; past it the oldest days are removed (the "
    "current day is always kept; 1..999999). A summary is about 900 bytes.",
)
