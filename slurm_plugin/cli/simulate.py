"""``coda-slurm simulate``: replay a trace under several CPU-allocation policies."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import numpy as np

from coda_common.cli import CliError, FiniteFloatRange, emit_json
from coda_common.config.codaconf import parse_config
from coda_common.model.starter import STARTER_CONFIDENCE
from coda_common.slurm.conffile import ConfigError
from slurm_plugin.sim.cluster import add_cpu_jobs, busy_window, size_for_load
from slurm_plugin.sim.engine import CODA_CONF, POLICIES, RunResult, SimParams, simulate
from slurm_plugin.sim.report import (
    SCHEMA_VERSION,
    Summary,
    plot,
    render_second_half,
    render_table,
    summarise,
)
from slurm_plugin.sim.traces import (
    ALIBABA_PODS,
    MAX_SIM_NODES,
    MURI_CSV,
    NodeSpec,
    Trace,
    TraceError,
    load_alibaba,
    load_trace,
    muri_stage_times,
    trace_file,
    uniform_nodes,
)
from slurm_plugin.sim.workloads import (
    JobModel,
    Workloads,
    assign_workloads,
    muri_classes,
    starter_table,
)

_EPILOG = """
\b
TRACE is one of:
  alibaba[:PODS.csv]     Alibaba GPU 2023 pods (real CPU requests, node inventory)
  philly[:CSV]           the Philly-derived 82k-job trace (no CPU requests)
  muri[:CSV]             Muri's 400 jobs (model names, per-stage times)
  sacct:FILE             your own `sacct -P` export (see docs/evaluation.md)
  synthetic:N[,gpus=G][,seed=S][,load=L]

\b
Examples:
  coda-slurm simulate alibaba --load 0.9
  coda-slurm simulate philly --jobs 20000 --load 0.9 --cpu-load 0.3 --plot out/
  coda-slurm simulate sacct:last-month.txt --nodes trace -p slurm -p coda --json
  coda-slurm simulate alibaba --load 0.8 -p coda --placement reserve,pcie,prefer
  coda-slurm simulate muri --load 0.8 --starter-table --starter-table-error 0.3 --second-half

\b
--starter-table puts a table of models' cores per GPU in the coda policy's store
before the run (global profiles workload:*:MODEL below MinConfidence): the hook's
prior for a job that names its model (--param script_names_model=SHARE: the share of
workloads whose script names it) and has no confident profile of its own.

\b
--placement runs each policy once as the baseline and once more per mechanism with
that mechanism on (POLICY+MECHANISM rows, ratios to POLICY):
  reserve  spare CPU partitions (one per node shape) whose MaxCPUsPerNode
           coda-slurm reserve sets
  reserve-node  the same with one spare partition per node
  pcie     PCIe-heavy jobs ask one unit of a node's pcie GRES (interference modelled
           in the baseline too)
  membw    memory-bound CPU jobs ask for their memory bandwidth in units of a
           count-only GRES whose per-node count is the node's bandwidth
           (--membw-known: the share of CPU jobs measured before)
  prefer   --prefer the GPU type a job gains most on (GPU generations modelled in the
           baseline too)
  share    a single-node job that would wait may share the GPUs of one job of as many
           GPUs (shard GRES) when coda-slurm colocate names both workloads shareable
  share-any  the same for any two jobs (shard GRES without advice)
