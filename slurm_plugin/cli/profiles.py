"""``coda-slurm profiles``: list, show, import, export and delete workload profiles.

The store directory comes from ``--store PATH``, else from the ``ProfileStore=`` line of
coda.conf (``--conf PATH``, else ``$CODA_CONF``, else ``coda.conf`` beside ``$SLURM_CONF``,
else ``/etc/slurm/coda.conf``).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from dataclasses import replace as replace_fields
from pathlib import Path
from typing import Any

import click

from coda_common.cli import CliError, FiniteFloatRange, conf_option, emit_json, store_option
from coda_common.config.paths import default_conf_path
from coda_common.model.starter import (
    STARTER_CONFIDENCE,
    STARTER_SOURCE,
    STARTER_TABLE,
    StarterEntry,
    scaled_cores,
    starter_profiles,
)
from coda_common.signature import is_workload_name, name_problem
from coda_common.store.profiles import (
    Profile,
    ProfileFormatError,
    ProfileStore,
    StoreUnavailable,
    signature_problem,
    to_view,
    workload_of_signature,
)

EXPORT_FORMAT = "coda-profiles-export"
EXPORT_FORMAT_VERSION = 1

_META_KEY = "coda.profiles.options"


# --------------------------------------------------------------------------------------------
# Where the store is


def read_profile_store_key(conf_path: Path) -> str | None:
    """The ``ProfileStore=`` value of a coda.conf, or None if it has none.

    A minimal reader for when the full parser (coda_common.config.codaconf) is not available: Slurm
    style ``Key=Value`` words, keys case-insensitive, ``#`` starts a comment, the last
    occurrence wins.
    """
    try:
        text = conf_path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(
            f"cannot read {conf_path}", f"{exc.strerror}; pass --store PATH or --conf PATH"
        ) from exc
    except UnicodeDecodeError as exc:
        raise CliError(f"cannot read {conf_path}", f"not UTF-8 text: {exc}") from exc
    value: str | None = None
    for line in text.splitlines():
        for word in line.split("#", 1)[0].split():
            key, sep, val = word.partition("=")
            if sep and key.lower() == "profilestore":
                value = val.strip('"') or None
    return value


def _full_config_loader() -> Callable[[Path], Any] | None:
    """``coda_common.config.codaconf.load_config`` when that module exists, else None."""
    try:
        module = importlib.import_module("coda_common.config.codaconf")
    except ModuleNotFoundError as exc:
        if exc.name != "coda_common.config.codaconf":
            raise  # the module exists but is broken: that is a bug to see, not to skip
        return None
    loader = getattr(module, "load_config", None)
    return loader if callable(loader) else None


def resolve_store(store: Path | None, conf: Path | None) -> Path:
    """The profile store directory: ``store`` if given, else ``ProfileStore=`` from coda.conf
    (``conf``, else :func:`default_conf_path`)."""
    if store is not None:
        return store
    conf_path = conf if conf is not None else default_conf_path()
    load_config = _full_config_loader()
    if load_config is None:
        value = read_profile_store_key(conf_path)
    else:
        try:
            config = load_config(conf_path)
        except OSError as exc:
            raise CliError(
                f"cannot read {conf_path}", f"{exc.strerror}; pass --store PATH or --conf PATH"
            ) from exc
        except (
            ValueError
        ) as exc:  # coda_common.slurm.conffile.ConfigError, unreadable files included
            raise CliError(
                f"cannot load {conf_path}", f"{exc}; pass --store PATH or fix --conf PATH"
            ) from exc
        value = getattr(config, "profile_store", None)
    if not value:
        raise CliError(
            "no profile store configured",
            f"{conf_path} has no ProfileStore= line; pass --store PATH",
        )
    return Path(value)


@dataclass(frozen=True)
class _Options:
    store: Path | None
    conf: Path | None


def _open_store() -> ProfileStore:
    ctx = click.get_current_context()
    opts: _Options = ctx.meta.get(_META_KEY, _Options(None, None))
    return ProfileStore(resolve_store(opts.store, opts.conf))


def _load_all(store: ProfileStore) -> tuple[list[Profile], list[ProfileFormatError]]:
    good: list[Profile] = []
    bad: list[ProfileFormatError] = []
    try:
        for _path, item in store.iter_profiles():
            if isinstance(item, ProfileFormatError):
                bad.append(item)
            else:
                good.append(item)
    except StoreUnavailable as exc:
        cause = exc.__cause__
        why = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(exc)
        raise CliError(f"cannot read profile store {store.root}", why) from exc
    return good, bad


def _why(exc: OSError) -> str:
    # StoreLockTimeout is an OSError (TimeoutError) without strerror.
    return exc.strerror or str(exc)


def _warn_unusable(errors: Iterable[ProfileFormatError]) -> None:
    for exc in errors:
        click.echo(f"warning: skipped {exc}", err=True)


# --------------------------------------------------------------------------------------------
# Formatting


def format_age(age_s: float) -> str:
    """``42s ago``, ``5m ago``, ``3h ago``, ``12d ago`` (``in the future`` on clock skew)."""
    if age_s < -5:
        return "in the future"
    age_s = max(age_s, 0.0)
    for unit_s, suffix in ((86400, "d"), (3600, "h"), (60, "m")):
        if age_s >= unit_s:
            return f"{int(age_s // unit_s)}{suffix} ago"
    return f"{int(age_s)}s ago"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> str:
    """Columns padded to their widest cell; columns in ``right`` right-aligned (numbers)."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def _cores_cell(p: Profile) -> str:
    if p.multi_node_cpus_per_gpu is None or p.multi_node_cpus_per_gpu == p.cpus_per_gpu:
        return str(p.cpus_per_gpu)
    return f"{p.cpus_per_gpu} ({p.multi_node_cpus_per_gpu} multi-node)"


