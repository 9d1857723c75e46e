"""slurm.conf as coda reads it: the node shapes of its ``NodeName=`` lines, its
``PartitionName=`` lines, and top-level keys, following ``Include`` lines as Slurm does;
and what follows from them (the count-only GRES units each partition's nodes all have).

Only :func:`read_slurm_nodes`, :func:`read_slurm_conf`, :func:`read_slurm_keys`,
:func:`read_slurmctld_hosts` and :func:`mtime_ns` touch files; everything else is pure.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from coda_common.slurm.conffile import ConfigError, logical_lines, read_text, tokenize
from coda_common.slurm.hostlist import count_hostlist, expand_hostlist

__all__ = [
    "NodeShape",
    "PartitionShape",
    "gres_gpus",
    "gres_units_per_partition",
    "mtime_ns",
    "read_slurm_conf",
    "read_slurm_keys",
    "read_slurm_nodes",
    "read_slurmctld_hosts",
    "slurmctld_host_names",
    "spread_partitions",
]

_MAX_INCLUDE_DEPTH = 16


@dataclass(frozen=True, slots=True)
class NodeShape:
    """One ``NodeName=`` line of slurm.conf: its host expression, CPUs and GPUs per node."""

    names: str
    """The NodeName value as written (``gpu[01-04]``)."""
    cpus: int
    """CPUs per node: ``CPUs=``, else Boards x Sockets x CoresPerSocket x ThreadsPerCore."""
    gpus: int
    """GPUs per node: all ``gpu`` entries of ``Gres=`` summed, typed or not."""
    count: int = 1
    """Number of nodes the host expression names."""
    features: tuple[str, ...] = ()
    """The node's ``Feature=`` (or ``Features=``) list; the hook only sets ``--prefer`` to
    one of these (Slurm rejects a job preferring a feature no node has)."""
    gres: tuple[tuple[str, int], ...] = ()
    """Every GRES of ``Gres=`` but ``gpu`` and its count per node (types summed), e.g.
    ``(("membw", 200), ("pcie", 2))``; an entry whose count cannot be read is left out."""
    restricted_cpus_per_gpu: int = 0
    """CPUs of the cores ``RestrictedCoresPerGPU=`` (Slurm 24.05 on) keeps for GPU jobs,
    per GPU: the cores times the CPUs Slurm counts per core; 0 when the line does not set it.
    slurm.conf(5): a job that asks for no GPU cannot use these cores; select/cons_tres gives
    a job holding g of the node's GPUs at most g times this many of them
    (``gres_filter.c``, ``max_res_cores = cnt_avail_total * res_cores_per_gpu``)."""

    def gpu_job_cpus(self, gpus: int) -> int:
        """The most CPUs a job holding ``gpus`` of this node's GPUs can get on it: all but
        the cores restricted to the node's other GPUs."""
        return self.cpus - self.restricted_cpus_per_gpu * max(0, self.gpus - gpus)

    @property
    def cpu_job_cpus(self) -> int:
        """The CPUs a job that asks for no GPU can use on this node: all but the
        restricted cores (never below 0)."""
        return max(0, self.cpus - self.restricted_cpus_per_gpu * self.gpus)

    @property
    def restriction_fits(self) -> bool:
        """False when ``RestrictedCoresPerGPU`` asks more cores than the node has: slurmctld
        then sets the node DOWN when it registers ("RestrictedCoresPerGPU: We can't restrict
        N core(s) per gpu"), so no job runs on it."""
        return self.restricted_cpus_per_gpu * self.gpus <= self.cpus


@dataclass(frozen=True, slots=True)
class PartitionShape:
    """One ``PartitionName=`` line of slurm.conf."""

    name: str
    nodes: str
    """The ``Nodes=`` value as written (``gpu[01-04]``, ``ALL``), or the
    ``PartitionName=DEFAULT`` line's; "" when none."""
    default: bool | None
    """The partition of jobs submitted without ``--partition`` (``Default=YES``; when
    several say so, the last). :func:`read_slurm_conf` gives True or False."""
    def_cpu_per_gpu: int | None = None
    """``DefCpuPerGPU=``: the CPUs per GPU Slurm gives a job of this partition that asks
    for none; None when the line (and ``PartitionName=DEFAULT``) does not set it."""


