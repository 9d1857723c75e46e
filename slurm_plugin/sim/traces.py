"""Job traces for the what-if simulator: public cluster traces, a site's own sacct export, and
a reproducible synthetic generator.

A :class:`Trace` is columnar (one numpy array per field, job index = position) so that a
million jobs load and simulate without a million Python objects. Every loader sorts jobs by
submit time (stable), shifts submit times so the first is 0, validates the result and writes
every derivation it made into ``Trace.notes`` with counts, so a reader of the results can see
what the data really said.

Sources (``slurm_plugin/sim/data/README.md`` says where each file comes from and under
which licence)::

    load_alibaba   alibaba/clusterdata  cluster-trace-gpu-v2023/csv/openb_pod_list_*.csv
    load_philly    petuum/adaptdl (osdi21-artifact)  simulator/traces/philly.csv
    load_muri      Rivendile/Muri  cluster_exp/trace-data/cluster_trace.csv
    load_sacct     the site's own accounting, exported with (one line):

        sacct -a -P -X --starttime=2024-03-01 --endtime=2024-04-01
              --format=JobID,JobName,User,Partition,Submit,Start,End,State,NNodes,AllocTRES,ReqTRES

``-P`` makes the output ``|``-separated with a header line, ``-X`` leaves out job steps,
``-a`` includes every user. Older exports with ``AllocCPUS``/``ReqCPUS`` (and the GPUs in
``AllocGRES``/``ReqGRES``) instead of the TRES columns are accepted too.

``load_trace(spec)`` turns the CLI's ``--trace`` argument into a Trace::

    alibaba[:PODS.csv]  philly[:CSV]  muri[:CSV]  sacct:FILE
    synthetic:N_JOBS[,gpus=10000][,seed=1][,load=0.9]

The bare names look in the folders of :func:`trace_dirs`, first to last: ``$CODA_TRACE_DIR``
when set (an admin's own copy), else the user's trace folder
(``$XDG_DATA_HOME/coda-slurm/traces``, by default ``~/.local/share/coda-slurm/traces``) and
the ``shared/data`` folder beside a source checkout when there is one; then the traces
shipped in the package (``slurm_plugin/sim/data``: Philly-derived and Muri, both
Apache-2.0). The Alibaba trace is not shipped (its terms allow use for research or study and
say nothing of redistribution): :func:`load_trace` says where to get it and where to put it.
"""

from __future__ import annotations

import csv
import gzip
import math
import os
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np

from coda_common.signature import UNNAMED
from slurm_plugin.decision.tres import TresError, gpu_count, gpu_types

__all__ = [
    "MAX_SIM_NODES",
    "SACCT_COMMAND",
    "NodeSpec",
    "Trace",
    "TraceError",
    "alibaba_instructions",
    "load_alibaba",
    "load_muri",
    "load_philly",
    "load_sacct",
    "load_trace",
    "muri_stage_times",
    "synthetic",
    "trace_dirs",
    "trace_file",
    "uniform_nodes",
]

SACCT_COMMAND = (
    "sacct -a -P -X --starttime=<date> --endtime=<date> "
    "--format=JobID,JobName,User,Partition,Submit,Start,End,State,NNodes,AllocTRES,ReqTRES"
)
"""The export ``load_sacct`` reads (``<date>`` like ``2024-03-01``)."""

ALIBABA_PODS = Path("alibaba-gpu-v2023") / "openb_pod_list_default.csv"
ALIBABA_NODES_NAME = "openb_node_list_gpu_node.csv"
PHILLY_CSV = Path("philly-pollux") / "philly.csv"
MURI_CSV = Path("muri") / "cluster_trace.csv"

PACKAGED_TRACES = Path(__file__).resolve().parent / "data"
"""The traces shipped with the package, each with its licence (data/README.md)."""

# alibaba/clusterdata at the commit that added cluster-trace-gpu-v2023 (the files have not
# changed since; sha256 in data/README.md).
_ALIBABA_RAW = (
    "https://raw.githubusercontent.com/alibaba/clusterdata/"
    "50a91c7c74abe3b658188dc78ac1dd302970d40c/cluster-trace-gpu-v2023/csv/"
)

_ALIBABA_SOURCE = (
    "alibaba/clusterdata, cluster-trace-gpu-v2023/csv/{file} (Weng et al., 'Beware of "
    "Fragmentation', USENIX ATC'23); licence: see that repository (the related v2020 trace is "
    "CC BY 4.0)"
)
_PHILLY_SOURCE = (
    "petuum/adaptdl, branch osdi21-artifact, simulator/traces/philly.csv (Pollux, OSDI'21; "
    "derived from Microsoft's Philly trace, Jeon et al., USENIX ATC'19); Apache-2.0"
)
_MURI_SOURCE = (
    "Rivendile/Muri, cluster_exp/trace-data/cluster_trace.csv (Zhao et al., 'Multi-resource "
    "interleaving for deep learning training', SIGCOMM'22); Apache-2.0"
)


class TraceError(ValueError):
    """A trace that cannot be read or is inconsistent.

    The message starts with ``FILE:LINE:`` (or just ``FILE:``) where that applies, then the
    column, then what was found and what was expected.
    """

    def __init__(
        self,
        message: str,
        *,
        path: Path | str | None = None,
        line: int | None = None,
        column: str | None = None,
    ) -> None:
        self.path = None if path is None else Path(path)
        self.line = line
        self.column = column
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        elif line is not None:
            where = f"line {line}: "
        col = f"column {column!r}: " if column is not None else ""
        super().__init__(where + col + message)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node of a cluster inventory."""

    name: str
    cores: int
    gpus: int
    gpu_model: str | None
    """GPU type such as ``"V100M32"``; None when unknown (or the node has no GPUs)."""


MAX_SIM_NODES = 200_000
"""The most nodes a simulated cluster has (the largest sized cluster of a shipped trace,
Philly at --load 0.01 on 1:1 nodes, has about 41,000)."""


def uniform_nodes(
    n_nodes: int, cores: int, gpus: int, gpu_model: str | None = None
) -> list[NodeSpec]:
    """``n_nodes`` identical nodes named ``node0000``, ``node0001`` ..."""
    if not 1 <= n_nodes <= MAX_SIM_NODES:
        raise ValueError(f"n_nodes must be 1 to {MAX_SIM_NODES:,}, got {n_nodes:,}")
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    if gpus < 0:
        raise ValueError(f"gpus must be >= 0, got {gpus}")
    width = max(4, len(str(n_nodes - 1)))
    return [NodeSpec(f"node{i:0{width}d}", cores, gpus, gpu_model) for i in range(n_nodes)]


_DTYPES: dict[str, type[np.generic]] = {
    "submit_s": np.float64,
    "duration_s": np.float64,
    "gpus": np.int32,
    "cpus": np.int32,
    "nodes": np.int32,
    "workload": np.int32,
    "gpu_model": np.int16,
}


@dataclass(slots=True, eq=False)
class Trace:
    """Jobs as parallel arrays, sorted by submit time; job index = position."""

    name: str
    """``"alibaba-gpu-v2023"``, ``"philly"``, ``"muri"``, ``"sacct:<file>"``, ``"synthetic"``."""
    submit_s: np.ndarray
    """float64, seconds from the first submission (min 0), ascending."""
    duration_s: np.ndarray
    """float64 > 0, run time as recorded in the trace."""
    gpus: np.ndarray
    """int32 >= 0, GPUs of the whole job (0 = CPU-only job)."""
    cpus: np.ndarray
    """int32, cores of the whole job as requested; -1 = the trace does not say."""
    nodes: np.ndarray
    """int32 >= 1, nodes the job asked for (1 unless the trace says otherwise)."""
    workload: np.ndarray
    """int32 index into ``workload_names``; -1 = unknown."""
    workload_names: list[str]
    gpu_model: np.ndarray
    """int16 index into ``gpu_model_names``; -1 = any GPU type."""
    gpu_model_names: list[str]
    """Model constraints as the trace wrote them; ``"A|B"`` means either type will do."""
    node_specs: list[NodeSpec] | None
    """The trace's own node inventory; None when it has none."""
    source: str
    """Citation: origin repository/path and licence, one line."""
    notes: list[str]
    """Every derivation or assumption the loader made, in plain words, with counts."""

    def __len__(self) -> int:
        return len(self.submit_s)

    def validate(self) -> None:
        """Raise TraceError unless the arrays are consistent (see the field docs)."""
        where = f"trace {self.name!r}"
        n = len(self.submit_s) if isinstance(self.submit_s, np.ndarray) else -1
        for field_name, dtype in _DTYPES.items():
            arr = getattr(self, field_name)
            if not isinstance(arr, np.ndarray) or arr.ndim != 1:
                raise TraceError(f"{where}: {field_name} must be a 1-D numpy array")
            if arr.dtype != dtype:
                raise TraceError(
                    f"{where}: {field_name} has dtype {arr.dtype}, expected {np.dtype(dtype)}"
                )
            if len(arr) != n:
                raise TraceError(
                    f"{where}: {field_name} has {len(arr):,} entries, submit_s has {n:,}"
                )
        if n == 0:
            return
        self._validate_values(where)

    def _validate_values(self, where: str) -> None:
        """:meth:`validate` of a trace with jobs whose arrays are consistent: each value."""

        def first(mask: np.ndarray, what: str, arr: np.ndarray) -> None:
            _first_bad(where, mask, what, arr)

        submit, duration = self.submit_s, self.duration_s
        first(~np.isfinite(submit), "submit_s must be finite", submit)
        if submit[0] != 0.0:
            raise TraceError(f"{where}: the first submit_s must be 0, got {submit[0]!r}")
        bad_order = np.flatnonzero(np.diff(submit) < 0)
        if bad_order.size:
            i = int(bad_order[0]) + 1
            raise TraceError(
                f"{where}: job {i}: submit_s {submit[i]!r} is before job {i - 1}'s "
                f"{submit[i - 1]!r}; jobs must be sorted by submit time"
            )
        first(~(np.isfinite(duration) & (duration > 0)), "duration_s must be > 0", duration)
        first(self.gpus < 0, "gpus must be >= 0", self.gpus)
        first((self.cpus < 1) & (self.cpus != -1), "cpus must be >= 1 or -1", self.cpus)
        first(self.nodes < 1, "nodes must be >= 1", self.nodes)
        n_workloads = len(self.workload_names)
        first(
            (self.workload < -1) | (self.workload >= n_workloads),
            f"workload must be -1 or an index below {n_workloads}",
            self.workload,
        )
        n_models = len(self.gpu_model_names)
        first(
            (self.gpu_model < -1) | (self.gpu_model >= n_models),
            f"gpu_model must be -1 or an index below {n_models}",
            self.gpu_model,
        )
        if self.node_specs is not None:
            for k, node in enumerate(self.node_specs):
                if node.cores < 1 or node.gpus < 0:
                    raise TraceError(
                        f"{where}: node {k} ({node.name}): cores must be >= 1 and gpus >= 0, "
                        f"got cores={node.cores} gpus={node.gpus}"
                    )

    def head(self, n: int) -> Trace:
        """The first ``n`` jobs (all of them when ``n >= len(self)``), for quick runs."""
        if n < 0:
            raise ValueError(f"head: n must be >= 0, got {n}")
        total = len(self)
        n = min(n, total)
        notes = list(self.notes)
        if n < total:
            notes.append(f"first {n:,} of {total:,} jobs kept (head)")
        return Trace(
            name=self.name,
            submit_s=self.submit_s[:n].copy(),
            duration_s=self.duration_s[:n].copy(),
            gpus=self.gpus[:n].copy(),
            cpus=self.cpus[:n].copy(),
            nodes=self.nodes[:n].copy(),
            workload=self.workload[:n].copy(),
            workload_names=list(self.workload_names),
            gpu_model=self.gpu_model[:n].copy(),
            gpu_model_names=list(self.gpu_model_names),
            node_specs=None if self.node_specs is None else list(self.node_specs),
            source=self.source,
            notes=notes,
        )

    def summary(self) -> dict[str, object]:
        """Plain-Python figures about the trace (JSON-serialisable)."""
        n = len(self)
        gpu = self.gpus > 0
        gpu_s = float(np.sum(self.gpus.astype(np.float64) * self.duration_s))
        span_s = float(self.submit_s[-1]) if n else 0.0
        known = gpu & (self.cpus > 0)
        sizes, counts = np.unique(self.gpus[gpu], return_counts=True)
        out: dict[str, object] = {
            "name": self.name,
            "jobs": n,
            "gpu_jobs": int(np.count_nonzero(gpu)),
            "cpu_jobs": int(n - np.count_nonzero(gpu)),
            "gpu_hours": gpu_s / 3600.0,
            "span_s": span_s,
            "last_end_s": float(np.max(self.submit_s + self.duration_s)) if n else 0.0,
            "median_duration_s": float(np.median(self.duration_s)) if n else None,
            "gpu_size_mix": {int(s): int(c) for s, c in zip(sizes, counts, strict=True)},
            "multi_node_jobs": int(np.count_nonzero(self.nodes > 1)),
            "jobs_with_cpus": int(np.count_nonzero(self.cpus > 0)),
            "median_cpus_per_gpu": (
                float(np.median(self.cpus[known] / self.gpus[known])) if known.any() else None
            ),
            "workloads": len(self.workload_names),
            "jobs_with_workload": int(np.count_nonzero(self.workload >= 0)),
            "jobs_with_gpu_model": int(np.count_nonzero(self.gpu_model >= 0)),
        }
        if self.node_specs is not None:
            inv_gpus = sum(node.gpus for node in self.node_specs)
            out["inventory_nodes"] = len(self.node_specs)
            out["inventory_gpus"] = inv_gpus
            out["inventory_cores"] = sum(node.cores for node in self.node_specs)
            out["offered_gpu_load"] = gpu_s / (inv_gpus * span_s) if inv_gpus and span_s else None
        return out


