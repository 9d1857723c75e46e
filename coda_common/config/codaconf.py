"""``coda.conf``: CODA's configuration file, in Slurm's own syntax
(:mod:`coda_common.slurm.conffile`).

Syntax (as in ``cgroup.conf`` or ``gres.conf``)::

    # comment
    Mode=advise            # keys are case-insensitive
    ProfileStore="/var/lib/coda/profiles"
    Partitions=gpu,gpu-long  MinConfidence=0.9     # several pairs on one line are fine

``#`` starts a comment outside double quotes (``\\#`` is a literal ``#``); a line ending
in ``\\`` continues on the next.  Unknown keys are errors (``coda.conf:7: unknown key
...``); a key given twice keeps the last value and produces a warning.  Each key is
defined once, as a :class:`KeySpec` (its name, value syntax, default, parser and help) in
the module of its group under :mod:`coda_common.config.keys`, with its parser from
:mod:`coda_common.config.values`; each spec is one :class:`CodaConfig` field, and
:data:`CONFIG_KEYS` lists them.

Only :func:`load_config` touches files; everything else is pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from coda_common.config.keys import (
    KeySpec,
    contention,
    hook,
    node,
    placement,
    profiles,
    profiling,
    reserve,
)
from coda_common.config.values import Parser
from coda_common.signature import ScriptIgnore
from coda_common.slurm.conffile import ConfigError, logical_lines, read_text, tokenize

__all__ = [
    "CONFIG_KEYS",
    "RETIRED_KEYS",
    "CodaConfig",
    "KeySpec",
    "load_config",
    "parse_config",
]

# ---------------------------------------------------------------------- value parsing

_NODE_MECHANISMS: list[str] = ["cpuset", "quota", "rdt"]
"""The names NodeEnforce accepts: coda-node's built-in enforcement mechanisms, for a reader
without coda-node (the controller); coda-node's registry of mechanisms
(coda_node.enforce.mechanisms) sets the list it has with :func:`set_node_mechanisms`."""


def set_node_mechanisms(names: Iterable[str]) -> None:
    """The names NodeEnforce accepts from now on, in the order they are applied."""
    _NODE_MECHANISMS[:] = names


def _mechanisms(key: str, value: str) -> tuple[str, ...]:
    items = tuple(dict.fromkeys(v.strip().lower() for v in value.split(",") if v.strip()))
    bad = [v for v in items if v not in _NODE_MECHANISMS]
    if bad:
        raise ValueError(
            f"{key}: unknown mechanism {bad[0]!r} (choose from " + ", ".join(_NODE_MECHANISMS) + ")"
        )
    return items


# ------------------------------------------------------------------------- the keys

_SPEC = "coda.conf"
"""Where a :class:`CodaConfig` field keeps its :class:`KeySpec` (field metadata)."""


def _field(spec: KeySpec) -> Any:
    """The :class:`CodaConfig` field of ``spec``'s key: its default is the spec's default as
    read by its parser; :data:`CONFIG_KEYS` collects the specs."""
    return field(default=spec.parse(spec.name, spec.default), metadata={_SPEC: spec})


def _key(name: str, syntax: str, default: str, parse: Parser, help: str) -> Any:
    """The :class:`CodaConfig` field of a key whose parser lives in this module."""
    return _field(KeySpec(name, syntax, default, help, parse))


@dataclass(frozen=True, slots=True)
class CodaConfig:
    """Parsed ``coda.conf``.  Each field is one key: its name in the file, value syntax,
    default as written in the file, parser (which checks bounds) and help text."""

    profile_store: Path = _field(profiles.PROFILE_STORE)
    profile_publish: str = _field(profiles.PROFILE_PUBLISH)
    """``store`` or ``munge`` (lower case)."""
    profile_drop_dir: Path = _field(profiles.PROFILE_DROP_DIR)
    munge_socket: Path = _field(profiles.MUNGE_SOCKET)
    profile_drop_uids: tuple[int, ...] = _field(profiles.PROFILE_DROP_UIDS)
    profile_drop_hosts: tuple[str, ...] = _field(profiles.PROFILE_DROP_HOSTS)
    """Addresses, CIDR networks or host names; empty = the nodes scontrol lists."""
    profile_drop_ttl_s: int = _field(profiles.PROFILE_DROP_TTL_S)
    job_summary_dir: Path | None = _field(profiles.JOB_SUMMARY_DIR)
    """None = ``<ProfileStore>/jobs`` (:attr:`summary_dir`)."""
    job_summary_retention_days: int = _field(profiles.JOB_SUMMARY_RETENTION_DAYS)
    job_summary_max_mib: int = _field(profiles.JOB_SUMMARY_MAX_MIB)
    mode: str = _field(hook.MODE)
    """``enforce``, ``advise`` or ``off`` (lower case)."""
    user_value: str = _field(hook.USER_VALUE)
    """``keep``, ``lower`` or ``replace`` (lower case)."""
    user_message: str = _field(hook.USER_MESSAGE)
    """``all``, ``batch`` or ``none`` (lower case)."""
    min_cpus_per_gpu: int = _field(hook.MIN_CPUS_PER_GPU)
    max_cpus_per_gpu: int = _field(hook.MAX_CPUS_PER_GPU)
    default_cpus_per_gpu: int | Literal["share"] | None = _field(hook.DEFAULT_CPUS_PER_GPU)
    """A number, ``"share"`` (the node's cores per GPU, from slurm.conf) or None."""
    unprofiled_user_value: str = _field(hook.UNPROFILED_USER_VALUE)
    """``keep`` or ``raise``: a user's lower value is raised to the default without a profile."""
    min_confidence: float = _field(hook.MIN_CONFIDENCE)
    multi_node_gpu_cap: int = _field(hook.MULTI_NODE_GPU_CAP)
    multi_node_min_samples: int = _field(hook.MULTI_NODE_MIN_SAMPLES)
    multi_node_margin: float = _field(hook.MULTI_NODE_MARGIN)
    priors_from_names: bool = _field(hook.PRIORS_FROM_NAMES)
    prior_aliases: tuple[tuple[str, str], ...] = _field(hook.PRIOR_ALIASES)
    """``(alias, NAME)`` pairs, lower case (``PriorAliases``)."""
    hook_budget_ms: float = _field(hook.HOOK_BUDGET_MS)
    signature_ignore: ScriptIgnore = _field(hook.SIGNATURE_IGNORE)
    """What the workload signature leaves out of a script (``SignatureIgnore``)."""
    reload_interval_s: float = _field(hook.RELOAD_INTERVAL_S)
    partitions: tuple[str, ...] = _field(hook.PARTITIONS)
    """Managed partitions; empty = all."""
    exclude_partitions: tuple[str, ...] = _field(hook.EXCLUDE_PARTITIONS)
    log_level: str = _field(hook.LOG_LEVEL)
    hook_stats_file: Path | None = _field(hook.HOOK_STATS_FILE)
    """None = the hook keeps its counters in memory only."""
    decision_journal: Path | None = _field(hook.DECISION_JOURNAL)
    """None = no decision journal."""
    journal_max_bytes: int = _field(hook.JOURNAL_MAX_BYTES)
    slurm_conf: Path | None = _field(hook.SLURM_CONF)
    """None = the slurm.conf beside coda.conf (:func:`load_config` fills it in)."""

    # -- submit hook placement; every switch is off by default
    pcie_spread_gres: str | None = _field(placement.PCIE_SPREAD_GRES)
    """Count-only GRES PCIe-heavy jobs request one unit of; None = off."""
    pcie_heavy_bytes_per_s: float = _field(placement.PCIE_HEAVY_BYTES_PER_S)
    prefer_gpu_types: tuple[str, ...] = _field(placement.PREFER_GPU_TYPES)
    """Lower-case GPU types, fastest first; empty = no --prefer."""
    prefer_gpu_features: tuple[tuple[str, str], ...] = _field(placement.PREFER_GPU_FEATURES)
    """``(type, node feature)`` pairs; a type not listed is its own feature."""
    mem_bw_spread_gres: str | None = _field(placement.MEM_BW_SPREAD_GRES)
    """Count-only memory-bandwidth GRES of CPU-only jobs; None = off."""
    mem_bw_heavy_bytes_per_s_per_cpu: float = _field(placement.MEM_BW_HEAVY_BYTES_PER_S_PER_CPU)
    mem_bw_unit_bytes_per_s: float = _field(placement.MEM_BW_UNIT_BYTES_PER_S)
    cpu_job_partitions: tuple[str, ...] = _field(placement.CPU_JOB_PARTITIONS)
    """Partition list for CPU-only jobs submitted without one; empty = off."""

    # -- coda-slurm reserve: spare cores of GPU nodes for CPU jobs
    reserve_partitions: tuple[str, ...] = _field(reserve.RESERVE_PARTITIONS)
    """Spare CPU partitions coda-slurm reserve manages; empty = off."""
    reserve_interval_s: float = _field(reserve.RESERVE_INTERVAL_S)
    reserve_min_cpus: int = _field(reserve.RESERVE_MIN_CPUS)
    reserve_cpus_per_gpu: float | None = _field(reserve.RESERVE_CPUS_PER_GPU)
    """None = DefCpuPerGPU of the GPU partitions over the same nodes, else 4."""
    reserve_state_file: Path = _field(reserve.RESERVE_STATE_FILE)
    colocate_margin: float = _field(reserve.COLOCATE_MARGIN)

    # -- coda-node, the daemon on each GPU node
    node_name: str | None = _field(node.NODE_NAME)
    """None = the short host name."""
    node_state_dir: Path = _field(node.NODE_STATE_DIR)
    node_runtime_dir: Path = _field(node.NODE_RUNTIME_DIR)
    node_interval_s: float = _field(node.NODE_INTERVAL_S)
    node_root: Path = _field(node.NODE_ROOT)
    node_enforce: tuple[str, ...] = _key(
        "NodeEnforce",
        "list",
        "cpuset,quota,rdt",
        _mechanisms,
        "coda-node: mechanisms the daemon may use (cpuset, quota, rdt); empty = observe only, "
        "change nothing.",
    )
    node_progress_dir: Path = _field(node.NODE_PROGRESS_DIR)
    node_profile: bool = _field(profiling.NODE_PROFILE)
    node_probe_warmup_s: float = _field(profiling.NODE_PROBE_WARMUP_S)
    node_probe_settle_s: float = _field(profiling.NODE_PROBE_SETTLE_S)
    node_probe_measure_s: float = _field(profiling.NODE_PROBE_MEASURE_S)
    node_probe_max_jobs: int = _field(profiling.NODE_PROBE_MAX_JOBS)
    node_probe_budget_s: float = _field(profiling.NODE_PROBE_BUDGET_S)
    node_probe_max_slowdown_pct: float = _field(profiling.NODE_PROBE_MAX_SLOWDOWN_PCT)
    node_contention: bool = _field(contention.NODE_CONTENTION)
    node_contention_trigger_pct: float = _field(contention.NODE_CONTENTION_TRIGGER_PCT)
    node_contention_release_pct: float = _field(contention.NODE_CONTENTION_RELEASE_PCT)
    node_baseline_probe_after_s: float = _field(contention.NODE_BASELINE_PROBE_AFTER_S)
    node_baseline_reset_s: float = _field(contention.NODE_BASELINE_RESET_S)
    node_release_hold_s: float = _field(contention.NODE_RELEASE_HOLD_S)
    node_throttle_floor_pct: float = _field(contention.NODE_THROTTLE_FLOOR_PCT)
    node_throttle_min_effect_pct: float = _field(contention.NODE_THROTTLE_MIN_EFFECT_PCT)
    node_throttle_step_pct: float | None = _field(contention.NODE_THROTTLE_STEP_PCT)
    node_throttle_min_gain_pct: float = _field(contention.NODE_THROTTLE_MIN_GAIN_PCT)
    node_throttle_gpu_worth_cores: float | None = _field(contention.NODE_THROTTLE_GPU_WORTH_CORES)
    """None: :func:`coda_node.policy.contention.gpu_worth_cores` picks 10 or 14."""
    node_job_mem_bw: bool = _field(node.NODE_JOB_MEM_BW)
    node_metrics_port: int = _field(node.NODE_METRICS_PORT)
    node_metrics_address: str = _field(node.NODE_METRICS_ADDRESS)
    node_usage_flush_s: float = _field(node.NODE_USAGE_FLUSH_S)
    """0 = write usage records only when the job ends."""
    node_usage_min_ticks: int = _field(node.NODE_USAGE_MIN_TICKS)

    @property
    def summary_dir(self) -> Path:
        """Where job summaries are kept: ``JobSummaryDir``, else ``<ProfileStore>/jobs``."""
        return self.job_summary_dir or self.profile_store / "jobs"


CONFIG_KEYS: dict[str, KeySpec] = {
    spec.name: spec._replace(field=f.name)
    for f in fields(CodaConfig)
    for spec in (f.metadata[_SPEC],)
}
"""Every ``coda.conf`` key, in the order of :class:`CodaConfig`'s fields."""

RETIRED_KEYS: dict[str, str] = {
    "HookFastPath": "every GPU job is decided by the hook's Python side",
}
"""Keys coda.conf once had, with what holds now: a file that still sets one loads, with a
warning that the line has no effect (any value is accepted)."""


_CANONICAL = {key.lower(): key for key in CONFIG_KEYS}
_RETIRED = {key.lower(): key for key in RETIRED_KEYS}


def _unknown_key_message(key: str) -> str:
    import difflib  # error path only: keep the import off slurmctld's start-up

    close = difflib.get_close_matches(key.lower(), list(_CANONICAL), n=1)
    hint = f" (did you mean {_CANONICAL[close[0]]}?)" if close else ""
    return f"unknown key {key!r}{hint}"


def parse_config(text: str, source: str = "coda.conf") -> tuple[CodaConfig, list[str]]:
    """Parse the text of a ``coda.conf``: ``(config, warnings)``.

    Raises :class:`ConfigError` (``source:line: message``) for unknown keys, malformed
    lines and invalid values; warnings (same prefix) report keys given more than once,
    partitions both managed and excluded, and :data:`RETIRED_KEYS` (ignored).
    ``SlurmConf`` is returned as written (None when empty); :func:`load_config` resolves it.
    """
    seen: dict[str, tuple[str, int]] = {}
    warnings: list[str] = []
    for lineno, line in logical_lines(text, source):
        for key, value in tokenize(line, source, lineno):
            canonical = _CANONICAL.get(key.lower())
            if canonical is None and key.lower() in _RETIRED:
                retired = _RETIRED[key.lower()]
                warnings.append(
                    f"{source}:{lineno}: {retired} no longer has an effect "
                    f"({RETIRED_KEYS[retired]}); the line is ignored"
                )
                continue
            if canonical is None:
                raise ConfigError(source, lineno, _unknown_key_message(key))
            if canonical in seen:
                warnings.append(
                    f"{source}:{lineno}: {canonical} given again (first on line "
                    f"{seen[canonical][1]}); the last value wins"
                )
            seen[canonical] = (value, lineno)

    values: dict[str, object] = {}
    lines: dict[str, int] = {}
    for key, (value, lineno) in seen.items():
        spec = CONFIG_KEYS[key]
        try:
            values[spec.field] = spec.parse(key, value)
        except ValueError as exc:
            raise ConfigError(source, lineno, str(exc)) from None
        lines[key] = lineno
    config = CodaConfig(**values)
    _check_together(config, lines, source, warnings)
    return config, warnings


def _check_together(
    config: CodaConfig, lines: dict[str, int], source: str, warnings: list[str]
) -> None:
    """The rules that tie keys together; ``lines`` maps each key given to its line.
    Raises :class:`ConfigError`; appends warnings."""
    if config.max_cpus_per_gpu < config.min_cpus_per_gpu:
        line = max(lines.get("MaxCpusPerGpu", 0), lines.get("MinCpusPerGpu", 0)) or None
        raise ConfigError(
            source,
            line,
            f"MaxCpusPerGpu={config.max_cpus_per_gpu} is below "
            f"MinCpusPerGpu={config.min_cpus_per_gpu}",
        )
    default = config.default_cpus_per_gpu
    if isinstance(default, int) and not (
        config.min_cpus_per_gpu <= default <= config.max_cpus_per_gpu
    ):
        raise ConfigError(
            source,
            lines.get("DefaultCpusPerGpu"),
            f"DefaultCpusPerGpu={default} is outside "
            f"MinCpusPerGpu..MaxCpusPerGpu ({config.min_cpus_per_gpu}..{config.max_cpus_per_gpu})",
        )
    if config.unprofiled_user_value == "raise" and default is None:
        raise ConfigError(
            source,
            lines.get("UnprofiledUserValue"),
            "UnprofiledUserValue=raise needs DefaultCpusPerGpu (a number or share): "
            "there is nothing to raise a user's value to",
        )
    if config.node_contention_release_pct >= config.node_contention_trigger_pct:
        raise ConfigError(
            source,
            lines.get("NodeContentionReleasePct") or lines.get("NodeContentionTriggerPct"),
            f"NodeContentionReleasePct={config.node_contention_release_pct:g} must be below "
            f"NodeContentionTriggerPct={config.node_contention_trigger_pct:g} (hysteresis)",
        )
    unknown_types = [t for t, _ in config.prefer_gpu_features if t not in config.prefer_gpu_types]
    if unknown_types:
        raise ConfigError(
            source,
            lines.get("PreferGpuFeatures"),
            f"PreferGpuFeatures names GPU type {unknown_types[0]!r}, which is not in "
            f"PreferGpuTypes ({','.join(config.prefer_gpu_types) or 'empty'})",
        )
    for name in config.partitions:
        if name in config.exclude_partitions:
            warnings.append(
                f"{source}:{lines['ExcludePartitions']}: partition {name!r} is in both "
                "Partitions and ExcludePartitions; it is excluded"
            )


def load_config(path: Path, *, warnings: list[str] | None = None) -> CodaConfig:
    """Read and parse ``coda.conf`` at ``path``.

    Warnings (duplicate keys ...) are appended to ``warnings`` when a list is given.
    ``slurm_conf`` comes back resolved: ``<dir of path>/slurm.conf`` when not set, a
    relative value taken relative to ``path``'s directory.  Raises :class:`ConfigError`.
    """
    config, found = parse_config(read_text(path), str(path))
    if warnings is not None:
        warnings.extend(found)
    slurm_conf = config.slurm_conf
    if slurm_conf is None:
        slurm_conf = path.parent / "slurm.conf"
    elif not slurm_conf.is_absolute():
        slurm_conf = path.parent / slurm_conf
    return replace(config, slurm_conf=slurm_conf)