def _multi_node_cell(p: Profile) -> str:
    """``profiles show``'s multi-node line: the value an admin set, the measured figure."""
    parts = [] if p.multi_node_cpus_per_gpu is None else [f"{p.multi_node_cpus_per_gpu} per GPU"]
    m = p.multi_node
    if m is not None:
        floor = ""
        if m.is_floor:
            published = to_view(p).multi_node_measured_cores_per_gpu or 0.0
            floor = f"; starved, a floor: the hook looks at {published:.2f}"
        parts.append(
            f"measured {m.cores_per_gpu:.2f} per GPU (p90 of {len(m.figures_cores_per_gpu)} "
            f"per-node figures kept, {m.n_figures} merged{floor})"
        )
    return "; ".join(parts) or "-"


def _num(value: float) -> str:
    return f"{value:g}"


def _summary(p: Profile, store: ProfileStore) -> dict[str, Any]:
    return {
        "signature": p.signature,
        "workload": p.workload,
        "cpus_per_gpu": p.cpus_per_gpu,
        "multi_node_cpus_per_gpu": p.multi_node_cpus_per_gpu,
        "confidence": p.confidence,
        "n_samples": p.n_samples,
        "gpu_model": p.gpu_model,
        "updated_unix_s": p.updated_unix_s,
        "source": p.source,
        "path": str(store.path_for(p.signature)),
    }


# --------------------------------------------------------------------------------------------
# Commands


@click.group("profiles")
@store_option()
@conf_option("ProfileStore=")
@click.pass_context
def profiles(ctx: click.Context, store_path: Path | None, conf_path: Path | None) -> None:
    """List, show, import, export and delete workload profiles."""
    ctx.meta[_META_KEY] = _Options(store_path, conf_path)


@profiles.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_cmd(as_json: bool) -> None:
    """List all profiles, sorted by workload."""
    store = _open_store()
    found, errors = _load_all(store)
    found.sort(key=lambda p: (p.workload, p.signature))
    if as_json:
        emit_json(
            {
                "store": str(store.root),
                "profiles": [_summary(p, store) for p in found],
                "errors": [{"path": e.path, "problem": e.problem} for e in errors],
            }
        )
        return
    if not found:
        click.echo(f"No profiles in {store.root}.")
    else:
        now = time.time()
        rows = [
            [
                p.workload,
                p.signature,
                _cores_cell(p),
                f"{p.confidence:.2f}",
                str(p.n_samples),
                p.gpu_model or "-",
                format_age(now - p.updated_unix_s),
                p.source,
            ]
            for p in found
        ]
        headers = [
            "WORKLOAD",
            "SIGNATURE",
            "CORES/GPU",
            "CONFIDENCE",
            "SAMPLES",
            "GPU MODEL",
            "UPDATED",
            "SOURCE",
        ]
        click.echo(format_table(headers, rows, right={2, 3, 4}))
    _warn_unusable(errors)