# --------------------------------------------------------------------------- reading helpers


@dataclass(slots=True)
class _Table:
    """A delimited text file with a header: columns of strings and each row's line number."""

    path: Path
    header: list[str]
    columns: dict[str, list[str]]
    lines: list[int]

    def __len__(self) -> int:
        return len(self.lines)

    def error(self, row: int, column: str | None, message: str) -> TraceError:
        return TraceError(message, path=self.path, line=self.lines[row], column=column)


def _first_bad(where: str, mask: np.ndarray, what: str, arr: np.ndarray) -> None:
    """Raise TraceError naming the first job where ``mask`` is true, if any."""
    bad = np.flatnonzero(mask)
    if bad.size:
        i = int(bad[0])
        raise TraceError(f"{where}: job {i}: {what} (got {arr[i]!r}; {bad.size:,} jobs like this)")


def _read_table(
    path: Path,
    what: str,
    *,
    delimiter: str = ",",
    lenient_text: bool = False,
    free_text: str | None = None,
) -> _Table:
    """Read ``path``; ``what`` says in errors which kind of file was expected.

    ``free_text`` names the one column whose values may hold the delimiter and line breaks
    unquoted (sacct's ``JobName``: a user's text, printed as is by ``sacct -P``).  A record
    with too few fields continues on the next line; the surplus fields of a record with too
    many are that column's.
    """
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"no such file (expected {what})", path=path)
    quoting = csv.QUOTE_NONE if delimiter == "|" else csv.QUOTE_MINIMAL
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(
            path,
            "rt",
            newline="",
            encoding="utf-8-sig",
            errors="replace" if lenient_text else None,
        ) as f:
            reader = csv.reader(f, delimiter=delimiter, quoting=quoting)
            header, rows, lines = _read_rows(reader, path, what, delimiter, free_text)
    except UnicodeDecodeError as e:
        raise TraceError(
            f"not UTF-8 text ({e.reason} at byte {e.start}); expected {what}", path=path
        ) from None
    except csv.Error as e:
        raise TraceError(f"not a readable {what}: {e}", path=path) from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise TraceError(f"not a readable gzip file ({e}); expected {what}", path=path) from None
    except OSError as e:
        raise TraceError(f"cannot read ({e.strerror or e}); expected {what}", path=path) from None
    dupes = sorted(h for h, c in Counter(header).items() if c > 1)
    if dupes:
        raise TraceError(f"header repeats column(s) {', '.join(dupes)}", path=path, line=1)
    if rows:
        columns = {h: list(col) for h, col in zip(header, zip(*rows, strict=True), strict=True)}
    else:
        columns = {h: [] for h in header}
    return _Table(path, header, columns, lines)


class _CsvReader(Protocol):
    """What :func:`csv.reader` gives: rows, and the line the last one ended on."""

    line_num: int

    def __iter__(self) -> Iterator[list[str]]: ...

    def __next__(self) -> list[str]: ...


def _read_rows(
    reader: _CsvReader,
    path: Path,
    what: str,
    delimiter: str,
    free_text: str | None,
) -> tuple[list[str], list[list[str]], list[int]]:
    """:func:`_read_table`'s header, records and the line each record starts on."""
    rows: list[list[str]] = []
    lines: list[int] = []
    header = next(reader, None)
    if header is None or not any(h.strip() for h in header):
        raise TraceError(
            f"empty file or blank first line; expected a header ({what})", path=path, line=1
        )
    header = [h.strip() for h in header]
    # `sacct -p` (not -P) ends every line with the delimiter: an empty last field.
    trailing = len(header) > 1 and header[-1] == ""
    if trailing:
        header.pop()
    width = len(header)
    free = header.index(free_text) if free_text in header else None
    for row in reader:
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        first_line = reader.line_num
        if free is not None:
            row = _join_free_text(row, reader, width + trailing, free, delimiter)
        if trailing and len(row) == width + 1 and row[-1] == "":
            row.pop()
        if len(row) != width:
            raise TraceError(
                f"{len(row)} fields, expected {width} like the header ({delimiter.join(header)})",
                path=path,
                line=first_line,
            )
        rows.append(row)
        lines.append(first_line)
    return header, rows, lines


def _join_free_text(
    row: list[str], reader: Iterator[list[str]], width: int, free: int, delimiter: str
) -> list[str]:
    """``row`` with the line breaks and delimiters inside column ``free`` put back: lines are
    joined while the record has fewer than ``width`` fields (a break can only be inside the
    free text), then surplus fields are joined into the free text."""
    while len(row) < width and len(row) > free:
        more = next(reader, None)
        if more is None:
            break
        row = [*row[:-1], row[-1] + "\n" + (more[0] if more else ""), *more[1:]]
    surplus = len(row) - width
    if surplus > 0:
        row = [
            *row[:free],
            delimiter.join(row[free : free + surplus + 1]),
            *row[free + surplus + 1 :],
        ]
    return row


def _require(table: _Table, needed: Sequence[str], what: str) -> None:
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise TraceError(
            f"missing column(s) {', '.join(missing)}; a {what} needs {', '.join(needed)} "
            f"(the header has {', '.join(table.header)})",
            path=table.path,
            line=1,
        )