"""

PLACEMENTS = ("reserve", "reserve-node", "pcie", "membw", "prefer", "share", "share-any")
"""Placement mechanisms, in table order."""


def _parse_placement(text: str | None) -> list[str]:
    if not text:
        return []
    out: list[str] = []
    for part in text.split(","):
        name = part.strip()
        if name not in PLACEMENTS:
            raise CliError(
                f"bad --placement {text!r}", f"{name!r} is not one of {', '.join(PLACEMENTS)}"
            )
        if name not in out:
            out.append(name)
    return [m for m in PLACEMENTS if m in out]


def placement_runs(base: SimParams, mechanisms: list[str]) -> list[tuple[str, SimParams]]:
    """``(suffix, params)`` of each run per policy: the baseline (suffix ``""``) with the
    physical effects the chosen mechanisms act on, then one run per mechanism turned on."""
    common = replace(
        base,
        pcie_interference=base.pcie_interference or "pcie" in mechanisms,
        gpu_speed=base.gpu_speed or "prefer" in mechanisms,
    )
    runs = [("", common)]
    for m in mechanisms:
        if m == "reserve":
            runs.append(("+reserve", replace(common, reserve=True)))
        elif m == "reserve-node":
            runs.append(("+reserve-node", replace(common, reserve=True, reserve_per_node=True)))
        elif m == "pcie":
            runs.append(("+pcie", replace(common, pcie_spread=True)))
        elif m == "membw":
            runs.append(("+membw", replace(common, membw_spread=True)))
        elif m == "share":
            runs.append(("+share", replace(common, gpu_share="advised")))
        elif m == "share-any":
            runs.append(("+share-any", replace(common, gpu_share="any")))
        else:
            runs.append(("+prefer", replace(common, gpu_prefer=True)))
    return runs


def _parse_nodes(text: str) -> tuple[int, int, int]:
    try:
        count, cores, gpus = (int(x) for x in text.split(":"))
    except ValueError:
        raise CliError(
            f"bad --nodes {text!r}", "expected COUNT:CORES:GPUS, e.g. 128:96:8, or 'trace'"
        ) from None
    if count < 1 or cores < 1 or gpus < 0:
        raise CliError(f"bad --nodes {text!r}", "count and cores must be >= 1, GPUs >= 0")
    if count > MAX_SIM_NODES:
        raise CliError(
            f"bad --nodes {text!r}", f"the simulator runs at most {MAX_SIM_NODES:,} nodes"
        )
    return count, cores, gpus


def _parse_shape(text: str) -> tuple[int, int]:
    try:
        cores, gpus = (int(x) for x in text.split(":"))
    except ValueError:
        raise CliError(f"bad --shape {text!r}", "expected CORES:GPUS, e.g. 96:8") from None
    if cores < 1 or gpus < 1:
        raise CliError(f"bad --shape {text!r}", "cores and GPUs must be >= 1")
    return cores, gpus


def _params(items: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CliError(f"bad --param {item!r}", "expected NAME=VALUE")
        out[name.strip()] = value.strip()
    return out


def _merge_conf(lines: tuple[str, ...]) -> tuple[str, ...]:
    """``Key=Value`` lines with a key given again reduced to its last value (keys compared as
    coda.conf does, case-insensitively), in the order keys first appear."""
    merged: dict[str, str] = {}
    names: dict[str, str] = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if not sep:
            raise CliError("bad --coda-conf", f"{line!r} is not KEY=VALUE")
        names.setdefault(key.strip().lower(), key.strip())
        merged[key.strip().lower()] = value.strip()
    return tuple(f"{names[k]}={v}" for k, v in merged.items())


def _donor() -> Trace | None:
    """The Alibaba trace's CPU pods, to resample CPU jobs from (None when absent)."""
    path = trace_file(ALIBABA_PODS)
    if path is None:
        return None
    try:
        return load_alibaba(path)
    except (OSError, TraceError):
        return None


def _cluster(trace: Trace, nodes_spec: str | None, load: float, shape: str) -> list[NodeSpec]:
    """The nodes of ``--nodes`` (``trace``: the trace's own inventory), else a cluster of
    ``--shape`` nodes sized for ``--load``."""
    if nodes_spec == "trace":
        if not trace.node_specs:
            raise CliError("--nodes trace", f"{trace.name} has no node inventory")
        return list(trace.node_specs)
    if nodes_spec is not None:
        count, cores, gpus = _parse_nodes(nodes_spec)
        return uniform_nodes(count, cores, gpus)
    try:
        return size_for_load(trace, load, shape=_parse_shape(shape))
    except TraceError as exc:
        raise CliError(f"cannot size a cluster for {trace.name}", str(exc)) from exc


def _with_cpu_jobs(trace: Trace, nodes: list[NodeSpec], cpu_load: float, seed: int) -> Trace:
    """``trace`` with CPU-only jobs offering ``cpu_load`` of the cluster's cores."""
    donor = _donor()
    if donor is None:
        click.echo(
            "coda-slurm: note: CPU jobs drawn from 1-16 cores and the GPU jobs' run times: "
            "the Alibaba trace, whose CPU pods they are resampled from otherwise, is not "
            "installed (`coda-slurm simulate alibaba` says how to get it)",
            err=True,
        )
    return add_cpu_jobs(trace, nodes, cpu_load, seed=seed, donor=donor)