def _find(store: ProfileStore, key: str) -> Profile:
    """The profile a SIGNATURE-OR-WORKLOAD argument names; CliError if none or ambiguous."""
    if signature_problem(key) is None:
        try:
            found = store.read(key)
        except ProfileFormatError as exc:
            raise CliError(f"profile {key!r} is unusable", str(exc)) from exc
        if found is None:
            raise CliError(f"no profile with signature {key!r}", f"no {store.path_for(key)}")
        return found
    candidates, _errors = _load_all(store)
    matches = sorted(
        (p for p in candidates if key in (p.workload, workload_of_signature(p.signature))),
        key=lambda p: p.signature,
    )
    if not matches:
        raise CliError(
            f"no profile for {key!r}",
            "not a stored signature or workload name; see `coda-slurm profiles list`",
        )
    if len(matches) > 1:
        now = time.time()
        rows = [
            [p.signature, _cores_cell(p), str(p.n_samples), format_age(now - p.updated_unix_s)]
            for p in matches
        ]
        click.echo(
            format_table(["SIGNATURE", "CORES/GPU", "SAMPLES", "UPDATED"], rows, right={1, 2}),
            err=True,
        )
        raise CliError(
            f"workload {key!r} matches {len(matches)} profiles",
            "pass one of the signatures above",
        )
    return matches[0]


@profiles.command("show")
@click.argument("key", metavar="SIGNATURE-OR-WORKLOAD")
@click.option("--json", "as_json", is_flag=True, help="The stored JSON object.")
def show_cmd(key: str, as_json: bool) -> None:
    """Show one profile with all its fields and samples."""
    store = _open_store()
    p = _find(store, key)
    if as_json:
        emit_json(p.to_json_dict())
        return
    now = time.time()
    _echo_fields(store, p, now)
    if p.samples:
        _echo_samples(p)
    if p.usage:
        _echo_usage(p, now)
    if p.cpu_usage is not None:
        # What MemBwSpreadGres reads: the workload as a CPU job.
        c = p.cpu_usage
        click.echo("")
        click.echo(
            f"As a CPU job: memory bandwidth {_gb(c.mem_bw_bytes_per_s_per_cpu)} per CPU over "
            f"{c.ticks} ticks (updated {format_age(now - c.updated_unix_s)})"
        )


def _echo_fields(store: ProfileStore, p: Profile, now: float) -> None:
    """The profile's own fields, one ``Name: value`` line each."""
    updated = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(p.updated_unix_s))
    kept = len(p.samples)
    fields = [
        ("Signature", p.signature),
        ("Workload", p.workload),
        ("File", str(store.path_for(p.signature))),
        ("Cores per GPU", str(p.cpus_per_gpu)),
        ("Multi-node", _multi_node_cell(p)),
        ("Confidence", f"{p.confidence:.2f}"),
        ("Samples", f"{p.n_samples} merged, {kept} kept"),
        ("GPU model", p.gpu_model or "-"),
        ("Updated", f"{updated} ({format_age(now - p.updated_unix_s)})"),
        ("Source", p.source),
        ("Fit", "-" if p.fit is None else json.dumps(p.to_json_dict()["fit"], sort_keys=True)),
    ]
    width = max(len(name) for name, _ in fields) + 1
    for name, value in fields:
        click.echo(f"{name + ':':<{width}} {value}")


def _echo_samples(p: Profile) -> None:
    """The profile's kept samples as a table, after a blank line."""
    click.echo("")
    rows = [
        [
            _num(s.cores),
            _num(s.throughput),
            str(s.gpus),
            str(s.nodes),
            s.gpu_model or "-",
            s.node or "-",
        ]
        for s in p.samples
    ]
    headers = ["CORES", "THROUGHPUT", "GPUS", "NODES", "GPU MODEL", "NODE"]
    click.echo(format_table(headers, rows, right={0, 1, 2, 3}))


def _echo_usage(p: Profile, now: float) -> None:
    """What the placement mechanisms read: one row per GPU model, after a blank line."""
    click.echo("")
    click.echo("Usage (means while running at the allocation, per GPU model):")
    rows = [
        [
            u.gpu_model or "-",
            f"{u.gpu_util * 100:.0f}%",
            f"{u.gpu_mem_bw_util * 100:.0f}%",
            "-" if u.pcie_bytes_per_s_per_gpu is None else _gb(u.pcie_bytes_per_s_per_gpu),
            "-" if u.iter_per_s_per_gpu is None else f"{u.iter_per_s_per_gpu:.3g}",
            str(u.ticks),
            format_age(now - u.updated_unix_s),
        ]
        for u in p.usage
    ]
    headers = ["GPU MODEL", "GPU UTIL", "MEM BW", "PCIE/GPU", "ITER/S/GPU", "TICKS", "UPDATED"]
    click.echo(format_table(headers, rows, right={1, 2, 3, 4, 5}))