_NODENAME_LINE = re.compile(r"\s*nodename\s*=", re.IGNORECASE)
_PARTITIONNAME_LINE = re.compile(r"\s*partitionname\s*=", re.IGNORECASE)
_INCLUDE_LINE = re.compile(r"\s*include\s+(.+)", re.IGNORECASE)
_GRES_COUNT = re.compile(r"([0-9]{1,9})([kKmMgG]?)")
_GRES_MULT = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def mtime_ns(path: Path) -> int | None:
    """``path``'s mtime in ns, or None when it cannot be stat'ed."""
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def gres_units_per_partition(
    nodes: Iterable[NodeShape], partitions: Iterable[PartitionShape], gres: str
) -> dict[str, int | None]:
    """Each partition's smallest per-node count of the count-only GRES ``gres`` over its
    nodes: the most units a job may ask per node and still be accepted wherever it could run
    there. None for a partition where that is not known or not safe: its ``Nodes=`` is
    empty or names a node slurm.conf does not define (a NodeSet, a feature), or one of its
    nodes lacks ``gres`` (Slurm refuses a job asking for a GRES no node of its partition
    has). Expands every host list once: run it off the hot path."""
    counts: dict[str, int] = {}
    unreadable = False
    for node in nodes:
        count = dict(node.gres).get(gres, 0)
        try:
            hosts = expand_hostlist(node.names)
        except ValueError:
            unreadable = True
            continue
        for host in hosts:
            counts[host] = count
    out: dict[str, int | None] = {}
    for part in partitions:
        least: int | None = None
        try:
            hosts = list(counts) if part.nodes.upper() == "ALL" else expand_hostlist(part.nodes)
        except ValueError:
            hosts = []
        if unreadable or not hosts:
            out[part.name] = None
            continue
        for host in hosts:
            count = counts.get(host, 0)
            if count < 1:
                least = None
                break
            least = count if least is None else min(least, count)
        out[part.name] = least
    return out


def spread_partitions(
    node_name: str,
    nodes: tuple[NodeShape, ...],
    partitions: tuple[PartitionShape, ...],
    gres: str,
    exclude: Iterable[str] = (),
) -> tuple[str, ...]:
    """The partitions holding node ``node_name`` in which the submit hook asks for the
    count-only GRES ``gres`` (:func:`gres_units_per_partition` knows a count for them), but
    those in ``exclude`` (``ExcludePartitions``)."""
    units = gres_units_per_partition(nodes, partitions, gres)
    skip = set(exclude)
    # A partition with a known count has a readable host list (ALL: every node).
    return tuple(
        p.name
        for p in partitions
        if p.name not in skip
        and units.get(p.name) is not None
        and (p.nodes.upper() == "ALL" or node_name in expand_hostlist(p.nodes))
    )


def gres_gpus(gres: str) -> int:
    """GPUs in a node's ``Gres=`` value (``gpu:a100:4,gpu:v100:2(S:0-1),shard:8`` is 6)."""
    return _gres_counts(gres).get("gpu", 0)


def _gres_counts(gres: str) -> dict[str, int]:
    """Count per GRES name in a node's ``Gres=`` value, types summed
    (``gpu:a100:4,gpu:v100:2(S:0-1),shard:8`` is ``{"gpu": 6, "shard": 8}``). ValueError for
    a GPU count that cannot be read; another GRES whose count cannot be read is left out."""
    counts: dict[str, int] = {}
    for item in gres.split(","):
        item = item.strip()
        paren = item.find("(")
        if paren >= 0:
            item = item[:paren]
        fields = item.split(":")
        if fields[0] == "gres" and len(fields) > 1:
            del fields[0]
        name = fields[0]
        if not name:
            continue
        count = 1
        if len(fields) > 1:
            m = _GRES_COUNT.fullmatch(fields[-1])
            if m is not None:
                count = int(m.group(1)) * _GRES_MULT[m.group(2).lower()]
            elif len(fields) > 2 or not fields[-1]:
                if name == "gpu":
                    raise ValueError(f"bad GPU count in Gres={gres!r}")
                continue
        counts[name] = counts.get(name, 0) + count
    return counts