def _muri_inputs(
    trace: Trace, trace_spec: str, model: JobModel, mechanisms: list[str]
) -> tuple[
    dict[str, tuple[float, tuple[float, float, float]]] | None,
    list[tuple[str, int, float, float, float]],
]:
    """For a Muri trace: its models' classes, and (when a mechanism shares GPUs) each model's
    stage times per job size; ``(None, [])`` for other traces."""
    if not trace.name.startswith("muri"):
        return None, []
    path = trace_file(MURI_CSV) or MURI_CSV
    if trace_spec.startswith("muri:"):
        path = Path(trace_spec.split(":", 1)[1])
    named = muri_classes(muri_stage_times(path), model)
    stage_ms: list[tuple[str, int, float, float, float]] = []
    if any(m.startswith("share") for m in mechanisms):
        # GPU sharing reads each model's GPU and communication stages per job size.
        for gpus in sorted({int(g) for g in trace.gpus if g > 0}):
            try:
                by_model = muri_stage_times(path, num_gpu=gpus)
            except TraceError:
                continue
            stage_ms += [(name, gpus, *st) for name, st in by_model.items()]
    return named, stage_ms


def _checked_coda_conf(items: tuple[str, ...]) -> tuple[str, ...]:
    """The coda policy's coda.conf lines: :data:`CODA_CONF` under ``--coda-conf``."""
    coda_conf = _merge_conf(CODA_CONF + items)
    try:
        parse_config("\n".join(coda_conf), source="--coda-conf")
    except ConfigError as exc:
        raise CliError("bad --coda-conf", str(exc)) from exc
    return coda_conf


def _run_policies(
    trace: Trace,
    nodes: list[NodeSpec],
    wl: Workloads,
    model: JobModel,
    chosen: list[str],
    runs: list[tuple[str, SimParams]],
    show_bar: bool,
) -> tuple[list[RunResult], dict[str, str]]:
    """Every run of every chosen policy, and the baseline policy of each placement row."""
    results = []
    baseline_of: dict[str, str] = {}
    for name in chosen:
        for suffix, params in runs:
            label = name + suffix
            if suffix:
                baseline_of[label] = name
            if show_bar:
                with click.progressbar(
                    length=len(trace), label=f"{label:7s}", file=sys.stderr, width=30
                ) as bar:
                    r = simulate(
                        trace, nodes, wl, model, POLICIES[name], params, progress=bar.update
                    )
            else:
                r = simulate(trace, nodes, wl, model, POLICIES[name], params)
            r.policy = label
            results.append(r)
    return results, baseline_of


def _run_info(trace: Trace, nodes: list[NodeSpec], seed: int, params: SimParams) -> dict[str, Any]:
    """What was replayed on what: the head of the report."""
    w0, w1 = busy_window(trace)
    return {
        "trace": trace.name,
        "source": trace.source,
        "jobs": len(trace),
        "gpu_jobs": int(np.sum(trace.gpus > 0)),
        "cpu_jobs": int(np.sum(trace.gpus == 0)),
        "nodes": len(nodes),
        "gpus": sum(n.gpus for n in nodes),
        "cores": sum(n.cores for n in nodes),
        "window_s": [w0, w1],
        "seed": seed,
        "coda_conf": list(params.coda_conf),
        "starter_table": dict(params.starter_table),
        "multi_node_measured": params.multi_node_measured,
        "notes": trace.notes,
    }


def _emit_results(
    info: dict[str, Any],
    model: JobModel,
    chosen: list[str],
    rows: list[Summary],
    mechanisms: list[str],
    baseline_of: dict[str, str],
) -> None:
    """The ``--json`` document."""
    emit_json(
        {
            "schema_version": SCHEMA_VERSION,
            **info,
            "model": model.as_dict(),
            "policies": {p: POLICIES[p].description for p in chosen},
            "results": [r.as_dict() for r in rows],
            "placement": {"mechanisms": mechanisms, "baseline_of": baseline_of},
        }
    )


def _echo_results(
    info: dict[str, Any],
    chosen: list[str],
    rows: list[Summary],
    baseline_of: dict[str, str],
    halves: bool,
) -> None:
    click.echo(
        f"{info['trace']}: {info['jobs']:,} jobs ({info['gpu_jobs']:,} GPU, "
        f"{info['cpu_jobs']:,} CPU) on {info['nodes']:,} nodes, {info['gpus']:,} GPUs, "
        f"{info['cores']:,} cores; seed {info['seed']}"
    )
    if "coda" in chosen:
        click.echo(f"coda policy's coda.conf: {' '.join(info['coda_conf'])}")
        if info["starter_table"]:
            table = " ".join(f"{m}:{c}" for m, c in info["starter_table"].items())
            click.echo(f"coda policy's starter table (confidence {STARTER_CONFIDENCE:g}): {table}")
        if info["multi_node_measured"]:
            click.echo(
                "coda policy's coda-node: multi-node jobs' per-node figures merged into "
                "their profiles"
            )
    click.echo(render_table(rows, baseline_of=baseline_of or None))
    if halves:
        click.echo("")
        click.echo(render_second_half(rows, info["gpu_jobs"]))
    events = sum(r.events for r in rows)
    wall = sum(r.wall_s for r in rows)
    if events:
        click.echo(f"\n{events:,} events in {wall:.1f} s ({1e6 * wall / events:.1f} µs per event)")