def _gb(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:.2f} GB/s"


def _entries_of(doc: object, name: str) -> list[object]:
    """The profile objects of an import document (list, export object or single profile)."""
    if isinstance(doc, list):
        return doc
    if isinstance(doc, dict) and "profiles" in doc:
        fmt = doc.get("format", EXPORT_FORMAT)
        version = doc.get("format_version", EXPORT_FORMAT_VERSION)
        if fmt != EXPORT_FORMAT:
            raise CliError(f"cannot import {name}", f'"format" is {fmt!r}, not "{EXPORT_FORMAT}"')
        if version != EXPORT_FORMAT_VERSION:
            newer = isinstance(version, int) and version > EXPORT_FORMAT_VERSION
            raise CliError(
                f"cannot import {name}",
                f"export format_version {version!r}"
                + (" was written by a newer coda; upgrade coda-slurm" if newer else " is unknown"),
            )
        unknown = sorted(set(doc) - {"format", "format_version", "profiles"})
        if unknown:
            raise CliError(f"cannot import {name}", "unknown key(s) " + ", ".join(unknown))
        if not isinstance(doc["profiles"], list):
            raise CliError(f"cannot import {name}", '"profiles" must be a list')
        return doc["profiles"]
    if isinstance(doc, dict) and "signature" in doc:
        return [doc]  # one profile, e.g. from `profiles show --json`
    raise CliError(
        f"cannot import {name}",
        'expected a list of profiles or an object with a "profiles" list',
    )


MAX_IMPORT_BYTES = 256 << 20
"""Largest file `profiles import` reads (10,000 profiles export to a few MiB)."""


@profiles.command("import")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True, path_type=str))
@click.option("--replace", is_flag=True, help="Overwrite profiles whose signature exists.")
def import_cmd(file: str, replace: bool) -> None:
    """Import profiles from FILE (JSON; `-` for stdin).

    FILE holds a list of profile objects or {"profiles": [...]} (what `export` writes).
    Every entry is checked first: if any is invalid, nothing is written.
    """
    name = "<stdin>" if file == "-" else file
    entries = _entries_of(_read_document(file, name), name)
    store = _open_store()
    parsed = _parsed_entries(entries, name)

    existing = [p for p in parsed if os.path.lexists(store.path_for(p.signature))]
    if existing and not replace:
        for p in existing:
            click.echo(f"  exists: {p.signature} ({store.path_for(p.signature)})", err=True)
        raise CliError(
            f"nothing imported from {name}",
            f"{len(existing)} signature(s) already in the store; pass --replace to overwrite",
        )
    if not parsed:
        click.echo(f"No profiles in {name}; nothing imported.")
        return
    _write_all(store, parsed)
    replaced = f" ({len(existing)} replaced)" if existing else ""
    click.echo(f"Imported {len(parsed)} profile(s) into {store.root}{replaced}.")


def _read_document(file: str, name: str) -> object:
    """The JSON document in ``file`` (``-``: stdin), called ``name`` in errors."""
    try:
        if file == "-":
            data = sys.stdin.buffer.read(MAX_IMPORT_BYTES + 1)
        else:
            with open(file, "rb") as f:
                data = f.read(MAX_IMPORT_BYTES + 1)
    except OSError as exc:
        raise CliError(f"cannot read {name}", _why(exc)) from exc
    if len(data) > MAX_IMPORT_BYTES:
        raise CliError(
            f"cannot import {name}",
            f"larger than {MAX_IMPORT_BYTES >> 20} MiB; import it in parts (each import adds "
            "to the store)",
        )
    try:
        return json.loads(data)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise CliError(f"cannot import {name}", f"not valid JSON: {exc}") from exc
    except RecursionError:
        raise CliError(f"cannot import {name}", "not valid JSON (nested too deeply)") from None