def _numbers(table: _Table, column: str, expected: str, *, allow_empty: bool = False) -> np.ndarray:
    """Column as float64; empty cells become NaN when ``allow_empty``."""
    values = table.columns[column]
    empty: np.ndarray | None = None
    if allow_empty:
        empty = np.fromiter((not v.strip() for v in values), dtype=bool, count=len(values))
        if empty.any():
            values = ["nan" if e else v for v, e in zip(values, empty, strict=True)]
    try:
        arr = np.array(values, dtype=np.float64)
    except ValueError:
        for i, v in enumerate(values):
            try:
                np.array([v], dtype=np.float64)
            except ValueError:
                raise table.error(
                    i, column, f"{v!r} is not a number; expected {expected}"
                ) from None
        raise  # numpy rejected the column but no single cell: report numpy's own message
    bad_mask = ~np.isfinite(arr)
    if empty is not None:
        bad_mask &= ~empty
    bad = np.flatnonzero(bad_mask)
    if bad.size:
        i = int(bad[0])
        raise table.error(i, column, f"{values[i]!r} is not a finite number; expected {expected}")
    return arr


_MAX_JOB_COUNT = 2**31 - 1
"""The most cores, GPUs or nodes one job of a trace may hold (the trace's arrays are int32)."""


def _integers(
    table: _Table, column: str, expected: str, *, minimum: int | None = None
) -> np.ndarray:
    """Column as int64 (whole numbers only, ``>= minimum`` when given, at most
    :data:`_MAX_JOB_COUNT` either side of 0)."""
    arr = _numbers(table, column, expected)
    bad = np.flatnonzero(arr != np.floor(arr))
    if minimum is not None:
        bad = np.union1d(bad, np.flatnonzero(arr < minimum))
    if bad.size:
        i = int(bad[0])
        raise table.error(i, column, f"{table.columns[column][i]!r}; expected {expected}")
    huge = np.flatnonzero(np.abs(arr) > _MAX_JOB_COUNT)
    if huge.size:
        i = int(huge[0])
        raise table.error(
            i,
            column,
            f"{table.columns[column][i][:40]!r}; expected {expected}, at most {_MAX_JOB_COUNT:,}",
        )
    return arr.astype(np.int64)


def _index_labels(labels: Sequence[str | None]) -> tuple[np.ndarray, list[str]]:
    """Labels → (int32 index into sorted distinct names, names); None or "" → -1."""
    ids: dict[str, int] = {}
    raw = np.empty(len(labels), dtype=np.int64)
    for i, label in enumerate(labels):
        raw[i] = -1 if not label else ids.setdefault(label, len(ids))
    names = sorted(ids)
    remap = np.empty(len(ids) + 1, dtype=np.int64)
    remap[-1] = -1  # raw -1 indexes the last slot
    for new, name in enumerate(names):
        remap[ids[name]] = new
    return remap[raw].astype(np.int32), names


def _finish(
    *,
    name: str,
    path: Path | None,
    submit_s: np.ndarray,
    duration_s: np.ndarray,
    gpus: np.ndarray,
    cpus: np.ndarray,
    nodes: np.ndarray,
    workload: np.ndarray,
    workload_names: list[str],
    gpu_model: np.ndarray,
    gpu_model_names: list[str],
    node_specs: list[NodeSpec] | None,
    source: str,
    notes: list[str],
) -> Trace:
    """Sort by submit time (stable), shift to start at 0, validate."""
    if len(submit_s) == 0:
        raise TraceError(
            "no jobs left after filtering: " + "; ".join(notes) if notes else "no jobs",
            path=path,
        )
    order = np.argsort(submit_s, kind="stable")
    if np.any(order != np.arange(len(order))):
        notes.append("jobs were not in submit order in the file: sorted by submit time (stable)")
    submit = submit_s[order].astype(np.float64)
    trace = Trace(
        name=name,
        submit_s=submit - submit[0],
        duration_s=duration_s[order].astype(np.float64),
        gpus=gpus[order].astype(np.int32),
        cpus=cpus[order].astype(np.int32),
        nodes=nodes[order].astype(np.int32),
        workload=workload[order].astype(np.int32),
        workload_names=workload_names,
        gpu_model=gpu_model[order].astype(np.int16),
        gpu_model_names=gpu_model_names,
        node_specs=node_specs,
        source=source,
        notes=notes,
    )
    trace.validate()
    return trace


def _count(n: int | np.integer, one: str, many: str | None = None) -> str:
    return f"{int(n):,} {one if n == 1 else (many or one + 's')}"


# --------------------------------------------------------------------------------- Alibaba


_ALIBABA_TIMES = ("creation_time", "scheduled_time", "deletion_time")