def _check_membw_known(membw_known: float | None, mechanisms: list[str]) -> None:
    """--membw-known sizes only the membw placement run, as a share from 0 to 1."""
    if membw_known is None:
        return
    if "membw" not in mechanisms:
        raise CliError("--membw-known without --placement membw", "it only sizes that run")
    if not 0.0 <= membw_known <= 1.0:  # NaN too
        raise CliError(f"bad --membw-known {membw_known}", "a share from 0 to 1")


def _check_starter_table(table: bool, error: float | None) -> float:
    """--starter-table-error: a share from 0 to below 1, only with --starter-table."""
    if error is None:
        return 0.0
    if not table:
        raise CliError("--starter-table-error without --starter-table", "it sizes that table")
    if not 0.0 <= error < 1.0:  # NaN too
        raise CliError(f"bad --starter-table-error {error}", "a share from 0 to below 1")
    return error


def _job_model(param_items: tuple[str, ...]) -> JobModel:
    """The default job model with the --param overrides applied."""
    try:
        return JobModel().with_params(_params(param_items))
    except ValueError as exc:
        raise CliError("bad --param", str(exc)) from exc


def _loaded_trace(trace_spec: str, jobs: int | None) -> Trace:
    """The trace TRACE names, cut to its first ``jobs`` jobs when given."""
    try:
        trace = load_trace(trace_spec)
    except TraceError as exc:
        raise CliError(f"cannot load trace {trace_spec!r}", str(exc)) from exc
    if jobs is not None:
        trace = trace.head(jobs)
    return trace


def _base_params(
    rdt: bool,
    coda_conf: tuple[str, ...],
    stage_ms: list[tuple[str, int, float, float, float]],
    membw_known: float | None,
    multi_node_measured: bool = False,
) -> SimParams:
    """The run parameters every placement run starts from; all CPU jobs' bandwidth is
    known unless --membw-known says otherwise."""
    return SimParams(
        rdt=rdt,
        coda_conf=coda_conf,
        multi_node_measured=multi_node_measured,
        share_stage_ms=tuple(stage_ms),
        membw_known_fraction=1.0 if membw_known is None else membw_known,
    )


def _write_plots(
    trace: Trace, results: list[RunResult], plot_dir: Path, plot_format: str, as_json: bool
) -> None:
    """The --plot files, each named on stdout unless the output is JSON."""
    try:
        paths = plot(trace, results, plot_dir, plot_format)
    except ImportError as exc:
        raise CliError("cannot plot", f"{exc}; pip install matplotlib") from exc
    if not as_json:
        for p in paths:
            click.echo(f"wrote {p}")