def _parsed_entries(entries: list[object], name: str) -> list[Profile]:
    """Every entry as a Profile; when any is invalid or repeats a signature, each problem
    is echoed to stderr and CliError raised."""
    problems: list[str] = []
    parsed: list[Profile] = []
    first_entry: dict[str, int] = {}
    for i, entry in enumerate(entries, start=1):
        sig = entry.get("signature") if isinstance(entry, dict) else None
        label = f"entry {i}" + (f" ({sig})" if isinstance(sig, str) else "")
        try:
            p = Profile.from_json_dict(entry, label)
        except ProfileFormatError as exc:
            problems.append(str(exc))
            continue
        if p.signature in first_entry:
            problems.append(f"{label}: repeats the signature of entry {first_entry[p.signature]}")
            continue
        first_entry[p.signature] = i
        parsed.append(p)
    if problems:
        for problem in problems:
            click.echo(f"  {problem}", err=True)
        raise CliError(
            f"nothing imported from {name}",
            f"{len(problems)} of {len(entries)} entries are invalid",
        )
    return parsed


def _write_all(store: ProfileStore, parsed: list[Profile]) -> None:
    """Write every profile; on the first failure, say how many were written before it."""
    try:
        store.ensure_root()
    except OSError as exc:
        raise CliError(f"cannot create profile store {store.root}", _why(exc)) from exc
    for written, p in enumerate(parsed):
        try:
            store.write(p)
        except OSError as exc:
            raise CliError(
                f"cannot write {store.path_for(p.signature)}",
                f"{_why(exc)}; {written} of {len(parsed)} profiles were imported before this",
            ) from exc