def _load_alibaba_nodes(path: Path) -> list[NodeSpec]:
    what = "Alibaba node list (sn,cpu_milli,memory_mib,gpu,model)"
    table = _read_table(path, what)
    _require(table, ("sn", "cpu_milli", "gpu", "model"), "node list")
    cpu_milli = _integers(
        table, "cpu_milli", "CPU capacity in milli-cores, e.g. 96000", minimum=1000
    )
    gpus = _integers(table, "gpu", "a whole number of GPUs >= 0", minimum=0)
    specs = []
    for i, (sn, model) in enumerate(zip(table.columns["sn"], table.columns["model"], strict=True)):
        model = model.strip()
        if not sn.strip():
            raise table.error(i, "sn", "empty node name; expected e.g. openb-node-0227")
        specs.append(
            NodeSpec(
                name=sn.strip(),
                cores=int(cpu_milli[i] // 1000),
                gpus=int(gpus[i]),
                gpu_model=None if model.lower() in ("", "nan", "none") else model,
            )
        )
    if not specs:
        raise TraceError(f"no nodes in the file; expected a {what}", path=path)
    return specs


def load_alibaba(pods_csv: Path, nodes_csv: Path | None = None) -> Trace:
    """Alibaba GPU v2023 pods (``openb_pod_list_default.csv`` style) as a Trace.

    submit = ``creation_time``; duration = ``deletion_time - scheduled_time`` (queueing in
    Alibaba's cluster is not part of the run); gpus = ``num_gpu`` with a shared GPU
    (``gpu_milli < 1000``) counted as one whole GPU; cpus = ``ceil(cpu_milli / 1000)``, at
    least 1; ``gpu_spec`` (``V100M16|V100M32``) kept whole as the model name. The node
    inventory comes from ``nodes_csv``, else ``openb_node_list_gpu_node.csv`` next to the pods
    file when there is one.
    """
    pods_csv = Path(pods_csv)
    table = _read_alibaba_pods(pods_csv)
    n_rows = len(table)
    cpu_milli = _integers(table, "cpu_milli", "requested milli-cores >= 0, e.g. 12000", minimum=0)
    num_gpu = _integers(table, "num_gpu", "a whole number of GPUs >= 0", minimum=0)
    gpu_milli = _integers(table, "gpu_milli", "milli-GPUs >= 0, e.g. 1000 or 460", minimum=0)
    creation = _numbers(table, "creation_time", "a time in seconds")
    scheduled = _numbers(
        table, "scheduled_time", "a time in seconds, or empty if never scheduled", allow_empty=True
    )
    deletion = _numbers(table, "deletion_time", "a time in seconds")
    has_spec = "gpu_spec" in table.columns
    spec = [s.strip() for s in table.columns["gpu_spec"]] if has_spec else [""] * n_rows

    duration = deletion - scheduled
    keep, notes = _alibaba_runs(table, creation, scheduled, deletion, duration)
    notes += _alibaba_request_notes(keep, cpu_milli, num_gpu, gpu_milli)
    cpus = np.maximum((cpu_milli + 999) // 1000, 1)
    spec_kept = [s if k else "" for s, k in zip(spec, keep, strict=True)]
    notes.append(_alibaba_spec_note(has_spec, spec_kept))
    notes.append("pods are single-node (nodes = 1); the trace has no workload names (-1)")
    node_specs = _alibaba_node_specs(pods_csv, nodes_csv, notes)

    model_idx, model_names = _index_labels(spec_kept)
    stem = pods_csv.name
    trace_name = "alibaba-gpu-v2023"
    if stem != ALIBABA_PODS.name:
        trace_name += ":" + pods_csv.stem
    return _finish(
        name=trace_name,
        path=pods_csv,
        submit_s=creation[keep],
        duration_s=duration[keep],
        gpus=num_gpu[keep],
        cpus=cpus[keep],
        nodes=np.ones(int(keep.sum()), dtype=np.int32),
        workload=np.full(int(keep.sum()), -1, dtype=np.int32),
        workload_names=[],
        gpu_model=model_idx[keep],
        gpu_model_names=model_names,
        node_specs=node_specs,
        source=_ALIBABA_SOURCE.format(file=stem),
        notes=notes,
    )


def _alibaba_spec_note(has_spec: bool, spec_kept: list[str]) -> str:
    """What the pods kept ask of GPU types."""
    if not has_spec:
        return "no gpu_spec column: no pod has a GPU type constraint (gpu_model = -1)"
    constrained = sum(1 for s in spec_kept if s)
    return (
        f"{_count(constrained, 'pod')} with a GPU type constraint (gpu_spec, kept whole "
        "as the model name; 'A|B' = either)"
    )


def _read_alibaba_pods(pods_csv: Path) -> _Table:
    """The pod list, with the columns a replay needs; TraceError naming the missing ones."""
    what = "Alibaba pod list (name,cpu_milli,...,creation_time,deletion_time,scheduled_time)"
    table = _read_table(pods_csv, what)
    missing_times = [c for c in _ALIBABA_TIMES if c not in table.columns]
    if missing_times:
        raise TraceError(
            f"the file has no creation/deletion times (missing {', '.join(missing_times)}): a "
            f"replay needs columns {', '.join(_ALIBABA_TIMES)}, as openb_pod_list_default.csv "
            "has; the sampled pod lists without them describe a pod mix, not arrivals",
            path=pods_csv,
            line=1,
        )
    _require(table, ("name", "cpu_milli", "num_gpu", "gpu_milli", *_ALIBABA_TIMES), "pod list")
    return table


def _alibaba_runs(
    table: _Table,
    creation: np.ndarray,
    scheduled: np.ndarray,
    deletion: np.ndarray,
    duration: np.ndarray,
) -> tuple[np.ndarray, list[str]]:
    """``(keep, notes)``: the pods that ran (scheduled, run time > 0), and notes on the
    dropped ones, the queueing left out, the pods alive at the end and the kept phases."""
    n_rows = len(table)
    phase = table.columns.get("pod_phase", [""] * n_rows)
    notes: list[str] = []
    never = np.isnan(scheduled)
    nonpositive = ~never & ~(duration > 0)
    keep = ~never & ~nonpositive
    never_phases = Counter(p for p, k in zip(phase, never, strict=True) if k)
    if never.any():
        phases = ", ".join(f"{p or '(none)'} {c:,}" for p, c in never_phases.most_common())
        notes.append(
            f"{_count(never.sum(), 'pod')} never scheduled (empty scheduled_time; pod_phase "
            f"{phases}) dropped: they did not run"
        )
    if nonpositive.any():
        notes.append(
            f"{_count(nonpositive.sum(), 'pod')} with deletion_time <= scheduled_time "
            "(run time <= 0) dropped"
        )
    queue = scheduled[keep] - creation[keep]
    if queue.size:
        notes.append(
            "duration = deletion_time - scheduled_time: queueing in Alibaba's cluster "
            f"(scheduled - creation: median {np.median(queue):,.0f} s, max {np.max(queue):,.0f} "
            "s) is not part of the run; submit = creation_time"
        )
    last = float(np.max(deletion))
    at_end = int(np.count_nonzero(keep & (deletion == last)))
    if at_end:
        notes.append(
            f"{_count(at_end, 'pod')} still alive at the end of the trace (deletion_time = the "
            f"last timestamp, {last:,.0f} s): their run times are lower bounds"
        )
    kept_phases = Counter(p for p, k in zip(phase, keep, strict=True) if k)
    if "pod_phase" in table.columns:
        notes.append(
            "pod_phase of the kept pods (all replayed, they held their resources): "
            + ", ".join(f"{p} {c:,}" for p, c in kept_phases.most_common())
        )
    return keep, notes


def _alibaba_request_notes(
    keep: np.ndarray, cpu_milli: np.ndarray, num_gpu: np.ndarray, gpu_milli: np.ndarray
) -> list[str]:
    """How the kept pods' fractional GPU and CPU requests are counted."""
    notes: list[str] = []
    shared = keep & (num_gpu > 0) & (gpu_milli < 1000)
    if shared.any():
        notes.append(
            f"{_count(shared.sum(), 'pod')} with gpu_milli < 1000 (GPU sharing) counted as 1 "
            "whole GPU"
        )
    gpu_no_milli = keep & (num_gpu == 0) & (gpu_milli > 0)
    if gpu_no_milli.any():
        notes.append(
            f"{_count(gpu_no_milli.sum(), 'pod')} with num_gpu = 0 but gpu_milli > 0 kept as "
            "CPU-only (num_gpu decides)"
        )
    fractional = keep & (cpu_milli % 1000 != 0)
    if fractional.any():
        notes.append(
            f"{_count(fractional.sum(), 'pod')} ask for a fraction of a core (cpu_milli not a "
            "multiple of 1000, e.g. 3152): rounded up to whole cores"
        )
    zero_cpu = keep & (cpu_milli == 0)
    if zero_cpu.any():
        notes.append(f"{_count(zero_cpu.sum(), 'pod')} with cpu_milli = 0 counted as 1 core")
    return notes


def _alibaba_node_specs(
    pods_csv: Path, nodes_csv: Path | None, notes: list[str]
) -> list[NodeSpec] | None:
    """The node inventory (``nodes_csv``, else the node list next to the pods file, else
    None), said in ``notes``."""
    if nodes_csv is None:
        candidate = pods_csv.parent / ALIBABA_NODES_NAME
        nodes_csv = candidate if candidate.is_file() else None
    if nodes_csv is None:
        notes.append(f"no node inventory ({ALIBABA_NODES_NAME} not next to the pods file)")
        return None
    node_specs = _load_alibaba_nodes(Path(nodes_csv))
    models = Counter(node.gpu_model or "(none)" for node in node_specs)
    notes.append(
        f"node inventory from {Path(nodes_csv).name}: {_count(len(node_specs), 'node')}, "
        f"{sum(n.gpus for n in node_specs):,} GPUs, {sum(n.cores for n in node_specs):,} "
        "cores (cpu_milli // 1000); models "
        + ", ".join(f"{m} {c:,}" for m, c in models.most_common())
    )
    return node_specs


# ---------------------------------------------------------------------------------- Philly


def _philly_times(table: _Table, stamps: list[str]) -> np.ndarray:
    """``2017-10-09 07:01:55`` strings → datetime64[s]; TraceError names the first bad row."""
    try:
        times = np.array(stamps, dtype="datetime64[s]")
    except ValueError:
        times = None
    if times is not None and not np.isnat(times).any():
        return times
    for i, v in enumerate(stamps):
        try:
            ok = not np.isnat(np.datetime64(v, "s"))
        except ValueError:
            ok = False
        if not ok:
            raise table.error(i, "timestamp", f"{v!r}; expected a time like 2017-10-09 07:01:55")
    # numpy rejected the column but accepts every cell on its own: not expected to happen.
    raise TraceError("column 'timestamp' could not be parsed as times", path=table.path)


def load_philly(csv_path: Path) -> Trace:
    """Pollux's Philly trace (``timestamp,duration,num_gpus,gpu_time,cluster``) as a Trace.

    Timestamps (``2017-10-09 07:01:55``) are taken as UTC; only differences matter. Philly
    records neither CPU requests (cpus = -1) nor job names nor nodes (nodes = 1: the engine
    spreads a large job over nodes).
    """
    path = Path(csv_path)
    what = "Philly trace (timestamp,duration,num_gpus,...)"
    table = _read_table(path, what)
    _require(table, ("timestamp", "duration", "num_gpus"), "Philly trace")
    stamps = table.columns["timestamp"]
    times = _philly_times(table, stamps)
    submit = times.astype(np.int64).astype(np.float64)
    duration = _numbers(table, "duration", "a run time in seconds")
    num_gpus = _integers(table, "num_gpus", "a whole number of GPUs")
    notes: list[str] = ["timestamps taken as UTC (only differences are used)"]
    bad_duration = ~(duration > 0)
    bad_gpus = ~bad_duration & (num_gpus <= 0)
    keep = ~bad_duration & ~bad_gpus
    notes.append(f"{_count(bad_duration.sum(), 'job')} with duration <= 0 dropped")
    notes.append(f"{_count(bad_gpus.sum(), 'job')} with num_gpus <= 0 dropped")
    notes += _big_jobs_notes(keep, num_gpus)
    notes += _philly_column_notes(table, keep, duration, num_gpus)
    notes.append(
        "Philly does not record CPU requests (cpus = -1), GPU types (-1) or job names (-1)"
    )
    n = int(keep.sum())
    return _finish(
        name="philly",
        path=path,
        submit_s=submit[keep],
        duration_s=duration[keep],
        gpus=num_gpus[keep],
        cpus=np.full(n, -1, dtype=np.int32),
        nodes=np.ones(n, dtype=np.int32),
        workload=np.full(n, -1, dtype=np.int32),
        workload_names=[],
        gpu_model=np.full(n, -1, dtype=np.int16),
        gpu_model_names=[],
        node_specs=None,
        source=_PHILLY_SOURCE,
        notes=notes,
    )


def _big_jobs_notes(keep: np.ndarray, gpus: np.ndarray) -> list[str]:
    """A note on the kept jobs of more GPUs than a node has, if there are any."""
    big = keep & (gpus > 8)
    if not big.any():
        return []
    return [
        f"{_count(big.sum(), 'job')} ask for more than 8 GPUs (up to "
        f"{int(gpus[big].max())}); nodes left at 1 because the trace does not record "
        "nodes: the engine spreads them"
    ]


def _philly_column_notes(
    table: _Table, keep: np.ndarray, duration: np.ndarray, num_gpus: np.ndarray
) -> list[str]:
    """What the columns a replay does not use hold."""
    notes: list[str] = []
    if "gpu_time" in table.columns:
        gpu_time = _numbers(table, "gpu_time", "GPU-seconds")
        off = keep & (np.abs(gpu_time - duration * num_gpus) > 1e-6 * np.maximum(gpu_time, 1))
        notes.append(
            "gpu_time column ignored (derived: duration x num_gpus"
            + (f"; differs in {_count(off.sum(), 'row')})" if off.any() else " in every row)")
        )
    if "cluster" in table.columns:
        clusters = Counter(c for c, k in zip(table.columns["cluster"], keep, strict=True) if k)
        notes.append(
            f"jobs of {len(clusters)} virtual clusters merged into one trace (largest: "
            + ", ".join(f"{c} {n:,}" for c, n in clusters.most_common(3))
            + ")"
        )
    return notes


# ------------------------------------------------------------------------------------ Muri

# Units of Muri's cluster_trace.csv. iteration_time and resource_time_* are per-iteration
# times in ms (a few hundred: gpt2 437, vgg16 214, resnet18 1010). Evidence that submit_time
# and duration are in ms too: over the 400 jobs, duration / (iterations x iteration_time) has
# median 0.988 (range 0.19 .. 1.30), i.e. duration is the job's iterations at its iteration
# time, in the same unit. Every submit_time and duration is a multiple of 1000 (ms rounded to
# whole seconds); in seconds the jobs run 7 s .. 603,739 s (7 days), median 2,224 s, and
# arrive over 2,344,695 s (27 days): plausible, whereas read as seconds the trace would span
# 74 years with jobs of up to 19 years. load_muri re-checks the ratio on every file it reads.
_MURI_MS_RATIO = (0.2, 5.0)  # median duration / (iterations x iteration_time) when in ms
_MURI_S_RATIO = (0.2e-3, 5.0e-3)  # the same ratio when duration were in seconds


def _muri_time_scale(
    table: _Table, path: Path, duration_raw: np.ndarray, notes: list[str]
) -> float:
    """Seconds per unit of the trace's times (see the evidence above), noted in ``notes``."""
    scale = 1e-3
    if "iterations" in table.columns and "iteration_time" in table.columns and len(table):
        iterations = _numbers(table, "iterations", "a number of iterations")
        iteration_ms = _numbers(table, "iteration_time", "an iteration time in ms")
        ok = (iterations > 0) & (iteration_ms > 0)
        ratio = float(np.median(duration_raw[ok] / (iterations[ok] * iteration_ms[ok])))
        if _MURI_MS_RATIO[0] <= ratio <= _MURI_MS_RATIO[1]:
            notes.append(
                f"submit_time and duration read as ms: median duration / (iterations x "
                f"iteration_time [ms]) = {ratio:.3f} over {_count(ok.sum(), 'job')}"
            )
        elif _MURI_S_RATIO[0] <= ratio <= _MURI_S_RATIO[1]:
            scale = 1.0
            notes.append(
                f"duration read as s: median duration / (iterations x iteration_time [ms]) "
                f"= {ratio:.2g} (about 1/1000); submit_time taken as s too"
            )
        else:
            raise TraceError(
                f"cannot tell the time unit: median duration / (iterations x iteration_time) "
                f"is {ratio:.3g}, expected about 1 (duration in ms) or 0.001 (in s)",
                path=path,
            )
    else:
        notes.append("no iterations/iteration_time columns: submit_time and duration taken as ms")
    return scale


def load_muri(csv_path: Path) -> Trace:
    """Muri's ``cluster_trace.csv`` (SIGCOMM'22 testbed trace) as a Trace.

    submit_time and duration are converted from ms to s (evidence above); workload =
    ``model_name``; cpus = -1 (not recorded).
    """
    path = Path(csv_path)
    what = "Muri trace (job_id,num_gpu,submit_time,...,model_name,...,duration,...)"
    table = _read_table(path, what)
    _require(table, ("num_gpu", "submit_time", "model_name", "duration"), "Muri trace")
    submit_ms = _numbers(table, "submit_time", "a submit time in ms")
    duration_raw = _numbers(table, "duration", "a run time in ms")
    num_gpu = _integers(table, "num_gpu", "a whole number of GPUs")
    notes: list[str] = []
    scale = _muri_time_scale(table, path, duration_raw, notes)
    duration_s = duration_raw * scale
    submit_s = submit_ms * scale
    bad_duration = ~(duration_s > 0)
    bad_gpus = ~bad_duration & (num_gpu <= 0)
    keep = ~bad_duration & ~bad_gpus
    notes.append(f"{_count(bad_duration.sum(), 'job')} with duration <= 0 dropped")
    notes.append(f"{_count(bad_gpus.sum(), 'job')} with num_gpu <= 0 dropped")
    models = [m.strip() for m in table.columns["model_name"]]
    workload, names = _index_labels([m if k else "" for m, k in zip(models, keep, strict=True)])
    unnamed = int(np.count_nonzero(keep & (workload < 0)))
    notes.append(
        f"workload = model_name: {len(names)} models"
        + (f"; {_count(unnamed, 'job')} without a name (-1)" if unnamed else "")
    )
    notes += _big_jobs_notes(keep, num_gpu)
    notes.append(
        "Muri does not record CPU requests (cpus = -1), GPU types (-1) or the node inventory; "
        "batch_size, interval and priority are not used"
    )
    n = int(keep.sum())
    return _finish(
        name="muri",
        path=path,
        submit_s=submit_s[keep],
        duration_s=duration_s[keep],
        gpus=num_gpu[keep],
        cpus=np.full(n, -1, dtype=np.int32),
        nodes=np.ones(n, dtype=np.int32),
        workload=workload[keep],
        workload_names=names,
        gpu_model=np.full(n, -1, dtype=np.int16),
        gpu_model_names=[],
        node_specs=None,
        source=_MURI_SOURCE,
        notes=notes,
    )


def muri_stage_times(
    csv_path: Path, *, num_gpu: int | None = None
) -> dict[str, tuple[float, float, float]]:
    """Per model the median (data/CPU, GPU, communication) stage times in ms per iteration.

    From ``resource_time_0`` (data loading / CPU), ``resource_time_1`` (GPU compute) and
    ``resource_time_2`` (communication). Stage times depend on the job's GPU count (the
    communication stage is 0 on one GPU); ``num_gpu`` restricts the medians to jobs of that
    size. Models without such jobs are left out.
    """
    path = Path(csv_path)
    table = _read_table(path, "Muri trace with resource_time_0..2")
    stages = ("resource_time_0", "resource_time_1", "resource_time_2")
    _require(table, ("model_name", "num_gpu", *stages), "Muri trace")
    times = np.stack([_numbers(table, c, "a stage time in ms") for c in stages], axis=1)
    sizes = _integers(table, "num_gpu", "a whole number of GPUs")
    models = np.array([m.strip() for m in table.columns["model_name"]], dtype=object)
    out: dict[str, tuple[float, float, float]] = {}
    for model in sorted(set(models.tolist()) - {""}):
        rows = models == model
        if num_gpu is not None:
            rows &= sizes == num_gpu
        if rows.any():
            med = np.median(times[rows], axis=0)
            out[model] = (float(med[0]), float(med[1]), float(med[2]))
    if not out:
        which = f" with num_gpu = {num_gpu}" if num_gpu is not None else ""
        raise TraceError(f"no jobs{which} with a model_name", path=path)
    return out


# ----------------------------------------------------------------------------------- sacct

_SACCT_NEEDED = ("JobID", "JobName", "Submit", "Start", "End")
_TRES_COLUMNS = ("AllocTRES", "ReqTRES")
_CPU_COLUMNS = ("AllocCPUS", "ReqCPUS")
_GRES_COLUMNS = ("AllocGRES", "ReqGRES")
_NO_TIME = frozenset({"", "unknown", "none", "n/a"})
_EPOCH = datetime(1970, 1, 1)


_SACCT_SKIPS = {
    "step": ("job step (JobID with '.')", "job steps (JobID with '.')"),
    "array": (
        "pending array-task range (JobID like 123_[4-9])",
        "pending array-task ranges (JobID like 123_[4-9])",
    ),
    "never": (
        "job that never started (Start Unknown/None)",
        "jobs that never started (Start Unknown/None)",
    ),
    "no_end": ("job without an End (still running)", "jobs without an End (still running)"),
    "zero": ("job that ran 0 s (End <= Start)", "jobs that ran 0 s (End <= Start)"),
}


@dataclass(frozen=True, slots=True)
class _Tres:
    cpus: int | None
    gpus: int
    gpu_types: tuple[str, ...]
    nodes: int | None


def _job_count(text: str) -> int:
    """A count of cores, GPUs or nodes as sacct prints it (ASCII digits, at most
    :data:`_MAX_JOB_COUNT`); ValueError otherwise."""
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"{text!r} is not a whole number")
    if len(text) > len(str(_MAX_JOB_COUNT)) or int(text) > _MAX_JOB_COUNT:
        shown = text if len(text) <= 20 else f"{text[:20]}... ({len(text):,} digits)"
        raise ValueError(f"{shown} is more than one job holds (at most {_MAX_JOB_COUNT:,})")
    return int(text)


@lru_cache(maxsize=65536)
def _parse_sacct_tres(text: str) -> _Tres:
    """``billing=8,cpu=8,gres/gpu:a100=2,gres/gpu=2,mem=64G,node=1``; ValueError if malformed.

    Slurm lists a typed GPU count (``gres/gpu:a100=2``) next to the total (``gres/gpu=2``);
    the total wins, else the typed counts are summed. Cached: exports repeat the same few
    strings.
    """
    cpus: int | None = None
    nodes: int | None = None
    total: int | None = None
    typed: dict[str, int] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise ValueError(f"TRES item {item!r} is not NAME=VALUE")
        key = name.lower()
        gres_type: str | None = None
        if key.startswith("gres/gpu:"):
            gres_type = name[len("gres/gpu:") :]
            key = "gres/gpu"
        if key not in ("cpu", "node", "gres/gpu"):
            continue  # billing, mem, energy, gres/gpumem, licences ...: not needed here
        try:
            count = _job_count(value)
        except ValueError as e:
            raise ValueError(f"TRES item {name[:40]!r}: {e}") from None
        if key == "cpu":
            cpus = count
        elif key == "node":
            nodes = count
        elif gres_type is None:
            total = count
        elif gres_type:
            typed[gres_type] = typed.get(gres_type, 0) + count
        else:
            raise ValueError(f"TRES item {item!r}: empty GPU type after 'gres/gpu:'")
    gpus = total if total is not None else sum(typed.values())
    types = tuple(sorted(t for t, c in typed.items() if c > 0))
    return _Tres(cpus, gpus, types, nodes)


def _sacct_time(value: str) -> float | None:
    """Seconds of a naive local time (kept as-is, DST ignored); None for Unknown/None;
    ValueError for anything else, a time with a UTC offset included (sacct prints none)."""
    text = value.strip()
    if text.lower() in _NO_TIME:
        return None
    when = datetime.fromisoformat(text)
    if when.tzinfo is not None:
        raise ValueError(f"{text!r} has a UTC offset")
    return (when - _EPOCH).total_seconds()


def load_sacct(path: Path) -> Trace:
    """A site's own ``sacct -P`` export (see :data:`SACCT_COMMAND`) as a Trace.

    Per job: submit = Submit, duration = End - Start, GPUs and cores from AllocTRES (what the
    job got; ReqTRES when AllocTRES is empty or absent; AllocCPUS/ReqCPUS and
    AllocGRES/ReqGRES in exports without TRES), GPU type from ``gres/gpu:TYPE=N``, nodes from
    NNodes. workload = ``User/JobName`` (CODA's signatures are per user, so two users' ``train``
    are different workloads); JobName alone without a User column. Times are naive local
    times as printed, taken as-is. Skipped and counted in notes: job steps (JobID with ``.``),
    pending array ranges (``123_[4-9]``), jobs that never started, jobs without an End (still
    running), and jobs that ran 0 s.
    """
    path = Path(path)
    table = _read_table(
        path,
        f"a `{SACCT_COMMAND}` export",
        delimiter="|",
        lenient_text=True,
        free_text="JobName",
    )
    cols = _sacct_columns(table, path)
    jobs = _SacctJobs()
    for i in range(len(table)):
        _sacct_row(table, i, cols, jobs)
    notes = _sacct_notes(table, cols, jobs, path)
    workload, names = _index_labels(jobs.labels)
    model_idx, model_names = _index_labels(jobs.models)
    return _finish(
        name=f"sacct:{path.name}",
        path=path,
        submit_s=np.array(jobs.submit, dtype=np.float64),
        duration_s=np.array(jobs.duration, dtype=np.float64),
        gpus=np.array(jobs.gpus, dtype=np.int64),
        cpus=np.array(jobs.cpus, dtype=np.int64),
        nodes=np.array(jobs.nodes, dtype=np.int64),
        workload=workload,
        workload_names=names,
        gpu_model=model_idx,
        gpu_model_names=model_names,
        node_specs=None,
        source=f"the site's own Slurm accounting (sacct export {path}); not public",
        notes=notes,
    )


@dataclass(frozen=True, slots=True)
class _SacctColumns:
    """Which of the resource columns an export has, in the order they are read."""

    tres: list[str]
    cpu: list[str]
    gres: list[str]


@dataclass(slots=True)
class _SacctJobs:
    """The jobs :func:`load_sacct` keeps, column by column, and what it counted on the way."""

    submit: list[float] = field(default_factory=list)
    duration: list[float] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)
    cpus: list[int] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    """Lines left out, by :data:`_SACCT_SKIPS` kind."""
    states: Counter[str] = field(default_factory=Counter)
    fallback_req: int = 0
    """Jobs whose AllocTRES was empty, read from ReqTRES."""
    nodes_from_default: int = 0
    multi_type: int = 0
    """Jobs that held several GPU types."""