def _node_int(params: dict[str, str], key: str, default: int) -> int:
    value = params.get(key)
    if value is None or value == "":
        return default
    if not value.isdigit() or len(value) > 9:
        raise ValueError(f"bad {key} value {value!r}")
    return int(value)


def _node_shape(params: dict[str, str]) -> NodeShape:
    """Shape of one node line; ``params`` has lower-case keys, DEFAULT values merged."""
    names = params["nodename"]
    given_cpus = _node_int(params, "cpus", 0) or _node_int(params, "procs", 0)
    cores_per_socket = _node_int(params, "corespersocket", 1) or 1
    threads = _node_int(params, "threadspercore", 1) or 1
    # As Slurm: SocketsPerBoard, when given, wins over Sockets (the total).
    boards = _node_int(params, "boards", 1)
    per_board = _node_int(params, "socketsperboard", 0)
    sockets = boards * per_board if per_board else _node_int(params, "sockets", 0)
    if not sockets:
        # With CPUs= and no Sockets, as Slurm's read_config.c: CPUs / (cores x threads)
        # when that divides, else one socket per board.
        per_socket = cores_per_socket * threads
        if given_cpus and given_cpus % per_socket == 0:
            sockets = given_cpus // per_socket
        else:
            sockets = boards if given_cpus else 1
    cpus = given_cpus or sockets * cores_per_socket * threads
    counts = _gres_counts(params["gres"]) if params.get("gres") else {}
    gpus = counts.pop("gpu", 0)
    feature_list = params.get("feature") or params.get("features") or ""
    features = tuple(dict.fromkeys(f.strip() for f in feature_list.split(",") if f.strip()))
    # slurmctld counts a core as one CPU when the node has no more CPUs than cores
    # (node_conf.c: tpc), else as ThreadsPerCore CPUs.
    cpus_per_core = 1 if sockets * cores_per_socket >= cpus else threads
    restricted = _node_int(params, "restrictedcorespergpu", 0) * cpus_per_core
    return NodeShape(
        names,
        cpus,
        gpus,
        count_hostlist(names),
        features,
        tuple(sorted(counts.items())),
        restricted,
    )


def _read_slurm_file(
    path: Path,
    base_dir: Path,
    nodes: list[NodeShape],
    defaults: dict[str, str],
    stack: tuple[Path, ...],
    partitions: list[PartitionShape] | None = None,
    read: list[tuple[Path, int | None]] | None = None,
) -> None:
    if read is not None:
        read.append((path, mtime_ns(path)))  # before reading: an edit meanwhile is seen
    if len(stack) > _MAX_INCLUDE_DEPTH:
        raise ConfigError(str(path), None, "Include nested too deeply")
    try:
        resolved = path.resolve()
    except RuntimeError as exc:  # a symlink loop (Python 3.11)
        raise ConfigError(str(path), None, str(exc)) from None
    if resolved in stack:
        raise ConfigError(str(path), None, "Include loop")
    stack = (*stack, resolved)
    source = str(path)
    for lineno, line in logical_lines(read_text(path), source):
        include = _INCLUDE_LINE.fullmatch(line)
        if include is not None:
            targets = _include_targets(include.group(1).strip(), base_dir, source, lineno, read)
            for included in targets:
                _read_slurm_file(included, base_dir, nodes, defaults, stack, partitions, read)
            continue
        if partitions is not None and _PARTITIONNAME_LINE.match(line) is not None:
            _read_partition(line, source, lineno, partitions)
            continue
        if _NODENAME_LINE.match(line) is None:
            continue
        params = {key.lower(): value for key, value in tokenize(line, source, lineno)}
        name = params.get("nodename", "")
        if not name:
            raise ConfigError(source, lineno, "NodeName without a value")
        if name.upper() == "DEFAULT":
            del params["nodename"]
            defaults.update(params)
            continue
        try:
            nodes.append(_node_shape({**defaults, **params}))
        except ValueError as exc:
            raise ConfigError(source, lineno, f"NodeName={name}: {exc}") from None