@profiles.command("starter")
@click.option(
    "--scale",
    type=FiniteFloatRange(min=0.1, max=10.0),
    default=1.0,
    show_default=True,
    help="Multiply every figure (rounded up): how much faster your GPUs drain a CPU-fed "
    "pipeline than the GPU each figure was measured on.",
)
@click.option("--replace", is_flag=True, help="Also overwrite profiles that are not starter ones.")
@click.option("--list", "show", is_flag=True, help="Print the table; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="With --list: machine-readable output.")
def starter_cmd(scale: float, replace: bool, show: bool, as_json: bool) -> None:
    """Import the starter table: per-model cores per GPU from published measurements, as
    low-confidence global profiles (workload:*:NAME) that size a never-seen job naming the
    model (PriorsFromNames).

    Each figure is used as measured, on whatever GPU (see the admin guide). Existing
    starter profiles are rewritten; any other profile of the same signature is kept unless
    --replace.
    """
    now = time.time()
    rows = [
        (entry, name, scaled_cores(entry, scale))
        for entry in STARTER_TABLE
        for name in (entry.name, *entry.spellings)
    ]
    if show:
        _show_starter(rows, scale, as_json)
        return
    store = _open_store()
    parsed = starter_profiles(scale, now)
    kept: list[Profile] = []
    for p in parsed:
        try:
            existing = store.read(p.signature)
        except ProfileFormatError:
            existing = None  # unusable: replaced by the starter one
        if existing is not None and existing.source != STARTER_SOURCE and not replace:
            click.echo(
                f"  kept: {p.signature} ({existing.source}, {existing.cpus_per_gpu} per GPU)",
                err=True,
            )
            continue
        kept.append(p)
    _write_all(store, kept)
    skipped = len(parsed) - len(kept)
    note = f"; {skipped} kept as they were (--replace overwrites them)" if skipped else ""
    click.echo(
        f"Imported {len(kept)} starter profile(s) into {store.root} at confidence "
        f"{STARTER_CONFIDENCE:g}, scale {scale:g}{note}."
    )


def _show_starter(rows: list[tuple[StarterEntry, str, int]], scale: float, as_json: bool) -> None:
    if as_json:
        emit_json(
            {
                "scale": scale,
                "profiles": [
                    {
                        "signature": f"workload:*:{name}",
                        "cpus_per_gpu": cores,
                        "measured_cores_per_gpu": e.cores_per_gpu,
                        "gpu": e.gpu,
                        "host_cores": e.host_cores,
                        "source": e.source,
                        "note": e.note,
                    }
                    for e, name, cores in rows
                ],
            }
        )
        return
    table = format_table(
        ["NAME", "CORES/GPU", "MEASURED", "GPU", "HOST CORES", "SOURCE"],
        [
            [name, str(cores), str(e.cores_per_gpu), e.gpu, str(e.host_cores), _short_source(e)]
            for e, name, cores in rows
        ],
        right={1, 2, 4},
    )
    click.echo(table)
    notes = {e.name: e.note for e, _, _ in rows if e.note}
    for name, note in notes.items():
        click.echo(f"{name}: {note}")


def _short_source(entry: StarterEntry) -> str:
    return entry.source.split(",")[0] if entry.source.startswith("W. Xiao") else "coda, H200"


@profiles.command("export")
@click.argument(
    "file", default="-", type=click.Path(dir_okay=False, allow_dash=True, path_type=str)
)
def export_cmd(file: str) -> None:
    """Write all profiles as JSON to FILE (default `-`: stdout), in the form `import` reads."""
    store = _open_store()
    found, errors = _load_all(store)
    found.sort(key=lambda p: p.signature)
    doc = {
        "format": EXPORT_FORMAT,
        "format_version": EXPORT_FORMAT_VERSION,
        "profiles": [p.to_json_dict() for p in found],
    }
    text = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    _warn_unusable(errors)
    if file == "-":
        click.echo(text, nl=False)
        return
    try:
        # atomic=True: click writes a temp file and renames it, so an existing export is
        # never left half-overwritten.
        with click.open_file(file, "w", encoding="utf-8", atomic=True) as out:
            out.write(text)
    except OSError as exc:
        raise CliError(f"cannot write {file}", _why(exc)) from exc
    click.echo(f"Exported {len(found)} profile(s) to {file}.", err=True)


@profiles.command("share")
@click.argument("key", metavar="SIGNATURE-OR-WORKLOAD")
@click.option(
    "--as",
    "name",
    metavar="NAME",
    help="The shared profile's NAME (workload:*:NAME); default: the profile's workload.",
)
@click.option(
    "--replace", is_flag=True, help="Overwrite a shared profile that is not a starter one."
)
def share_cmd(key: str, name: str | None, replace: bool) -> None:
    """Copy one user's measured profile to the shared key workload:*:NAME, where every
    user's jobs reach it: with --comment=coda:workload=NAME, and as a prior for scripts that
    name NAME (PriorsFromNames). A starter profile of that NAME is replaced."""
    store = _open_store()
    p = _find(store, key)
    if name is None:
        if not p.signature.startswith("workload:"):
            # A script's workload label is its job name (train.sh, run.sh): as a prior it
            # would name every script that mentions it.  The model's name must be given.
            raise CliError(
                f"{p.signature} names no model", "pass --as NAME, the model its script trains"
            )
        name = p.workload
    problem = name_problem(name)
    if problem is None and not is_workload_name(name):
        problem = "must be at most 64 characters"
    if problem is not None:
        raise CliError(f"cannot share {p.signature} as {name!r}", f"NAME {problem}; pass --as NAME")
    signature = f"workload:*:{name}"
    if signature == p.signature:
        raise CliError(f"{p.signature} is already shared")
    try:
        existing = store.read(signature)
    except ProfileFormatError:
        existing = None
    if existing is not None and existing.source != STARTER_SOURCE and not replace:
        raise CliError(
            f"{signature} exists ({existing.source}, {existing.cpus_per_gpu} per GPU)",
            "pass --replace to overwrite it",
        )
    shared = replace_fields(p, signature=signature, workload=name, source=f"shared:{p.signature}")
    _write_all(store, [shared.validated(f"shared copy of {p.signature}")])
    click.echo(
        f"Shared {p.signature} as {signature}: {shared.cpus_per_gpu} cores per GPU, "
        f"confidence {shared.confidence:.2f}, {shared.n_samples} samples."
    )


@profiles.command("delete")
@click.argument("signature")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def delete_cmd(signature: str, yes: bool) -> None:
    """Delete the profile of SIGNATURE."""
    problem = signature_problem(signature)
    if problem:
        raise CliError(f"cannot delete {signature!r}", f"{problem}; see `coda-slurm profiles list`")
    store = _open_store()
    path = store.path_for(signature)
    if not os.path.lexists(path):
        raise CliError(f"no profile with signature {signature!r}", f"no {path}")
    try:
        p = store.read(signature)
        what = (
            f"{p.workload}, {p.cpus_per_gpu} cores/GPU, {p.n_samples} samples" if p else str(path)
        )
    except ProfileFormatError as exc:
        what = f"unusable: {exc.problem}"
    if not yes:
        click.confirm(f"Delete profile {signature} ({what})?", abort=True)
    try:
        deleted = store.delete(signature)
    except OSError as exc:
        raise CliError(f"cannot delete {path}", _why(exc)) from exc
    if not deleted:
        raise CliError(f"no profile with signature {signature!r}", "deleted meanwhile")
    click.echo(f"Deleted profile {signature} ({path}).")