def _sacct_columns(table: _Table, path: Path) -> _SacctColumns:
    """The export's resource columns; TraceError when a needed column is missing."""
    missing = [c for c in _SACCT_NEEDED if c not in table.columns]
    cols = _SacctColumns(
        tres=[c for c in _TRES_COLUMNS if c in table.columns],
        cpu=[c for c in _CPU_COLUMNS if c in table.columns],
        gres=[c for c in _GRES_COLUMNS if c in table.columns],
    )
    if not cols.tres and not (cols.cpu and cols.gres):
        missing.append("AllocTRES or ReqTRES (or AllocCPUS/ReqCPUS with AllocGRES/ReqGRES)")
    if missing:
        raise TraceError(
            f"missing column(s) {', '.join(missing)} (the header has "
            f"{', '.join(table.header)}); export the accounting with:  {SACCT_COMMAND}",
            path=path,
            line=1,
        )
    return cols


def _sacct_row(table: _Table, i: int, cols: _SacctColumns, jobs: _SacctJobs) -> None:
    """Add the job of data line ``i`` to ``jobs``, or count why it is skipped."""
    times = _sacct_times(table, i)
    if isinstance(times, str):
        jobs.skipped[times] += 1
        return
    submit_t, run_s = times
    tres, n_cpus, n_gpus, types = _sacct_resources(table, i, cols, jobs)
    n_nodes = _sacct_nodes(table, i, tres, jobs)
    if len(types) > 1:
        jobs.multi_type += 1
    col = table.columns
    users = col.get("User")
    name = col["JobName"][i].strip() or UNNAMED
    user = users[i].strip() if users is not None else ""
    state = col["State"][i].split()[0] if "State" in col and col["State"][i].strip() else "?"
    jobs.states[state] += 1
    jobs.submit.append(submit_t)
    jobs.duration.append(run_s)
    jobs.gpus.append(n_gpus)
    jobs.cpus.append(n_cpus if n_cpus and n_cpus > 0 else -1)
    jobs.nodes.append(n_nodes)
    jobs.labels.append(f"{user}/{name}" if user else name)
    jobs.models.append("|".join(types) if n_gpus > 0 else "")