_SLURM_TRUE = frozenset({"yes", "up", "true", "1"})
"""What Slurm's slurm.conf parser takes for a true boolean (case-insensitive)."""


def _read_partition(line: str, source: str, lineno: int, partitions: list[PartitionShape]) -> None:
    params = {key.lower(): value for key, value in tokenize(line, source, lineno)}
    name = params.get("partitionname", "")
    if not name:
        raise ConfigError(source, lineno, "PartitionName without a value")
    # PartitionName=DEFAULT is kept as a pseudo-partition that read_slurm_conf folds into
    # the later lines (its values are theirs unless they set their own, as in Slurm).
    partitions.append(
        PartitionShape(name, params.get("nodes", ""), _default(params), _def_cpu_per_gpu(params))
    )


def _def_cpu_per_gpu(params: dict[str, str]) -> int | None:
    """``DefCpuPerGPU=``, or None when unset or not a whole number (slurmctld refuses such a
    line itself; the readers of node shapes do not stop on it)."""
    value = params.get("defcpupergpu", "")
    return int(value) if value.isascii() and value.isdigit() else None


def _default(params: dict[str, str]) -> bool | None:
    """``Default=``: True, False, or None when the line does not set it."""
    value = params.get("default")
    return None if value is None else value.lower() in _SLURM_TRUE


def _fold_partition_defaults(lines: list[PartitionShape]) -> tuple[PartitionShape, ...]:
    """The partitions of ``lines`` with ``PartitionName=DEFAULT`` values filled in, and
    ``default`` True only for the last partition that says so (Slurm takes the last)."""
    nodes, default, cpg = "", None, None
    out: list[PartitionShape] = []
    for p in lines:
        if p.name.upper() == "DEFAULT":
            nodes = p.nodes or nodes
            default = p.default if p.default is not None else default
            cpg = p.def_cpu_per_gpu if p.def_cpu_per_gpu is not None else cpg
            continue
        out.append(
            PartitionShape(
                p.name,
                p.nodes or nodes,
                bool(p.default if p.default is not None else default),
                p.def_cpu_per_gpu if p.def_cpu_per_gpu is not None else cpg,
            )
        )
    last = max((i for i, p in enumerate(out) if p.default), default=-1)
    return tuple(replace(p, default=(i == last)) for i, p in enumerate(out))


def _include_targets(
    spec: str,
    base_dir: Path,
    source: str,
    lineno: int,
    read: list[tuple[Path, int | None]] | None = None,
) -> list[Path]:
    """The files an ``Include`` line names. ``read`` also gets a glob's last folder without
    wildcards (a file or folder added there changes its mtime) and a missing file (its
    creation is a change), each with its mtime before the glob is expanded."""
    if len(spec) >= 2 and spec[0] == '"' and spec[-1] == '"':
        spec = spec[1:-1]
    target = Path(spec)
    if not target.is_absolute():
        target = base_dir / target
    if glob.has_magic(str(target)):
        if read is not None:
            folder = target.parent
            while glob.has_magic(str(folder)):
                folder = folder.parent
            read.append((folder, mtime_ns(folder)))
        return [Path(p) for p in sorted(glob.glob(str(target)))]
    if not target.is_file():
        if read is not None:
            read.append((target, mtime_ns(target)))
        raise ConfigError(source, lineno, f"Include {spec}: no such file")
    return [target]


def read_slurm_nodes(path: Path) -> tuple[NodeShape, ...]:
    """Node shapes from the ``NodeName=`` lines of slurm.conf at ``path``.

    ``NodeName=DEFAULT`` lines are not nodes: their values become defaults for later lines
    (as in Slurm).  ``Include FILE`` lines are followed (relative paths and globs relative
    to ``path``'s directory).  Other lines are ignored.  Raises :class:`ConfigError`.
    """
    nodes: list[NodeShape] = []
    _read_slurm_file(path, path.parent, nodes, {}, ())
    return tuple(nodes)


