"""The eliminator's settings, and how coda.conf's ``Node*`` keys make them. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from coda_common.config.codaconf import CodaConfig


@dataclass(frozen=True, slots=True)
class ContentionParams:
    """The eliminator's settings. These defaults are the mechanism's (a 25 % floor on 75/50/25 %
    quota steps, no hold test), which the unit tests exercise; coda-node and the simulator
    build theirs from coda.conf (:func:`params_from_config`), whose defaults differ
    (docs/config.md)."""

    enabled: bool = True
    trigger_slowdown: float = 0.10
    release_slowdown: float = 0.05
    smooth_ticks: int = 2
    baseline_min_ticks: int = 5
    baseline_ticks: int = 300
    contender_cpu_fraction: float = 0.25
    """A CPU job draws when it uses this share of its allocated cores..."""
    contender_mem_bw_bytes_per_s: float = 1e9
    """... or this much memory bandwidth."""
    quota_fractions: tuple[float, ...] = (0.75, 0.5, 0.25)
    mba_fractions: tuple[float, ...] = (0.7, 0.5, 0.3)
    overshoot: float = 1.25
    mba_correction_pct: int = 10
    floor_fraction: float = 0.25
    floor_mba_pct: int = 25
    step_s: float = 2.0
    release_hold_s: float = 30.0
    max_backoff: int = 8
    baseline_probe_after_s: float = 60.0
    """Contended training time without a baseline before a baseline probe (0 = never)."""
    baseline_probe_max_s: float = 20.0
    baseline_probe_every_s: float = 1800.0
    baseline_reset_s: float = 60.0
    """A job still slowed after this long with every CPU job beside it at its floor gets its
    rate there as its new baseline (0 = never): the old one no longer holds."""
    l3_way_fractions: tuple[float, ...] = (0.5, 0.25)
    """CAT ladder: the share of the cache's ways a throttled CPU job may allocate in."""
    floor_l3_ways: int = 2
    """Fewest L3 ways a CPU job is limited to (never below the hardware's minimum)."""
    min_effect_per_core: float = 0.05
    """Attribution: once a CPU job stepped to its floor has had ``smooth_ticks`` ticks to
    show, the DNN job it was taken for must be this share less slowed per core held back
    (0.05: holding back 4 cores must bring a 20 % slowdown to 16 % or less), unless it is
    back under the trigger already. Otherwise the job is *unproven*: given back whole as
    soon as no DNN job beside it is past the trigger, and if the DNN job then gets slower
    by less than this share of the trigger per core given back, it is left alone for
    ``retest_s``. 0 = no test: contenders are stepped by their draw alone."""
    retest_s: float = 1800.0
    """How long a CPU job found not to slow anyone is left alone before it may be tried
    again (it may have changed phase)."""
    min_gain_per_hold: float = 0.0
    """Benefit test of a whole hold (see the module docstring): 0.2 = holding one whole CPU
    job back must take 20 points off the slowdowns of the DNN jobs beside it. 0 = no test."""
    gpu_worth_cores: float = 0.0
    """Price test of a whole hold: the GPU time it gives back (each DNN job's GPUs times the
    points of slowdown taken off) times this must be at least the cores it holds back.
    0 = no test."""


def quota_ladder(step_fraction: float, floor_fraction: float) -> tuple[float, ...]:
    """The quota steps ``1 - step, 1 - 2 step, ...`` above the floor (which is the last)."""
    out: list[float] = []
    k = 1
    while round(1.0 - k * step_fraction, 6) > floor_fraction:
        out.append(round(1.0 - k * step_fraction, 6))
        k += 1
    return tuple(out)


GPU_WORTH_CORES = 14.0
"""The price of a hold when ``NodeThrottleGpuWorthCores`` is empty, on a node whose CPU jobs
are packed as Slurm places them (docs/evaluation.md, the eliminator's trade-off)."""
GPU_WORTH_CORES_SPREAD = 10.0
"""The same on a node whose memory-bound CPU jobs are spread by ``MemBwSpreadGres``: fewer of
them share a bus with a DNN job, and a lower price keeps the gain for less CPU work."""


def gpu_worth_cores(cfg: CodaConfig, *, membw_spread: bool = False) -> float:
    """``NodeThrottleGpuWorthCores``, or when it is empty the default for a node whose
    memory-bound CPU jobs are spread (``membw_spread``) or not."""
    if cfg.node_throttle_gpu_worth_cores is not None:
        return cfg.node_throttle_gpu_worth_cores
    return GPU_WORTH_CORES_SPREAD if membw_spread else GPU_WORTH_CORES


def params_from_config(cfg: CodaConfig, *, membw_spread: bool = False) -> ContentionParams:
    """The eliminator's settings from coda.conf's ``Node*`` keys; ``membw_spread``: this
    node carries ``MemBwSpreadGres`` (see :func:`gpu_worth_cores`)."""
    ladder = ContentionParams().quota_fractions
    if cfg.node_throttle_step_pct is not None:
        ladder = quota_ladder(
            cfg.node_throttle_step_pct / 100.0, cfg.node_throttle_floor_pct / 100.0
        )
    return ContentionParams(
        enabled=cfg.node_contention,
        trigger_slowdown=cfg.node_contention_trigger_pct / 100.0,
        release_slowdown=cfg.node_contention_release_pct / 100.0,
        release_hold_s=cfg.node_release_hold_s,
        baseline_probe_after_s=cfg.node_baseline_probe_after_s,
        baseline_reset_s=cfg.node_baseline_reset_s,
        floor_fraction=cfg.node_throttle_floor_pct / 100.0,
        floor_mba_pct=max(1, round(cfg.node_throttle_floor_pct)),
        step_s=max(2.0 * cfg.node_interval_s, 1.0),
        min_effect_per_core=cfg.node_throttle_min_effect_pct / 100.0,
        min_gain_per_hold=cfg.node_throttle_min_gain_pct / 100.0,
        gpu_worth_cores=gpu_worth_cores(cfg, membw_spread=membw_spread),
        quota_fractions=ladder,
    )