def _sacct_times(table: _Table, i: int) -> tuple[float, float] | str:
    """``(submit, run time)`` of data line ``i`` in seconds, or the :data:`_SACCT_SKIPS`
    kind that leaves it out; TraceError for a missing JobID or a bad time."""
    col = table.columns
    job_id = col["JobID"][i].strip()
    if not job_id:
        raise table.error(i, "JobID", "empty; expected a job id such as 1234 or 1234_7")
    if "." in job_id:
        return "step"
    if "[" in job_id:
        return "array"
    try:
        submit_t = _sacct_time(col["Submit"][i])
        start_t = _sacct_time(col["Start"][i])
        end_t = _sacct_time(col["End"][i])
    except ValueError:
        bad = next(c for c in ("Submit", "Start", "End") if not _is_sacct_time(col[c][i]))
        raise table.error(
            i, bad, f"{col[bad][i]!r}; expected a time like 2024-03-01T10:00:00 or Unknown"
        ) from None
    if submit_t is None:
        raise table.error(i, "Submit", f"{col['Submit'][i]!r}; every job has a submit time")
    if start_t is None:
        return "never"
    if end_t is None:
        return "no_end"
    run_s = end_t - start_t
    if run_s <= 0:
        return "zero"
    return submit_t, run_s


def _sacct_resources(
    table: _Table, i: int, cols: _SacctColumns, jobs: _SacctJobs
) -> tuple[_Tres | None, int | None, int, tuple[str, ...]]:
    """``(TRES, cores, GPUs, GPU types)`` of data line ``i``: from the first non-empty TRES
    column, else from the CPU and GRES columns (TRES None)."""
    col = table.columns
    for c in cols.tres:
        text = col[c][i].strip()
        if text:
            try:
                tres = _parse_sacct_tres(text)
            except ValueError as e:
                raise table.error(i, c, f"{e}; expected e.g. cpu=8,gres/gpu=2,node=1") from None
            if c == "ReqTRES" and "AllocTRES" in cols.tres:
                jobs.fallback_req += 1
            return tres, tres.cpus, tres.gpus, tres.gpu_types
    n_cpus: int | None = None
    n_gpus = 0
    types: tuple[str, ...] = ()
    for c in cols.cpu:
        text = col[c][i].strip()
        if text:
            try:
                n_cpus = _job_count(text)
            except ValueError as e:
                raise table.error(i, c, f"{e}; expected a whole number of cores") from None
            break
    for c in cols.gres:
        text = col[c][i].strip()
        if text:
            try:
                n_gpus, types = _job_count(str(gpu_count(text))), gpu_types(text)
            except (TresError, ValueError) as e:
                raise table.error(i, c, f"{e}; expected e.g. gpu:a100:2") from None
            break
    return None, n_cpus, n_gpus, types


def _sacct_nodes(table: _Table, i: int, tres: _Tres | None, jobs: _SacctJobs) -> int:
    """Nodes of data line ``i``: NNodes, else the TRES ``node=``, else 1 (counted)."""
    nnodes = table.columns.get("NNodes")
    if nnodes is not None:
        text = nnodes[i].strip()
        try:
            count = _job_count(text)
        except ValueError as e:
            raise table.error(i, "NNodes", f"{e}; expected a whole number >= 1") from None
        if count < 1:
            raise table.error(i, "NNodes", f"{text!r}; expected a whole number >= 1")
        return count
    if tres is not None and tres.nodes:
        return tres.nodes
    jobs.nodes_from_default += 1
    return 1