@click.command("simulate", epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("trace_spec", metavar="TRACE")
@click.option(
    "-p",
    "--policy",
    "policies",
    multiple=True,
    type=click.Choice(list(POLICIES)),
    help="Policies to compare (repeatable; default: all).",
)
@click.option("--jobs", type=click.IntRange(min=1), help="Replay only the first N jobs.")
@click.option(
    "--nodes",
    "nodes_spec",
    help="'trace' (the trace's own inventory) or COUNT:CORES:GPUS. Default: sized by --load.",
)
@click.option(
    "--load",
    type=FiniteFloatRange(min=0.01, max=10.0),
    default=0.9,
    show_default=True,
    help="Size the cluster so the trace offers this GPU load (ignored with --nodes).",
)
@click.option(
    "--shape",
    default="96:8",
    show_default=True,
    help="CORES:GPUS per node when sizing a cluster for a trace without an inventory.",
)
@click.option(
    "--cpu-load",
    type=FiniteFloatRange(min=0.0, max=5.0),
    default=0.0,
    show_default=True,
    help="Add CPU-only jobs offering this share of the cluster's cores.",
)
@click.option("--seed", type=click.IntRange(min=0), default=1, show_default=True)
@click.option(
    "--param",
    "param_items",
    multiple=True,
    metavar="NAME=VALUE",
    help="Override a model assumption (see docs/evaluation.md).",
)
@click.option("--rdt", is_flag=True, help="Nodes have Intel RDT: the eliminator uses MBA.")
@click.option(
    "--coda-conf",
    "coda_conf_items",
    multiple=True,
    metavar="KEY=VALUE",
    help="A coda.conf setting for the coda policy's hook, over "
    f"{' '.join(CODA_CONF)} (repeatable).",
)
@click.option(
    "--placement",
    "placement_spec",
    metavar="LIST",
    help="Evaluate placement mechanisms against their baseline: a comma list of "
    f"{', '.join(PLACEMENTS)}.",
)
@click.option(
    "--membw-known",
    type=float,
    metavar="FRACTION",
    help="--placement membw: the share of CPU jobs whose memory bandwidth is known at "
    "submission, 0..1 (the others ask for nothing)  [default: 1]",
)
@click.option(
    "--starter-table",
    "with_table",
    is_flag=True,
    help="Import a starter table (each model's cores per GPU) into the coda policy's store "
    "before the run.",
)
@click.option(
    "--starter-table-error",
    "table_error",
    type=float,
    metavar="SHARE",
    help="Each starter-table figure off by this share, up or down by a fair coin per model "
    "and seed, 0..1 (exclusive)  [default: 0]",
)
@click.option(
    "--second-half",
    "halves",
    is_flag=True,
    help="Also show the measures over the second half of the GPU submissions (--json has "
    "them always).",
)
@click.option(
    "--multi-node-measured",
    is_flag=True,
    help="The coda policy's coda-node writes a job summary on each node a multi-node job "
    "leaves and merges its per-node figure (cores per GPU used) into the job's profile, "
    "which the hook gives later multi-node jobs (MultiNodeMinSamples, MultiNodeMargin).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--plot",
    "plot_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write utilisation and JCT plots here (needs matplotlib).",
)
@click.option(
    "--format", "plot_format", type=click.Choice(["png", "svg"]), default="png", show_default=True
)
def simulate_cmd(
    trace_spec: str,
    policies: tuple[str, ...],
    jobs: int | None,
    nodes_spec: str | None,
    load: float,
    shape: str,
    cpu_load: float,
    seed: int,
    param_items: tuple[str, ...],
    rdt: bool,
    coda_conf_items: tuple[str, ...],
    placement_spec: str | None,
    membw_known: float | None,
    with_table: bool,
    table_error: float | None,
    halves: bool,
    multi_node_measured: bool,
    as_json: bool,
    plot_dir: Path | None,
    plot_format: str,
) -> None:
    """Replay a GPU-cluster trace under Slurm-like scheduling, with and without CODA.

    Every policy sees the same trace, cluster and seed. The CODA policy runs the submit
    hook's own decide(), coda-node's allocator (online profiling) and its contention
    eliminator. Assumptions are named parameters (--param), documented in
    docs/evaluation.md.
    """
    mechanisms = _parse_placement(placement_spec)
    _check_membw_known(membw_known, mechanisms)
    error = _check_starter_table(with_table, table_error)
    model = _job_model(param_items)
    trace = _loaded_trace(trace_spec, jobs)
    nodes = _cluster(trace, nodes_spec, load, shape)
    if cpu_load > 0:
        trace = _with_cpu_jobs(trace, nodes, cpu_load, seed)
    named, stage_ms = _muri_inputs(trace, trace_spec, model, mechanisms)
    wl = assign_workloads(trace, model, seed, named_classes=named)
    coda_conf = _checked_coda_conf(coda_conf_items)
    base = _base_params(rdt, coda_conf, stage_ms, membw_known, multi_node_measured)
    if with_table:
        base = replace(base, starter_table=tuple(starter_table(wl, error, seed).items()))
    chosen = list(policies) or list(POLICIES)
    show_bar = sys.stderr.isatty() and not as_json
    results, baseline_of = _run_policies(
        trace, nodes, wl, model, chosen, placement_runs(base, mechanisms), show_bar
    )
    rows = [summarise(trace, r) for r in results]
    info = _run_info(trace, nodes, seed, base)
    if as_json:
        _emit_results(info, model, chosen, rows, mechanisms, baseline_of)
    else:
        _echo_results(info, chosen, rows, baseline_of, halves)
    if plot_dir is not None:
        _write_plots(trace, results, plot_dir, plot_format, as_json)