def read_slurm_conf(
    path: Path, read: list[tuple[Path, int | None]] | None = None
) -> tuple[tuple[NodeShape, ...], tuple[PartitionShape, ...]]:
    """The ``NodeName=`` lines (as :func:`read_slurm_nodes`) and the ``PartitionName=``
    lines of slurm.conf at ``path`` (``PartitionName=DEFAULT`` values filled in, not a
    partition itself).  ``read`` gets every path whose change could change the result,
    each with its mtime (:func:`mtime_ns`) taken before it was read: every file read (``path`` and
    what it includes), a missing included file and every folder an ``Include`` glob looked
    in, also when it raises.  Raises :class:`ConfigError`."""
    nodes: list[NodeShape] = []
    partitions: list[PartitionShape] = []
    _read_slurm_file(path, path.parent, nodes, {}, (), partitions, read)
    return tuple(nodes), _fold_partition_defaults(partitions)


_NESTED_LINES = frozenset({"nodename", "nodeset", "partitionname", "downnodes", "frontendname"})
"""slurm.conf lines whose other pairs belong to the line's object, not to slurm.conf."""


def _top_level_pairs(path: Path) -> Iterator[tuple[str, str]]:
    """Every top-level ``Key=Value`` pair of slurm.conf at ``path`` in file order, the key
    in lower case; ``Include`` lines are followed as by :func:`read_slurm_conf`.  Raises
    :class:`ConfigError`."""

    def read(file: Path, stack: tuple[Path, ...]) -> Iterator[tuple[str, str]]:
        if len(stack) > _MAX_INCLUDE_DEPTH:
            raise ConfigError(str(file), None, "Include nested too deeply")
        resolved = file.resolve()
        if resolved in stack:
            raise ConfigError(str(file), None, "Include loop")
        source = str(file)
        for lineno, line in logical_lines(read_text(file), source):
            include = _INCLUDE_LINE.fullmatch(line)
            if include is not None:
                for target in _include_targets(
                    include.group(1).strip(), path.parent, source, lineno
                ):
                    yield from read(target, (*stack, resolved))
                continue
            pairs = tokenize(line, source, lineno)
            if pairs[0][0].lower() in _NESTED_LINES:
                continue
            yield from ((k.lower(), v) for k, v in pairs)

    return read(path, ())


def read_slurm_keys(path: Path, names: Iterable[str]) -> dict[str, str]:
    """The values of the top-level keys ``names`` in slurm.conf at ``path``, by lower-case
    name (the last one given wins, as in Slurm); ``Include`` lines are followed as by
    :func:`read_slurm_conf`.  Raises :class:`ConfigError`."""
    wanted = {n.lower() for n in names}
    return {k: v for k, v in _top_level_pairs(path) if k in wanted}


def slurmctld_host_names(values: Iterable[tuple[str, str]]) -> tuple[str, ...]:
    """The controllers' names, primary first, from slurm.conf's top-level pairs (lower-case
    keys): each ``SlurmctldHost=NAME(ADDR)`` in order, else the older ``ControlMachine``
    and ``BackupController``; pure."""
    pairs = list(values)
    hosts = [v.split("(", 1)[0].strip() for k, v in pairs if k == "slurmctldhost"]
    if not hosts:
        old = dict(pairs)
        hosts = [old.get("controlmachine", ""), old.get("backupcontroller", "")]
    return tuple(dict.fromkeys(h for h in hosts if h))


def read_slurmctld_hosts(path: Path) -> tuple[str, ...]:
    """The names slurm.conf at ``path`` gives its controllers, primary first (slurmctld is
    the one whose host name, short or long, is listed: ``_controller_index`` in Slurm's
    src/slurmctld/controller.c).  Raises :class:`ConfigError`."""
    wanted = {"slurmctldhost", "controlmachine", "backupcontroller"}
    return slurmctld_host_names([(k, v) for k, v in _top_level_pairs(path) if k in wanted])