def _sacct_notes(table: _Table, cols: _SacctColumns, jobs: _SacctJobs, path: Path) -> list[str]:
    """What :func:`load_sacct` skipped, read from where and assumed; TraceError when no
    job ran."""
    skipped = jobs.skipped
    notes = [
        f"{_count(skipped[kind], one, many)} skipped"
        for kind, (one, many) in _SACCT_SKIPS.items()
        if skipped[kind]
    ]
    if not jobs.submit:
        raise TraceError(
            f"no job that ran in {_count(len(table), 'data line')}"
            + (f" ({'; '.join(notes)})" if notes else "")
            + f"; export finished jobs with:  {SACCT_COMMAND}",
            path=path,
        )
    source_cols = cols.tres[0] if cols.tres else "/".join(cols.cpu + cols.gres)
    notes.append(
        f"GPUs and cores from {source_cols}"
        + (" (what each job got)" if source_cols.startswith("Alloc") else " (what was asked)")
        + (
            f"; {_count(jobs.fallback_req, 'job')} with an empty AllocTRES used ReqTRES"
            if jobs.fallback_req
            else ""
        )
    )
    unknown_cpus = sum(1 for c in jobs.cpus if c < 0)
    if unknown_cpus:
        notes.append(f"{_count(unknown_cpus, 'job')} without a core count (cpus = -1)")
    if jobs.nodes_from_default:
        notes.append(f"{_count(jobs.nodes_from_default, 'job')} without a node count: nodes = 1")
    typed = sum(1 for m in jobs.models if m)
    multi_type = jobs.multi_type
    notes.append(
        f"{_count(typed, 'GPU job')} with a GPU type (gres/gpu:TYPE=N) → gpu_model"
        + (f"; {multi_type:,} held several types, recorded as 'A|B'" if multi_type else "")
    )
    notes.append(
        "workload = "
        + ("User/JobName" if "User" in table.columns else "JobName")
        + f": {len(set(jobs.labels)):,} distinct among {_count(len(jobs.labels), 'job')}"
    )
    notes.append("job states: " + ", ".join(f"{s} {c:,}" for s, c in jobs.states.most_common()))
    notes.append("times are the export's naive local times, used as-is (DST shifts ignored)")
    return notes


def _is_sacct_time(value: str) -> bool:
    try:
        _sacct_time(value)
    except ValueError:
        return False
    return True


# ------------------------------------------------------------------------------- synthetic

# GPU job sizes: 1/2/4/8 GPUs with probabilities 0.6/0.15/0.15/0.1 for 95 % of GPU jobs,
# 16 and 32 GPUs (multi-node with 8-GPU nodes) for the other 5 %, half each.
_SYN_GPU_SIZES = np.array([1, 2, 4, 8, 16, 32], dtype=np.int64)
_SYN_GPU_P = np.array([0.6 * 0.95, 0.15 * 0.95, 0.15 * 0.95, 0.1 * 0.95, 0.025, 0.025])
# Cores per GPU that users request. Weights from the Alibaba GPU v2023 trace
# (openb_pod_list_default.csv): ceil(cpu_milli / 1000) / num_gpu of its 7,064 GPU pods,
# each snapped to the nearest value of the set: 2: 0.8 %, 4: 34.1 %, 6: 2.4 %, 8: 10.4 %,
# 10: 3.1 %, 12: 37.4 %, 16: 11.8 % (rounded here to whole percent).
_SYN_CPUS_PER_GPU = np.array([2, 4, 6, 8, 10, 12, 16], dtype=np.int64)
_SYN_CPUS_PER_GPU_P = np.array([0.01, 0.34, 0.02, 0.10, 0.03, 0.38, 0.12])
_SYN_DURATION_SIGMA = 1.5
_SYN_ZIPF_EXPONENT = 1.1
_SYN_MIN_DURATION_S = 1.0


def synthetic(
    n_jobs: int,
    *,
    n_gpus: int,
    seed: int,
    load: float = 0.9,
    cpu_job_fraction: float = 0.3,
    gpus_per_node: int = 8,
    cores_per_node: int = 96,
    mean_duration_s: float = 3600.0,
    n_workloads: int = 200,
) -> Trace:
    """A reproducible synthetic trace for scale tests (same arguments → identical arrays).

    * ``cpu_job_fraction`` of the jobs are CPU-only with 1..16 cores (uniform).
    * GPU jobs have 1/2/4/8 GPUs (p = 0.6/0.15/0.15/0.1) for 95 %, 16/32 GPUs for 5 %;
      nodes = ceil(gpus / gpus_per_node).
    * Cores per GPU from {2, 4, 6, 8, 10, 12, 16} with the Alibaba trace's frequencies
      (mostly 4 and 12), capped at what the job's nodes have.
    * Durations lognormal (sigma 1.5) with mean ``mean_duration_s``, at least 1 s.
    * Poisson arrivals at the rate that makes the offered GPU load (GPU-seconds per second
      of submit span) ``load`` x ``n_gpus``, computed from the drawn jobs.
    * Workloads ``w0000`` .. drawn Zipf-like (weight 1/k^1.1), independent of the job's shape,
      so popular workloads recur; what a workload needs is the engine's model's business.
    * node_specs: ``n_gpus / gpus_per_node`` identical nodes.
    """
    _check_synthetic(
        n_jobs,
        n_gpus=n_gpus,
        load=load,
        cpu_job_fraction=cpu_job_fraction,
        gpus_per_node=gpus_per_node,
        cores_per_node=cores_per_node,
        mean_duration_s=mean_duration_s,
        n_workloads=n_workloads,
    )
    args = _Synthetic(
        n_jobs,
        n_gpus,
        seed,
        load,
        cpu_job_fraction,
        gpus_per_node,
        cores_per_node,
        mean_duration_s,
        n_workloads,
    )
    trace = _synthetic_trace(args)
    trace.validate()
    return trace


@dataclass(frozen=True, slots=True)
class _Synthetic:
    """:func:`synthetic`'s arguments."""

    n_jobs: int
    n_gpus: int
    seed: int
    load: float
    cpu_job_fraction: float
    gpus_per_node: int
    cores_per_node: int
    mean_duration_s: float
    n_workloads: int


def _synthetic_trace(a: _Synthetic) -> Trace:
    """The jobs :func:`synthetic` draws for ``a``."""
    n_jobs, n_gpus, n_workloads = a.n_jobs, a.n_gpus, a.n_workloads
    rng = np.random.default_rng(a.seed)
    is_cpu_job, gpus, nodes, cpus, capped = _synthetic_shapes(
        rng, n_jobs, a.cpu_job_fraction, a.gpus_per_node, a.cores_per_node
    )
    mu = math.log(a.mean_duration_s) - _SYN_DURATION_SIGMA**2 / 2
    duration = np.maximum(rng.lognormal(mu, _SYN_DURATION_SIGMA, size=n_jobs), _SYN_MIN_DURATION_S)
    weights = 1.0 / np.arange(1, n_workloads + 1, dtype=np.float64) ** _SYN_ZIPF_EXPONENT
    workload = rng.choice(n_workloads, size=n_jobs, p=weights / weights.sum())
    gpu_seconds_per_job = float(np.mean(gpus * duration))
    rate_per_s = a.load * n_gpus / gpu_seconds_per_job
    gaps = rng.exponential(1.0 / rate_per_s, size=n_jobs)
    submit = np.empty(n_jobs, dtype=np.float64)
    submit[0] = 0.0
    np.cumsum(gaps[:-1], out=submit[1:])

    width = max(4, len(str(n_workloads - 1)))
    names = [f"w{k:0{width}d}" for k in range(n_workloads)]
    top = np.bincount(workload, minlength=n_workloads)
    notes = _synthetic_notes(
        a,
        n_cpu=int(is_cpu_job.sum()),
        multi_node=int(np.count_nonzero(nodes > 1)),
        capped=capped,
        drawn_mean_s=float(np.mean(duration)),
        rate_per_s=rate_per_s,
        top_jobs=int(top.max()),
    )
    return Trace(
        name="synthetic",
        submit_s=submit,
        duration_s=duration,
        gpus=gpus.astype(np.int32),
        cpus=cpus.astype(np.int32),
        nodes=nodes.astype(np.int32),
        workload=workload.astype(np.int32),
        workload_names=names,
        gpu_model=np.full(n_jobs, -1, dtype=np.int16),
        gpu_model_names=[],
        node_specs=uniform_nodes(n_gpus // a.gpus_per_node, a.cores_per_node, a.gpus_per_node),
        source=(
            f"synthetic(n_jobs={n_jobs}, n_gpus={n_gpus}, seed={a.seed}, load={a.load}, "
            f"cpu_job_fraction={a.cpu_job_fraction}, gpus_per_node={a.gpus_per_node}, "
            f"cores_per_node={a.cores_per_node}, mean_duration_s={a.mean_duration_s}, "
            f"n_workloads={n_workloads}) from slurm_plugin.sim.traces; no external data"
        ),
        notes=notes,
    )


def _synthetic_notes(
    a: _Synthetic,
    *,
    n_cpu: int,
    multi_node: int,
    capped: int,
    drawn_mean_s: float,
    rate_per_s: float,
    top_jobs: int,
) -> list[str]:
    """What :func:`synthetic` drew, in words."""
    n_gpus, gpus_per_node = a.n_gpus, a.gpus_per_node
    return [
        f"synthetic: {a.n_jobs:,} jobs, seed {a.seed}, {n_gpus:,} GPUs on "
        f"{n_gpus // gpus_per_node:,} nodes of {gpus_per_node} GPUs and {a.cores_per_node} cores",
        f"{_count(n_cpu, 'CPU-only job')} ({a.cpu_job_fraction:.0%} asked) with 1..16 cores",
        "GPU job sizes 1/2/4/8 GPUs (p 0.6/0.15/0.15/0.1) for 95 %, 16/32 GPUs for 5 %; "
        f"{_count(multi_node, 'multi-node job')}",
        "cores per GPU from {2,4,6,8,10,12,16} with the Alibaba v2023 frequencies "
        f"(34 % 4, 38 % 12); {_count(capped, 'job')} capped at the cores of their nodes",
        f"durations lognormal (sigma {_SYN_DURATION_SIGMA}) with mean "
        f"{a.mean_duration_s:,.0f} s, at least {_SYN_MIN_DURATION_S:.0f} s; drawn mean "
        f"{drawn_mean_s:,.0f} s",
        f"Poisson arrivals at {rate_per_s * 3600:,.1f} jobs/h for an offered GPU load of "
        f"{a.load:.0%} of {n_gpus:,} GPUs",
        f"workloads: {a.n_workloads} names drawn Zipf-like (exponent {_SYN_ZIPF_EXPONENT}), "
        f"independent of job shape; the most popular has {top_jobs:,} jobs",
    ]


def _check_synthetic(
    n_jobs: int,
    *,
    n_gpus: int,
    load: float,
    cpu_job_fraction: float,
    gpus_per_node: int,
    cores_per_node: int,
    mean_duration_s: float,
    n_workloads: int,
) -> None:
    """ValueError naming the first of :func:`synthetic`'s arguments that cannot be used."""
    if n_jobs < 1:
        raise ValueError(f"n_jobs must be >= 1, got {n_jobs}")
    if gpus_per_node < 1 or cores_per_node < 1:
        raise ValueError(
            f"gpus_per_node and cores_per_node must be >= 1, got {gpus_per_node}, {cores_per_node}"
        )
    if n_gpus < 1 or n_gpus % gpus_per_node:
        raise ValueError(
            f"n_gpus must be a positive multiple of gpus_per_node={gpus_per_node}, got {n_gpus}"
        )
    largest = int(_SYN_GPU_SIZES[-1])
    if n_gpus < largest:
        raise ValueError(
            f"n_gpus={n_gpus} is smaller than the largest synthetic job ({largest} GPUs)"
        )
    uneven = [int(s) for s in _SYN_GPU_SIZES if s > gpus_per_node and s % gpus_per_node]
    if uneven:
        raise ValueError(
            f"gpus_per_node={gpus_per_node} does not divide the multi-node job sizes {uneven}; "
            "use a power of two"
        )
    if not 0.0 <= cpu_job_fraction < 1.0:
        raise ValueError(f"cpu_job_fraction must be in [0, 1), got {cpu_job_fraction}")
    if not load > 0 or not math.isfinite(load):
        raise ValueError(f"load must be > 0, got {load}")
    if not mean_duration_s > 0 or not math.isfinite(mean_duration_s):
        raise ValueError(f"mean_duration_s must be > 0, got {mean_duration_s}")
    if n_workloads < 1:
        raise ValueError(f"n_workloads must be >= 1, got {n_workloads}")


def _synthetic_shapes(
    rng: np.random.Generator,
    n_jobs: int,
    cpu_job_fraction: float,
    gpus_per_node: int,
    cores_per_node: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """``(is_cpu_job, gpus, nodes, cpus, capped)`` of the synthetic jobs, the first draws
    from ``rng``; ``capped``: how many jobs were cut to the cores of their nodes."""
    is_cpu_job = rng.random(n_jobs) < cpu_job_fraction
    gpus = rng.choice(_SYN_GPU_SIZES, size=n_jobs, p=_SYN_GPU_P)
    gpus[is_cpu_job] = 0
    nodes = np.maximum(-(-gpus // gpus_per_node), 1)
    cpus_per_gpu = rng.choice(_SYN_CPUS_PER_GPU, size=n_jobs, p=_SYN_CPUS_PER_GPU_P)
    wanted = cpus_per_gpu * gpus
    cpu_cores = rng.integers(1, 17, size=n_jobs)
    wanted[is_cpu_job] = cpu_cores[is_cpu_job]
    cpus = np.minimum(wanted, cores_per_node * nodes)
    capped = int(np.count_nonzero(cpus < wanted))
    return is_cpu_job, gpus, nodes, cpus, capped


# ---------------------------------------------------------------------------------- dispatch

_SPEC_FORMS = (
    "alibaba[:PODS.csv], philly[:CSV], muri[:CSV], sacct:FILE, "
    "synthetic:N_JOBS[,gpus=10000][,seed=1][,load=0.9]"
)
_SYNTHETIC_KEYS: dict[str, tuple[str, type]] = {
    "gpus": ("n_gpus", int),
    "seed": ("seed", int),
    "load": ("load", float),
    "cpu_jobs": ("cpu_job_fraction", float),
    "gpus_per_node": ("gpus_per_node", int),
    "cores_per_node": ("cores_per_node", int),
    "mean_duration_s": ("mean_duration_s", float),
    "workloads": ("n_workloads", int),
}
_SYNTHETIC_DEFAULTS: dict[str, object] = {"n_gpus": 10_000, "seed": 1, "load": 0.9}
_COUNT_SUFFIX = {"k": 1_000, "m": 1_000_000}


def trace_dirs() -> list[Path]:
    """Where the bare trace names look, first to last (see the module docstring)."""
    env = os.environ.get("CODA_TRACE_DIR")
    if env:
        dirs = [Path(env).expanduser()]
    else:
        xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        dirs = [Path(xdg) / "coda-slurm" / "traces"]
        # A source checkout's sibling data folder, where this project's developers keep the
        # public traces (tests and docs/evaluation.md read the Alibaba trace from there).
        checkout = Path(__file__).resolve().parents[2]
        if (checkout / "setup.py").is_file() and (checkout.parent / "shared" / "data").is_dir():
            dirs.append(checkout.parent / "shared" / "data")
    return [*dirs, PACKAGED_TRACES]


def trace_file(relative: Path) -> Path | None:
    """The first of ``relative`` or its gzipped copy (``NAME.gz``) in :func:`trace_dirs`."""
    for base in trace_dirs():
        for candidate in (base / relative, base / f"{relative}.gz"):
            if candidate.is_file():
                return candidate
    return None


def alibaba_instructions() -> str:
    """How to get the Alibaba trace and where to put it, as shell commands."""
    dest = trace_dirs()[0] / ALIBABA_PODS.parent
    names = (ALIBABA_PODS.name, ALIBABA_NODES_NAME)
    fetch = " && ".join(f"curl -fLo {dest / n} {_ALIBABA_RAW}{n}" for n in names)
    return f"mkdir -p {dest} && {fetch}"


def _shared_file(kind: str, relative: Path) -> Path:
    found = trace_file(relative)
    if found is not None:
        return found
    looked = ", ".join(str(d) for d in trace_dirs())
    if kind == "alibaba":
        raise TraceError(
            "the Alibaba GPU trace (cluster-trace-gpu-v2023) is not shipped with coda-slurm: "
            "its terms allow use for research or study and say nothing of redistribution "
            "(https://github.com/alibaba/clusterdata). Get its two files into the first "
            f"folder coda-slurm looks in: {alibaba_instructions()}  (looked in {looked}; "
            "CODA_TRACE_DIR changes the first; or give the file as alibaba:PATH)"
        )
    raise TraceError(
        f"the {kind} trace is not there: looked for {relative} (or .gz) in {looked} "
        f"(CODA_TRACE_DIR sets the first folder); give the file explicitly as {kind}:PATH"
    )


def _parse_count(text: str, what: str) -> int:
    t = text.strip().replace("_", "").lower()
    mult = 1
    if t and t[-1] in _COUNT_SUFFIX:
        mult, t = _COUNT_SUFFIX[t[-1]], t[:-1]
    try:
        return int(t) * mult if "." not in t and "e" not in t else int(float(t) * mult)
    except ValueError:
        raise TraceError(f"{what}: {text!r} is not a number (e.g. 100000, 100k, 1M)") from None


def _synthetic_from_spec(arg: str, spec: str) -> Trace:
    parts = [p.strip() for p in arg.split(",")]
    if not parts[0]:
        raise TraceError(f"trace spec {spec!r}: synthetic needs a job count: synthetic:N_JOBS")
    if "=" in parts[0]:
        raise TraceError(
            f"trace spec {spec!r}: the first item after 'synthetic:' is the job count, "
            f"got {parts[0]!r}"
        )
    n_jobs = _parse_count(parts[0], f"trace spec {spec!r}: job count")
    kwargs: dict[str, object] = dict(_SYNTHETIC_DEFAULTS)
    for part in parts[1:]:
        key, eq, value = part.partition("=")
        key = key.strip().lower()
        if not eq or key not in _SYNTHETIC_KEYS:
            raise TraceError(
                f"trace spec {spec!r}: {part!r} is not KEY=VALUE with KEY one of "
                f"{', '.join(_SYNTHETIC_KEYS)}"
            )
        param, kind = _SYNTHETIC_KEYS[key]
        try:
            kwargs[param] = _parse_count(value, key) if kind is int else float(value.strip())
        except (TraceError, ValueError):
            raise TraceError(
                f"trace spec {spec!r}: {key}={value!r} is not "
                + ("a whole number" if kind is int else "a number")
            ) from None
    try:
        return synthetic(n_jobs, **kwargs)  # type: ignore[arg-type]
    except ValueError as e:
        raise TraceError(f"trace spec {spec!r}: {e}") from None


def load_trace(spec: str) -> Trace:
    """The CLI's trace argument → Trace. Forms: see the module docstring."""
    kind, sep, arg = spec.strip().partition(":")
    kind = kind.strip().lower()
    if sep and not arg.strip():
        raise TraceError(f"trace spec {spec!r}: nothing after ':'; forms: {_SPEC_FORMS}")
    arg = arg.strip()
    if kind == "alibaba":
        return load_alibaba(Path(arg).expanduser() if arg else _shared_file(kind, ALIBABA_PODS))
    if kind == "philly":
        return load_philly(Path(arg).expanduser() if arg else _shared_file(kind, PHILLY_CSV))
    if kind == "muri":
        return load_muri(Path(arg).expanduser() if arg else _shared_file(kind, MURI_CSV))
    if kind == "sacct":
        if not arg:
            raise TraceError(
                f"trace spec {spec!r}: sacct needs the export file: sacct:FILE, made with  "
                f"{SACCT_COMMAND}"
            )
        return load_sacct(Path(arg).expanduser())
    if kind == "synthetic":
        return _synthetic_from_spec(arg, spec)
    raise TraceError(f"trace spec {spec!r}: unknown kind {kind!r}; forms: {_SPEC_FORMS}")
