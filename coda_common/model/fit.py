"""The CPU-demand model: how many cores a GPU training job needs per GPU.

The predictor is the one of Xiao et al., "Scheduling CPU for GPU-based Deep Learning jobs"
(SoCC'18 poster)::

    S(C) = P0 * log(C) + P1 * C    for C <  θ
    S(C) = P2                      for C >= θ

where ``S`` is training throughput with ``C`` cores and ``θ`` is the "sweet point" after
which more cores do not help. We fit it to a handful of (cores, throughput) probes, report
the *sweet spot* -- the fewest whole cores that reach ``plateau_fraction`` of the plateau
-- and the probability that they do.

Choices made here (the poster gives the form, not a fitting procedure):

* **Continuity at θ.** We impose ``P2 = P0*log(θ) + P1*θ``. Without it the squared error is
  a step function of θ (it only changes when θ crosses a probed core count), so θ is not
  identified between probes and the fit has four free parameters instead of three. With it,
  θ is where the rising curve meets the plateau, which lets two rising probes and one plateau
  probe place the knee between them.
* **P0, P1 >= 0.** Below θ the data stage is the bottleneck and adding cores cannot slow it
  down; non-negative coefficients keep ``S`` non-decreasing and concave, as a parallel data
  pipeline with diminishing returns is. A curve that clearly falls with more cores is
  refused instead of being bent into shape.
* **Profile over θ.** For a fixed θ the model is linear in (P0, P1), so each θ on a grid is a
  two-variable non-negative least-squares problem solved in closed form, vectorised over
  the grid; the best grid point is then refined with a bounded scalar search.
* **The answer weighs every shape that fits.** The best fit alone makes a knee between two
  probes look certain: probes at 1, 3, 6 and 12 cores reading 0.3, 1, 1, 1 fit a knee at
  1.1 cores exactly, and a knee at 2.9 cores just as well. So the sweet spot and its
  confidence come from a posterior over a family of shapes (knee position, log share,
  softness of the knee; :func:`_shape_posterior`), each weighted by its marginal likelihood
  with the scale and the noise integrated out. ``confidence`` is the posterior probability
  that the answer reaches ``plateau_fraction`` of the best throughput in the probed range;
  the answer is the fewest cores with probability 0.8, or, when that is more than a core
  (or 5 %) above the fewest with even odds, that much above them at the lower probability
  they have. In the example the answer is 3 cores (the lowest measured count on the
  plateau), not 2.
* **Exhaustive probes need no model.** When every whole core count of the range has been
  measured but at only two distinct counts (too few for three parameters),
  :func:`estimate_sweet_spot` reads the sweet spot off the table of mean throughputs
  instead, with a normal-approximation confidence (see :class:`SweetSpot`).
* **Experiment design.** :func:`next_probe` probes the largest and the smallest core count
  first, then the core count whose predicted throughput differs most between shapes that
  imply different sweet spots (the between-group variance of the prediction).

The multi-GPU rules come from Zhao et al., "CODA: Improving Resource Utilization by
Slimming and Co-locating DNN and CPU Jobs" (ICDCS'20), section I.C: on one node CPU demand
is linear in the number of GPUs; across nodes it is at most the one-node-two-GPU (1N2G)
demand.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from coda_common.model.curves import relative_throughput

if TYPE_CHECKING:  # the store imports nothing from here, but keep the model numpy-only at runtime
    from coda_common.store.profiles import Profile, Sample

__all__ = [
    "Fit",
    "InconsistentSamples",
    "InsufficientSamples",
    "ModelError",
    "SweetSpot",
    "cpus_per_gpu_for_request",
    "estimate_sweet_spot",
    "fit_curve",
    "is_censored",
    "next_probe",
    "normalise_samples",
    "refit_profile",
    "run_labels",
]


class ModelError(ValueError):
    """The samples cannot be turned into a CPU-demand prediction."""


class InsufficientSamples(ModelError):
    """Too few samples, or too few distinct core counts, to fit three parameters."""


class InconsistentSamples(ModelError):
    """The samples do not look like a throughput-vs-cores curve (too noisy, falling, ...)."""


# Number of θ values in the profile grid. The posterior and the sweet spot are evaluated
# on it, so its spacing ((max - min) / (N - 1) cores, ~0.06 core on a 24-core box) must stay
# well below one core.
_THETA_GRID_POINTS = 401

# Prior on the measurement noise, so that a fit passing exactly through three probes is not
# trusted as if the noise were zero. 3 % of the mean throughput is an assumption (probe
# throughput moves with data-loader warm-up, page cache and clock boost; none of the seed
# documents reports run-to-run noise), weighted as 3 pseudo-degrees of freedom: the
# residuals take over once there are several more samples than parameters.
_NOISE_FLOOR_REL = 0.03
_NOISE_PRIOR_DOF = 3.0

# Residual RMSE, relative to the mean throughput, above which the samples are refused:
# at that level the knee is lost in the noise and the "fit" would be a guess.
_MAX_RMSE_REL = 0.2

# A curve is refused as falling when throughput drops by more than this fraction of its
# mean across the probed range, and the drop is statistically clear (|t| above the
# threshold) -- real curves can sag a little past the knee (contention), that is fine.
_MAX_FALL_REL = 0.10
_FALL_T_STAT = 3.0

# Number of model parameters (P0, P1, θ; P2 follows from continuity).
_N_PARAMS = 3

# The shapes the answer weighs (_Shapes): knees on a geometric grid (3.5 % apart: 0.35 core
# at a knee of 10) from 1 core to twice the largest probe, uniform in log cores a priori
# (the SoCC'18 table's knees, 1 to 22 cores of 24, are spread evenly in log, not in cores);
# the log term's share of the rise at the knee, 0-0.6, uniform (the range
# bench/bench_model.py draws random curves from; the simulator's curves use 0.3: a larger
# share lets one probe at 1 core explain an earlier knee, so the cap errs towards more cores
# when only one probe is below the knee); and the knee's softness (curves.throughput_curve):
# 0 is the SoCC'18 predictor's hard knee, 0.2 puts the knee 13 % under the plateau. Most of
# the prior weight is on hard and mildly rounded knees, the form the sources describe; none
# of them measures how round a real knee is, so these weights are an assumption, chosen on
# synthetic curves: equal weights on 0-0.2 asked 0.4 core more on average on the benchmark's
# random curves and lost three of the twelve model classes of the fixed-probe target (3 %
# noise); softness up to 0.12 only answered 16 cores per GPU for a knee of softness 0.2
# whose 95 % point is 18 (tests/node/test_daemon_loop_fixture.py).
_KNEE_GRID_RATIO = 1.035
_LOG_SHARES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
_SOFTNESSES = (0.0, 0.06, 0.12, 0.2)
_SOFTNESS_PRIOR = (0.35, 0.3, 0.2, 0.15)

# The answer is the fewest cores that reach the plateau target with this probability, the
# default MinConfidence of the submit hook and min_confidence of coda-node's allocator...
_ANSWER_PROBABILITY = 0.8
# ... unless that is more than a tolerance (_tolerance_cores) above the fewest cores that
# reach it with even odds: then the probes leave the knee too uncertain, and the answer is
# that tolerance above the even-odds count, at the (low) probability it has, so that a
# caller probes again instead of paying for the uncertainty in cores.
_EVEN_ODDS = 0.5
# next_probe goes on past a confident answer while a count below it, untried, reaches the
# target with at least this probability: one more probe there may save a core in every
# later run of the job.
_WORTH_PROBING = 0.2

# Alternating least-squares rounds for the runs' scale factors (_run_scales); each is one
# profile over the θ grid (~0.3 ms for 64 samples). They settle in a few rounds in practice.
_SCALE_ITERATIONS = 50


@dataclass(frozen=True, slots=True)
class Fit:
    """A fitted CPU-demand curve for one GPU.

    ``p0``, ``p1``, ``p2`` and ``theta_cores`` are the best-fitting curve of the SoCC'18
    form. ``sweet_spot_cores`` and ``confidence`` come from every curve shape that could
    have produced the samples, weighted by how well it explains them (see
    :func:`_hit_probabilities`): ``confidence`` is the probability that
    ``sweet_spot_cores`` reach ``plateau_fraction`` of the best throughput within the
    probed range, and ``sweet_spot_cores`` is the fewest whole cores for which that
    probability is at least 0.8, unless that is more than ±1 core (or ±``unit_cores``, or
    5 %) above the fewest cores with even odds; then it is that much above them, with the
    lower probability they have. So a knee between two probes gives the larger of them (or
    the count in between that the probes pin down), and a knee the probes leave open gives
    a low confidence: never a confident count the samples cannot tell from a miss.
    ``plateau_throughput`` is ``P2``, the best throughput within the probed range: if the
    curve still rises at the largest probe, ``theta_cores`` equals that probe.
    ``r2`` is not meaningful for a flat curve (all variance is noise); use ``rmse_rel``.
    """

    p0: float
    p1: float
    p2: float
    theta_cores: float
    sweet_spot_cores: int
    plateau_fraction: float
    plateau_throughput: float
    confidence: float
    r2: float
    rmse_rel: float
    n_samples: int
    distinct_cores: int

    def predict(self, cores: float | np.ndarray) -> float | np.ndarray:
        """Predicted throughput at ``cores`` (same units as the fitted samples)."""
        c = np.asarray(cores, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            rising = self.p0 * np.log(c) + self.p1 * c
        out = np.where(c < self.theta_cores, rising, self.p2)
        if np.ndim(cores) == 0:
            return float(out)
        return out

    def to_dict(self) -> dict[str, float | int]:
        """All fields as plain numbers, for JSON."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class _Profile:
    """Best (P0, P1) for each θ on a grid, with the squared error left."""

    theta: np.ndarray
    p0: np.ndarray
    p1: np.ndarray
    sse: np.ndarray

    @property
    def p2(self) -> np.ndarray:
        return self.p0 * np.log(self.theta) + self.p1 * self.theta


def _solve(cores: np.ndarray, y: np.ndarray, theta: np.ndarray) -> _Profile:
    """Continuous piecewise fit for every θ at once: 2-variable NNLS in closed form.

    For a fixed θ, continuity makes every plateau sample a row ``[log θ, θ]`` and every
    rising sample a row ``[log C, C]``, so (P0, P1) is a linear least-squares problem.
    With two non-negative variables the optimum is the unconstrained one if feasible,
    otherwise the better of the two one-variable (clamped) optima -- the objective is convex.
    """
    below = cores[None, :] < theta[:, None]
    log_theta = np.log(theta)[:, None]
    x1 = np.where(below, np.log(cores)[None, :], log_theta)
    x2 = np.where(below, cores[None, :], theta[:, None])
    s11 = np.einsum("gi,gi->g", x1, x1)
    s12 = np.einsum("gi,gi->g", x1, x2)
    s22 = np.einsum("gi,gi->g", x2, x2)
    r1 = x1 @ y
    r2 = x2 @ y
    det = s11 * s22 - s12 * s12
    # Rank-deficient when every sample is on the plateau (all rows equal) or θ = 1.
    full_rank = det > 1e-9 * np.maximum(s11 * s22, 1e-300)
    safe_det = np.where(full_rank, det, 1.0)
    a_int = (s22 * r1 - s12 * r2) / safe_det
    b_int = (s11 * r2 - s12 * r1) / safe_det
    interior_ok = full_rank & (a_int >= 0.0) & (b_int >= 0.0)

    a_only = np.where(s11 > 0.0, np.maximum(r1, 0.0) / np.where(s11 > 0.0, s11, 1.0), 0.0)
    b_only = np.where(s22 > 0.0, np.maximum(r2, 0.0) / np.where(s22 > 0.0, s22, 1.0), 0.0)

    def sse_of(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        resid = y[None, :] - (a[:, None] * x1 + b[:, None] * x2)
        return np.einsum("gi,gi->g", resid, resid)

    sse_a = sse_of(a_only, np.zeros_like(a_only))
    sse_b = sse_of(np.zeros_like(b_only), b_only)
    use_a = sse_a <= sse_b
    p0 = np.where(use_a, a_only, 0.0)
    p1 = np.where(use_a, 0.0, b_only)
    sse = np.where(use_a, sse_a, sse_b)
    if np.any(interior_ok):
        sse_int = sse_of(np.where(interior_ok, a_int, 0.0), np.where(interior_ok, b_int, 0.0))
        take = interior_ok & (sse_int <= sse)
        p0 = np.where(take, a_int, p0)
        p1 = np.where(take, b_int, p1)
        sse = np.where(take, sse_int, sse)
    return _Profile(theta=theta, p0=p0, p1=p1, sse=sse)


def _theta_grid(lo_cores: float, hi_cores: float) -> np.ndarray:
    if hi_cores <= lo_cores:
        return np.array([lo_cores])
    return np.linspace(lo_cores, hi_cores, _THETA_GRID_POINTS)


def _tolerance_cores(sweet_spot_cores: int, unit_cores: float = 1.0) -> float:
    return max(unit_cores, 0.05 * sweet_spot_cores)


def _as_arrays(cores: Sequence[float], throughput: Sequence[float]) -> tuple[np.ndarray, ...]:
    c = np.asarray(cores, dtype=float).ravel()
    y = np.asarray(throughput, dtype=float).ravel()
    if c.shape != y.shape:
        raise ModelError(f"{c.size} core counts but {y.size} throughput values")
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(y))):
        raise ModelError("samples contain NaN or infinity")
    if np.any(c <= 0.0):
        raise ModelError("core counts must be positive")
    if np.any(y < 0.0):
        raise ModelError("throughput must not be negative")
    return c, y


def _check_not_falling(c: np.ndarray, y_rel: np.ndarray) -> None:
    """Refuse curves that clearly lose throughput as cores are added."""
    x = np.log(c)
    x_c = x - x.mean()
    sxx = float(x_c @ x_c)
    if sxx <= 0.0 or c.size < 3:
        return
    slope = float(x_c @ (y_rel - y_rel.mean())) / sxx
    resid = y_rel - y_rel.mean() - slope * x_c
    se = math.sqrt(max(float(resid @ resid), 1e-300) / (c.size - 2) / sxx)
    fall_rel = -slope * (x.max() - x.min())
    if fall_rel > _MAX_FALL_REL and slope / se < -_FALL_T_STAT:
        raise InconsistentSamples(
            f"throughput falls by {fall_rel:.0%} of its mean from {c.min():g} to "
            f"{c.max():g} cores; the job is not limited by CPU the way the model assumes, "
            "or the probes were disturbed"
        )


def fit_curve(
    cores: Sequence[float],
    throughput: Sequence[float],
    *,
    plateau_fraction: float = 0.95,
    min_distinct_cores: int = 3,
    unit_cores: float = 1.0,
) -> Fit:
    """Fit the SoCC'18 predictor to (cores, throughput) samples of one job.

    ``unit_cores`` is the step the answer may pay for certainty (see :class:`Fit`): a
    ``g``-GPU job fitted in its own units is answered to a core per GPU, ``unit_cores=g``.

    Raises :class:`InsufficientSamples` for fewer than three samples or fewer than
    ``min_distinct_cores`` distinct core counts (the model has three free parameters), and
    :class:`InconsistentSamples` when the residual noise exceeds 20 % of the mean throughput
    or the curve clearly falls with more cores. The sweet spot is never below the smallest
    probed core count (rounded up): the model does not extrapolate downwards.
    """
    if not 0.0 < plateau_fraction <= 1.0:
        raise ModelError(f"plateau_fraction must be in (0, 1], got {plateau_fraction}")
    if min_distinct_cores < _N_PARAMS:
        raise ModelError(f"min_distinct_cores must be at least {_N_PARAMS} (three parameters)")
    c, y = _as_arrays(cores, throughput)
    distinct = int(np.unique(c).size)
    if c.size < _N_PARAMS or distinct < min_distinct_cores:
        raise InsufficientSamples(
            f"{c.size} samples at {distinct} distinct core counts; need at least "
            f"{max(_N_PARAMS, min_distinct_cores)} samples at {min_distinct_cores} core counts"
        )
    scale = float(y.mean())
    if scale <= 0.0:
        raise InconsistentSamples("every throughput sample is zero")
    y_rel = y / scale
    _check_not_falling(c, y_rel)

    lo, hi = float(c.min()), float(c.max())
    prof = _solve(c, y_rel, _theta_grid(lo, hi))
    best = int(np.argmin(prof.sse))
    theta_hat = _refine_theta(c, y_rel, prof.theta, best)
    point = _solve(c, y_rel, np.array([theta_hat]))
    if not np.all(np.isfinite([point.p0[0], point.p1[0], point.sse[0]])):
        raise InconsistentSamples("the least-squares fit did not converge")

    sse = float(point.sse[0])
    rmse_rel = math.sqrt(sse / c.size)
    if rmse_rel > _MAX_RMSE_REL:
        raise InconsistentSamples(
            f"residual noise is {rmse_rel:.0%} of the mean throughput (limit "
            f"{_MAX_RMSE_REL:.0%}); re-measure with longer probes"
        )
    sst = float(((y_rel - y_rel.mean()) ** 2).sum())
    r2 = 1.0 - sse / sst if sst > 0.0 else 1.0

    ks, hit_probability = _hit_probabilities(c, y, plateau_fraction)
    sweet, confidence = _answer(ks, hit_probability, unit_cores)

    p0 = float(point.p0[0]) * scale
    p1 = float(point.p1[0]) * scale
    p2 = float(point.p2[0]) * scale
    return Fit(
        p0=p0,
        p1=p1,
        p2=p2,
        theta_cores=theta_hat,
        sweet_spot_cores=sweet,
        plateau_fraction=plateau_fraction,
        plateau_throughput=p2,
        confidence=confidence,
        r2=r2,
        rmse_rel=rmse_rel,
        n_samples=int(c.size),
        distinct_cores=distinct,
    )


@dataclass(frozen=True, slots=True)
class _Shapes:
    """The curve shapes the answer weighs, knee-major (knee ascending), with the log of each
    one's relative throughput (plateau 1) at 1, 2, ..., ``width`` cores."""

    knee_cores: np.ndarray
    log_share: np.ndarray
    softness: np.ndarray
    log_prior: np.ndarray
    """Up to a constant: the knee grid is uniform in log cores, so knees weigh the same."""
    log_at_cores: np.ndarray
    """(shapes, width): column ``k - 1`` is ``k`` cores."""

    @property
    def width(self) -> int:
        return int(self.log_at_cores.shape[1])

    def log_at(self, rows: int, cores: np.ndarray) -> np.ndarray:
        """Log relative throughput of the first ``rows`` shapes at ``cores`` (any positive
        counts): whole counts from the table, others computed."""
        whole = np.abs(cores - np.rint(cores)) <= 1e-9
        if np.all(whole):
            return self.log_at_cores[:rows, np.rint(cores).astype(int) - 1]
        rel = relative_throughput(
            self.knee_cores[:rows, None],
            self.log_share[:rows, None],
            self.softness[:rows, None],
            cores[None, :],
        )
        return np.log(np.maximum(rel, _TINY_THROUGHPUT))


_TINY_THROUGHPUT = 1e-12
"""Relative throughput below which a shape's log is clamped (a pure-log rise is 0 at 1 core)."""

_SHAPES: list[_Shapes] = []
"""The one table, built on first use and widened when a fit needs more cores: a few MB for
the 128 columns a 128-core node's probes need, which coda-node keeps."""


def _shapes(max_cores: int) -> _Shapes:
    """The shape table with at least ``max_cores`` columns (a power of two, at least 32)."""
    if _SHAPES and _SHAPES[0].width >= max_cores:
        return _SHAPES[0]
    width = 32
    while width < max_cores:
        width *= 2
    n_knees = math.ceil(math.log(2.0 * width) / math.log(_KNEE_GRID_RATIO)) + 1
    knee, share, soft = np.meshgrid(
        _KNEE_GRID_RATIO ** np.arange(n_knees), _LOG_SHARES, _SOFTNESSES, indexing="ij"
    )
    _, _, soft_prior = np.meshgrid(np.arange(n_knees), _LOG_SHARES, _SOFTNESS_PRIOR, indexing="ij")
    knee, share, soft = knee.ravel(), share.ravel(), soft.ravel()
    table = relative_throughput(
        knee[:, None], share[:, None], soft[:, None], np.arange(1.0, width + 1.0)[None, :]
    )
    log_table = np.log(np.maximum(table, _TINY_THROUGHPUT))
    shapes = _Shapes(knee, share, soft, np.log(soft_prior.ravel()), log_table)
    _SHAPES[:] = [shapes]
    return shapes


@dataclass(frozen=True, slots=True)
class _ShapePosterior:
    """The first ``rows`` shapes of ``shapes`` weighted by how well they explain samples."""

    shapes: _Shapes
    rows: int
    weight: np.ndarray
    """(rows,), summing to 1."""
    log_level: np.ndarray
    """(rows,): each shape's fitted log scale (log throughput = this + log shape)."""
    noise_var: float
    """Pooled variance of the log residuals under the best shape, with the prior."""

    def first_hits(self, ks: np.ndarray, top_cores: float, plateau_fraction: float) -> np.ndarray:
        """Per shape, the index into ``ks`` (ascending whole counts, the last at or above
        ``top_cores``) of the fewest that reach ``plateau_fraction`` of the shape at
        ``top_cores`` (the shapes never fall, so that is their best up to there)."""
        log_top = self.shapes.log_at(self.rows, np.array([top_cores]))
        log_ks = self.shapes.log_at_cores[: self.rows, ks - 1]
        hits = log_ks >= math.log(plateau_fraction) + log_top - 1e-12
        return np.argmax(hits, axis=1)


def _shape_posterior(c: np.ndarray, y: np.ndarray, top_cores: float) -> _ShapePosterior:
    """Every shape of :func:`_shapes` with a knee up to twice ``top_cores``, weighted by its
    prior (uniform over the grid) times its marginal likelihood for samples ``(c, y)``.

    The samples are taken as ``P * shape(C) * exp(e)`` with ``e`` Gaussian, the scale ``P``
    flat in log and the noise variance scaled-inverse-chi-squared with the prior level and
    weight of :data:`_NOISE_FLOOR_REL` and :data:`_NOISE_PRIOR_DOF`; both integrate out in
    closed form, leaving ``(ν0·s0² + SSE)^(-(n - 1 + ν0) / 2)`` with SSE the squared
    deviation of the log residuals from their mean. Integrating over the shapes, rather
    than trusting the best fit, is what keeps a knee that falls between two probes from
    looking certain.
    """
    shapes = _shapes(math.ceil(top_cores - 1e-9))
    rows = max(
        int(np.searchsorted(shapes.knee_cores, 2.0 * top_cores, side="right")),
        len(_LOG_SHARES) * len(_SOFTNESSES),  # at least the flat shapes (knee at 1 core)
    )
    log_y = np.log(np.maximum(y, 1e-3 * float(y.max())))
    dev = log_y[None, :] - shapes.log_at(rows, c)
    level = dev.mean(axis=1)
    sse = ((dev - level[:, None]) ** 2).sum(axis=1)
    prior_ss = _NOISE_PRIOR_DOF * _NOISE_FLOOR_REL**2
    log_w = shapes.log_prior[:rows] - 0.5 * (c.size - 1 + _NOISE_PRIOR_DOF) * np.log(prior_ss + sse)
    w = np.exp(log_w - log_w.max())
    noise_var = (float(sse.min()) + prior_ss) / (max(c.size - 1, 0) + _NOISE_PRIOR_DOF)
    return _ShapePosterior(shapes, rows, w / w.sum(), level, noise_var)


def _hit_probabilities(
    c: np.ndarray, y: np.ndarray, plateau_fraction: float
) -> tuple[np.ndarray, np.ndarray]:
    """Whole core counts from the smallest probe to the largest (both rounded up), and for
    each the probability (:func:`_shape_posterior`) that it reaches ``plateau_fraction`` of
    the best throughput within the probed range. Non-decreasing, 1 at the last count."""
    lo, hi = float(c.min()), float(c.max())
    k_first = max(1, math.ceil(lo - 1e-9))
    ks = np.arange(k_first, max(k_first, math.ceil(hi - 1e-9)) + 1)
    post = _shape_posterior(c, y, hi)
    first = post.first_hits(ks, hi, plateau_fraction)
    by_first = np.bincount(first, weights=post.weight, minlength=ks.size)
    return ks, np.clip(np.cumsum(by_first), 0.0, 1.0)


def _answer(ks: np.ndarray, hit_probability: np.ndarray, unit_cores: float) -> tuple[int, float]:
    """``(cores, probability they reach the target)`` from :func:`_hit_probabilities`'
    answer (non-decreasing in cores, 1 at the largest probe): the fewest with
    :data:`_ANSWER_PROBABILITY`, at most a tolerance above the fewest with even odds."""
    sure = int(np.argmax(hit_probability >= _ANSWER_PROBABILITY - 1e-12))
    even = int(np.argmax(hit_probability >= _EVEN_ODDS - 1e-12))
    cap = float(ks[even]) + _tolerance_cores(int(ks[even]), unit_cores)
    i = min(sure, int(np.searchsorted(ks, cap + 1e-9, side="right")) - 1)
    return int(ks[i]), float(hit_probability[i])


def _refine_theta(c: np.ndarray, y: np.ndarray, grid: np.ndarray, best: int) -> float:
    """Polish the best grid θ with a bounded scalar search between its neighbours."""
    if grid.size == 1:
        return float(grid[0])
    lo = float(grid[max(best - 1, 0)])
    hi = float(grid[min(best + 1, grid.size - 1)])

    def sse_at(t: float) -> float:
        return float(_solve(c, y, np.array([t])).sse[0])

    x, fx = _golden_min(sse_at, lo, hi, xatol=1e-5)
    grid_theta = float(grid[best])
    if fx <= sse_at(grid_theta):
        return x
    return grid_theta


_INV_PHI = (math.sqrt(5.0) - 1.0) / 2.0


def _golden_min(
    f: Callable[[float], float], lo: float, hi: float, *, xatol: float
) -> tuple[float, float]:
    """Golden-section search for the minimum of ``f`` on [lo, hi] (unimodal there), to
    ``xatol``: (x, f(x)). Ours rather than scipy.optimize's, which would cost the node
    daemon some 45 MB of resident memory for one bounded scalar search."""
    a, b = lo, hi
    c, d = b - _INV_PHI * (b - a), a + _INV_PHI * (b - a)
    fc, fd = f(c), f(d)
    while b - a > xatol:
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _INV_PHI * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + _INV_PHI * (b - a)
            fd = f(d)
    x = (a + b) / 2.0
    return x, f(x)


def _norm_cdf(z: float) -> float:
    """Standard normal CDF (scipy.stats would cost the daemon ~70 MB to import)."""
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


@dataclass(frozen=True, slots=True)
class SweetSpot:
    """The sweet spot of one job's samples, by :func:`estimate_sweet_spot`.

    ``cores`` is in the units of the samples' cores (whole cores, at least 1). ``method`` is
    ``"fit"`` (:func:`fit_curve`, whose :class:`Fit` is ``fit``) or ``"table"`` (every whole
    core count of the range was measured; ``fit`` is None). ``plateau_throughput`` is
    ``Fit.plateau_throughput``, or the table's largest mean throughput.
    """

    cores: int
    confidence: float
    method: str
    plateau_throughput: float
    fit: Fit | None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values; ``fit`` nested as :meth:`Fit.to_dict` or None."""
        return {
            "cores": int(self.cores),
            "confidence": float(self.confidence),
            "method": self.method,
            "plateau_throughput": float(self.plateau_throughput),
            "fit": None if self.fit is None else self.fit.to_dict(),
        }


def _is_whole(c: np.ndarray) -> bool:
    return bool(np.all(np.abs(c - np.rint(c)) <= 1e-9))


def _table_sweet_spot(c: np.ndarray, y: np.ndarray, plateau_fraction: float) -> SweetSpot:
    """Sweet spot from per-count means (whole core counts only).

    The noise is the pooled within-count standard deviation, at least the prior floor of
    :data:`_NOISE_FLOOR_REL` times the mean throughput (the floor alone without replicates).
    Treating the largest mean ``M`` as fixed, ``confidence`` is the normal-approximation
    probability that the chosen count's mean reaches ``plateau_fraction * M`` and every
    smaller count's mean stays below it (product over counts, standard error sigma/sqrt(n)).
    """
    counts = np.rint(c).astype(int)
    ks, inverse, n_k = np.unique(counts, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=y)
    means = sums / n_k
    resid = y - means[inverse]
    dof = c.size - ks.size
    pooled_sd = math.sqrt(float(resid @ resid) / dof) if dof > 0 else 0.0
    sigma = max(pooled_sd, _NOISE_FLOOR_REL * float(y.mean()))
    best = float(means.max())
    threshold = plateau_fraction * best
    idx = int(np.argmax(means >= threshold - 1e-12 * abs(threshold)))
    z = (means - threshold) / (sigma / np.sqrt(n_k))
    confidence = _norm_cdf(float(z[idx])) * math.prod(_norm_cdf(-float(v)) for v in z[:idx])
    return SweetSpot(
        cores=max(1, int(ks[idx])),
        confidence=float(np.clip(confidence, 0.0, 1.0)),
        method="table",
        plateau_throughput=best,
        fit=None,
    )


def estimate_sweet_spot(
    cores: Sequence[float],
    throughput: Sequence[float],
    *,
    plateau_fraction: float = 0.95,
    min_cores: int | None = None,
    max_cores: int | None = None,
    unit_cores: float = 1.0,
) -> SweetSpot:
    """The sweet spot of (cores, throughput) samples, replicates allowed.

    If every sample is at a whole core count in [``min_cores``, ``max_cores``] (defaults: the
    smallest and largest sample, rounded), every whole count there has a sample, and there
    are fewer than three distinct counts (or :func:`fit_curve` finds too few samples), the
    answer is read off the table of mean throughputs (``method="table"``, see
    :func:`_table_sweet_spot`). Otherwise it is :func:`fit_curve`'s (``method="fit"``).

    Raises :class:`InsufficientSamples` for fewer than two distinct core counts, when every
    throughput is zero, or when the fit has too few samples and the table does not cover the
    range; :class:`InconsistentSamples` from :func:`fit_curve` propagates.
    """
    if not 0.0 < plateau_fraction <= 1.0:
        raise ModelError(f"plateau_fraction must be in (0, 1], got {plateau_fraction}")
    c, y = _as_arrays(cores, throughput)
    distinct = int(np.unique(c).size)
    if distinct < 2:
        raise InsufficientSamples(
            f"{c.size} samples at {distinct} distinct core counts; need at least 2 core counts"
        )
    if not np.any(y > 0.0):
        raise InsufficientSamples("every throughput sample is zero")
    lo = max(1, round(float(c.min()))) if min_cores is None else min_cores
    hi = max(lo, round(float(c.max()))) if max_cores is None else max_cores
    if lo < 1 or hi < lo:
        raise ModelError(f"need 1 <= min_cores <= max_cores, got {lo}..{hi}")
    # Every sample at a whole count within [lo, hi], and all of those counts sampled.
    covered = (
        _is_whole(c)
        and bool(np.all((np.rint(c) >= lo) & (np.rint(c) <= hi)))
        and int(np.unique(np.rint(c)).size) == hi - lo + 1
    )
    if covered and distinct < _N_PARAMS:
        return _table_sweet_spot(c, y, plateau_fraction)
    try:
        fit = fit_curve(c, y, plateau_fraction=plateau_fraction, unit_cores=unit_cores)
    except InsufficientSamples:
        if covered:
            return _table_sweet_spot(c, y, plateau_fraction)
        raise
    return SweetSpot(
        cores=fit.sweet_spot_cores,
        confidence=fit.confidence,
        method="fit",
        plateau_throughput=fit.plateau_throughput,
        fit=fit,
    )


EXPLORE_FACTOR = 1.5
"""A censored profile asks for this many times the largest per-GPU count measured."""
CENSOR_MARGIN = 0.1
"""A plateau counts as seen when a count this share past the knee (at least a core past
it) was measured."""


def is_censored(profile: Profile) -> bool:
    """Whether the profile's sweet spot is only a lower bound: the job's throughput was
    still rising at the most cores any run had, so the workload may need more."""
    return bool(profile.fit is not None and profile.fit.get("censored"))


def refit_profile(
    profile: Profile,
    *,
    plateau_fraction: float = 0.95,
    explore_factor: float = EXPLORE_FACTOR,
) -> Profile:
    """Re-estimate a stored profile from its samples; a ``refit`` for ``merge_samples``.

    Uses the single-node samples (``nodes == 1``) of one GPU count, the one whose runs
    measured the most cores per GPU, in that count's own cores (the fit is not
    scale-free), with the runs among them (:func:`run_labels`) put on one scale (each run's
    samples are relative to that run's own top), and :func:`estimate_sweet_spot` over
    their core range, with confidence judged ±1 core per GPU; the answer is divided back
    per GPU (see :func:`_spot_of_widest_gpu_count`). Sets ``cpus_per_gpu``, ``confidence``
    and ``fit`` (JSON: ``method``, ``fit_gpus``, ``sweet_spot_cores_per_gpu``,
    ``plateau_throughput`` per GPU in the widest run's units, ``n_used``, ``runs``, plus
    :meth:`Fit.to_dict`'s keys for the ``"fit"`` method). Never raises for unusable
    samples: a merge must still store them, so the profile comes back with ``confidence``
    0, ``cpus_per_gpu`` unchanged and ``fit={"error": <why>}``.

    **Censored profiles.** Online probes only measure inside a job's allocation, so a job
    that was given too few cores shows a "sweet spot" at its allocation that is only a
    lower bound. When nothing was measured clearly past the curve's knee (a core, or
    ``CENSOR_MARGIN`` of it if more), the fit is marked ``censored`` with
    ``measured_top_cores_per_gpu``, and ``cpus_per_gpu`` asks for ``explore_factor`` times
    that, so the next run has room to show where the curve flattens (coda-node probes it
    again). When a later run measures above a censored top, the samples before that run
    are dropped from the profile: they were relative to a plateau that was not one (they
    would be rescaled, but the wider run alone says more about where the curve flattens).
    """
    if not 0.0 < plateau_fraction <= 1.0:
        raise ValueError(f"plateau_fraction must be in (0, 1], got {plateau_fraction}")
    if explore_factor < 1.0:
        raise ValueError(f"explore_factor must be at least 1, got {explore_factor}")
    samples = profile.samples
    prev = profile.fit
    if prev is not None and prev.get("censored"):
        top = float(prev.get("measured_top_cores_per_gpu") or 0.0)
        first = next(
            (k for k, s in enumerate(samples) if s.nodes == 1 and s.cores / s.gpus > top + 1e-9),
            None,
        )
        if first is not None:
            samples = samples[first:]
    used = [s for s in samples if s.nodes == 1]
    try:
        if not used:
            raise InsufficientSamples("no single-node samples")
        normalise_samples((s.cores, s.throughput, s.gpus) for s in used)  # validates
        spot, lo, hi, gpus, n_used, n_runs = _spot_of_widest_gpu_count(used, plateau_fraction)
    except ModelError as exc:
        return replace(profile, samples=samples, confidence=0.0, fit={"error": str(exc)})
    fit: dict[str, Any] = {} if spot.fit is None else spot.fit.to_dict()
    fit.update(
        method=spot.method,
        fit_gpus=gpus,
        sweet_spot_cores_per_gpu=math.ceil(spot.cores / gpus),
        plateau_throughput=float(spot.plateau_throughput) / gpus,
        n_used=n_used,
        runs=n_runs,
    )
    cpus_per_gpu = max(1, math.ceil(spot.cores / gpus))
    # A plateau is only seen if something was measured clearly past the knee: a core, or
    # 10 % of it if that is more. Otherwise the curve may still be rising at the top.
    knee = spot.fit.theta_cores if spot.fit is not None else float(spot.cores)
    if hi > lo and hi < knee + max(1.0, CENSOR_MARGIN * knee):
        fit.update(censored=True, measured_top_cores_per_gpu=hi / gpus)
        cpus_per_gpu = max(math.ceil((hi + 1) / gpus), math.ceil(hi * explore_factor / gpus))
    return replace(
        profile,
        samples=samples,
        cpus_per_gpu=cpus_per_gpu,
        confidence=float(spot.confidence),
        fit=fit,
    )


def _spot_of_widest_gpu_count(
    used: Sequence[Sample], plateau_fraction: float
) -> tuple[SweetSpot, int, int, int, int, int]:
    """The sweet spot of the single-node samples of one GPU count: ``(spot, lo, hi, units,
    samples used, runs used)``, cores in ``units``-GPU units (``units`` is that GPU count,
    or 1 when only a per-GPU table fits).

    The GPU count is the one whose runs measured the most cores per GPU (then the one with
    more samples, then more GPUs): the runs that had the most cores saw the most of the
    curve, and runs on other GPU counts are not pooled with them, because the curve's log
    term is not scale-free (log(C/8) = log C - log 8 and the model has no intercept), so an
    8-GPU job's curve in per-GPU cores has another shape than a 1-GPU job's: in the
    simulator, 1- and 8-GPU runs of one workload pooled per GPU gave a knee at half the true
    one. If that count's samples cannot be fitted, the next count is tried. Within the
    count, runs are put on one scale (:func:`_run_scales`); samples are fitted in the job's
    own cores (an 8-GPU job's probes at 8..96 cores, not 1..12 per GPU).
    """
    by_gpus: dict[int, list[Sample]] = {}
    for smp in used:
        by_gpus.setdefault(int(smp.gpus), []).append(smp)
    order = sorted(
        by_gpus,
        key=lambda g: (max(s.cores for s in by_gpus[g]) / g, len(by_gpus[g]), g),
        reverse=True,
    )
    first_error: ModelError | None = None
    for gpus in order:
        group = by_gpus[gpus]
        c = np.array([s.cores for s in group], dtype=float)
        y = np.array([s.throughput for s in group], dtype=float)
        labels = _informative(run_labels(group), c)
        keep = labels >= 0
        c, y, labels = c[keep], y[keep], labels[keep]
        n_runs = int(labels.max()) + 1
        try:
            if n_runs > 1:
                y = y / _run_scales(c, y, labels)
            try:
                spot, lo, hi = _spot_in_units(c, y, plateau_fraction, gpus)
                units = gpus
            except InsufficientSamples:
                if gpus == 1:
                    raise
                # Too few counts for a fit, but per GPU they may cover a table's range.
                units = 1
                spot, lo, hi = _spot_in_units(c / gpus, y / gpus, plateau_fraction)
        except ModelError as exc:
            first_error = first_error or exc
            continue
        return spot, lo, hi, units, int(c.size), n_runs
    assert first_error is not None
    raise first_error


def run_labels(samples: Sequence[Sample]) -> np.ndarray:
    """Which probing run each of a profile's samples came from (0, 1, ... in order of each
    run's first sample).

    Samples that carry a run id (``Sample.run``, store format version 3: coda-node gives
    each publish one) are grouped by it, wherever they are in the list. Each maximal
    stretch of consecutive samples without one (written by hand, or by a coda before
    version 3) is inferred on its own (:func:`_inferred_run_labels`) and gets fresh
    numbers: it never joins a run that has an id, nor a stretch on the other side of one.
    """
    labels = np.zeros(len(samples), dtype=np.int64)
    by_id: dict[str, int] = {}
    n_runs = 0
    i = 0
    while i < len(samples):
        run = samples[i].run
        if run is not None:
            if run not in by_id:
                by_id[run] = n_runs
                n_runs += 1
            labels[i] = by_id[run]
            i += 1
            continue
        end = i
        while end < len(samples) and samples[end].run is None:
            end += 1
        inferred = _inferred_run_labels(samples[i:end])
        labels[i:end] = inferred + n_runs
        n_runs += int(inferred.max()) + 1
        i = end
    return labels


def _inferred_run_labels(samples: Sequence[Sample]) -> np.ndarray:
    """Which run each sample without a run id came from (0, 1, ... in order), inferred
    from the order in which they were published.

    coda-node's allocator publishes each run's samples together and in the order it
    measured them (:mod:`coda_node.policy.allocator`): first its whole allocation, then the fewest
    cores, one per GPU (the floor), then counts below the allocation, each count in one
    contiguous block and never revisited within the run. So a new run starts where the GPU
    or node count changes, or where a count of the current run comes back after other
    counts. It starts at the block before that one (the new run's allocation) when the
    returning count is the floor, which every run probes second, or when that block is
    above every earlier count of the current run; else at the returning count itself.
    Samples without repeats (written by hand, in any order) are one run. A run these rules
    miss merges into the one before it, which costs nothing when both ran on the same
    allocation: their samples share a scale. A run whose allocation is the previous run's
    last count continues that block, and the whole block goes to the new run (a refit can
    then be several cores off): run ids exist so that coda-node's runs need no inference.
    """
    labels = np.zeros(len(samples), dtype=np.int64)
    run = 0
    blocks: list[tuple[int, float]] = []
    """(first index, cores) of each block of the current run."""
    for i, smp in enumerate(samples):
        prev = samples[i - 1] if i else None
        if prev is None:
            blocks = [(i, smp.cores)]
        elif (smp.gpus, smp.nodes) != (prev.gpus, prev.nodes):
            run, blocks = run + 1, [(i, smp.cores)]
        elif smp.cores != prev.cores:
            if any(c == smp.cores for _, c in blocks):
                last_start, last_cores = blocks[-1]
                earlier = [c for _, c in blocks[:-1]]
                back = len(blocks) >= 2 and (smp.cores == smp.gpus or last_cores > max(earlier))
                run += 1
                if back:
                    labels[last_start:i] = run
                    blocks = [(last_start, last_cores), (i, smp.cores)]
                else:
                    blocks = [(i, smp.cores)]
            else:
                blocks.append((i, smp.cores))
        labels[i] = run
    return labels


def _informative(labels: np.ndarray, cores: np.ndarray) -> np.ndarray:
    """``labels`` renumbered 0.. over the runs that say something about the curve's shape;
    -1 for the others. Each run's samples are relative to that run's own top, an unknown
    scale, so a run measured at one core count only says nothing once there are other
    runs (its one level fits any curve). With a single run, every sample counts."""
    runs = np.unique(labels)
    if runs.size == 1:
        return np.zeros_like(labels)
    out = np.full_like(labels, -1)
    k = 0
    for r in runs:
        mask = labels == r
        if np.unique(cores[mask]).size >= 2:
            out[mask] = k
            k += 1
    if k == 0:  # no run measured two counts: nothing to scale against, keep the pool
        return np.zeros_like(labels)
    return out


def _run_scales(cores: np.ndarray, y: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-sample divisor putting every run on one scale: the run measured up to the most
    cores (the likeliest to have seen the plateau; the latest of equals) keeps its scale,
    each other run gets the least-squares factor onto the curve fitted to all of them.

    Alternating least squares: fit one curve (:func:`_solve`, no refusals) to the scaled
    samples, re-fit each run's factor to it, until the factors settle. A run normalised to a
    top that was still rising (a censored run) then lines up under the runs that saw more,
    and runs on different GPU counts (relative throughputs divided by different counts)
    line up too.
    """
    runs = int(labels.max()) + 1
    tops = np.array([cores[labels == r].max() for r in range(runs)])
    ref = max(range(runs), key=lambda r: (tops[r], r))
    # Start from the reference run's own samples, joined by straight lines (no model): each
    # run's factor onto them where the two overlap. Every allocator run measures one core
    # per GPU, so they overlap at least there. Starting from the runs' own tops instead
    # lets a run normalised at a top that was still rising pull the knee down to that top,
    # a local optimum the alternation does not leave.
    ref_mask = labels == ref
    ks, inverse = np.unique(cores[ref_mask], return_inverse=True)
    means = np.bincount(inverse, weights=y[ref_mask]) / np.bincount(inverse)
    scale = np.ones(runs)
    for r in range(runs):
        mask = labels == r
        inside = mask & (cores >= ks[0]) & (cores <= ks[-1])
        if r == ref or not np.any(inside):
            continue
        guide = np.interp(cores[inside], ks, means)
        den, num = float(guide @ guide), float(y[inside] @ guide)
        if den > 0.0 and num > 0.0:
            scale[r] = num / den
    grid = _theta_grid(float(cores.min()), float(cores.max()))
    for _ in range(_SCALE_ITERATIONS):
        ya = y / scale[labels]
        mean = float(ya.mean())
        if mean <= 0.0:
            break
        prof = _solve(cores, ya / mean, grid)
        best = int(np.argmin(prof.sse))
        point = _solve(cores, ya / mean, grid[best : best + 1])
        with np.errstate(divide="ignore", invalid="ignore"):
            rising = point.p0[0] * np.log(cores) + point.p1[0] * cores
        pred = mean * np.where(cores < grid[best], rising, point.p2[0])
        new = scale.copy()
        for r in range(runs):
            if r == ref:
                continue
            mask = labels == r
            den = float(pred[mask] @ pred[mask])
            num = float(y[mask] @ pred[mask])
            if den > 0.0 and num > 0.0:
                new[r] = num / den
        done = bool(np.allclose(new, scale, rtol=1e-6, atol=0.0))
        scale = new
        if done:
            break
    return scale[labels]


def _spot_in_units(
    c: np.ndarray, y: np.ndarray, plateau_fraction: float, gpus: int = 1
) -> tuple[SweetSpot, int, int]:
    """The sweet spot of samples in ``gpus``-GPU units; confidence is still about ±1 core
    *per GPU* (``unit_cores=gpus``), the unit the hook hands out."""
    lo = max(1, round(float(c.min())))
    hi = max(lo, round(float(c.max())))
    spot = estimate_sweet_spot(
        c,
        y,
        plateau_fraction=plateau_fraction,
        min_cores=lo,
        max_cores=hi,
        unit_cores=float(gpus),
    )
    return spot, lo, hi


def normalise_samples(samples: Iterable[tuple[float, float, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Turn (cores, throughput, gpus) samples into per-GPU cores and per-GPU throughput.

    CODA (section I.C) finds that on one node CPU demand is linear in the number of GPUs,
    so a 2-GPU probe with 8 cores says the same about the curve as a 1-GPU probe with 4
    cores. Only valid for single-node probes.
    """
    cores_per_gpu: list[float] = []
    throughput_per_gpu: list[float] = []
    for i, (cores, throughput, gpus) in enumerate(samples):
        if gpus != int(gpus) or int(gpus) < 1:
            raise ModelError(f"sample {i}: GPU count must be a positive integer, got {gpus}")
        cores_per_gpu.append(float(cores) / int(gpus))
        throughput_per_gpu.append(float(throughput) / int(gpus))
    c, y = _as_arrays(cores_per_gpu, throughput_per_gpu)
    return c, y


def next_probe(
    samples: Sequence[tuple[float, float]],
    *,
    max_cores: int,
    min_cores: int = 1,
    plateau_fraction: float = 0.95,
    confident_at: float = 0.9,
) -> int | None:
    """Which core count to measure next, or ``None`` when no further probe is needed.

    Design (deterministic, so a re-run profiles the same way):

    1. ``max_cores`` first: it measures the plateau on this box.
    2. ``min_cores`` next: it measures how CPU-starved the job is.
    3. Then weigh the curve shapes by the samples (:func:`_shape_posterior`, as
       :class:`Fit`'s answer does) and group them by the sweet spot each implies. Probe the
       untried whole core count where the predicted log throughput differs most between
       those groups (largest between-group variance): that is where one measurement best
       tells the candidate sweet spots apart.
    4. If no candidate separates the groups (all agree), probe the untried core count
       farthest from every tried one, which also sharpens the noise estimate.

    Returns ``None`` when :func:`fit_curve` succeeds with ``confidence >= confident_at`` and
    every untried count below its answer reaches the target with probability under 0.2
    (else it probes among those: one of them may be enough), or when every core count in
    the range has been tried. Callers should also cap the number of probes: with very
    noisy measurements the confidence may never reach ``confident_at``.
    """
    if min_cores < 1 or max_cores < min_cores:
        raise ModelError(f"need 1 <= min_cores <= max_cores, got {min_cores}..{max_cores}")
    if not samples:
        return max_cores
    c, y = _as_arrays([s[0] for s in samples], [s[1] for s in samples])
    tried = {round(v, 9) for v in c.tolist()}
    candidates = [k for k in range(min_cores, max_cores + 1) if float(k) not in tried]
    if float(max_cores) not in tried:
        return max_cores
    if float(min_cores) not in tried:
        return min_cores
    if not candidates:
        return None
    if np.unique(c).size >= _N_PARAMS:
        try:
            fit = fit_curve(c, y, plateau_fraction=plateau_fraction)
        except InconsistentSamples:
            fit = None
        if fit is not None and fit.confidence >= confident_at:
            # Confident, but a count below the answer may still be enough: worth a probe,
            # which every later run of the job profits from.
            ks_fit, hit_probability = _hit_probabilities(c, y, plateau_fraction)
            even = int(ks_fit[np.argmax(hit_probability >= _WORTH_PROBING - 1e-12)])
            between = [k for k in candidates if even <= k < fit.sweet_spot_cores]
            if not between:
                return None
            candidates = between

    if float(y.max()) <= 0.0:
        return _farthest(candidates, c)
    top = max(float(max_cores), float(c.max()))
    k_first = max(1, math.ceil(min(float(min_cores), float(c.min())) - 1e-9))
    ks = np.arange(k_first, math.ceil(top - 1e-9) + 1)
    post = _shape_posterior(c, y, top)
    first = post.first_hits(ks, top, plateau_fraction)
    cand = np.asarray(candidates)
    pred = post.log_level[:, None] + post.shapes.log_at_cores[: post.rows, cand - 1]
    groups, group_of = np.unique(first, return_inverse=True)
    onehot = np.zeros((first.size, groups.size))
    onehot[np.arange(first.size), group_of] = post.weight
    group_w = onehot.sum(axis=0)
    keep = group_w > 1e-12
    group_mean = (onehot.T @ pred)[keep] / group_w[keep, None]
    overall = post.weight @ pred
    between_var = group_w[keep] @ ((group_mean - overall[None, :]) ** 2)
    best = int(np.argmax(between_var))
    # Differences far below the noise cannot be resolved by one probe; fall back to filling
    # the largest gap, which at least improves the noise estimate.
    if between_var[best] < 1e-4 * post.noise_var:
        return _farthest(candidates, c)
    return candidates[best]


def _farthest(candidates: list[int], tried: np.ndarray) -> int:
    dist = [float(np.min(np.abs(tried - k))) for k in candidates]
    return candidates[int(np.argmax(dist))]


def cpus_per_gpu_for_request(
    sweet_spot_cores_per_gpu: int,
    *,
    gpus_per_node: int,
    nodes: int,
    multi_node_cpus_per_gpu: int | None = None,
    multi_node_gpu_cap: int = 2,
) -> int:
    """Cores per GPU to give a job that asks for ``nodes`` x ``gpus_per_node`` GPUs.

    * One node: CODA (section I.C) finds CPU demand linear in the GPU count on a node, so
      the per-GPU sweet spot measured with one GPU applies unchanged.
    * Several nodes: use ``multi_node_cpus_per_gpu`` if it was measured. Otherwise CODA finds
      multi-node demand never above the one-node-two-GPU (1N2G) demand (network time slows
      the GPU stage, leaving the data stage more time), so a node needs at most
      ``sweet_spot * min(gpus_per_node, multi_node_gpu_cap)`` cores, spread over its GPUs and
      rounded up.

    The result is at least 1.
    """
    if sweet_spot_cores_per_gpu < 1:
        raise ValueError(f"sweet spot must be at least 1 core, got {sweet_spot_cores_per_gpu}")
    if gpus_per_node < 1 or nodes < 1:
        raise ValueError(f"need gpus_per_node >= 1 and nodes >= 1, got {gpus_per_node}, {nodes}")
    if multi_node_gpu_cap < 1:
        raise ValueError(f"multi_node_gpu_cap must be at least 1, got {multi_node_gpu_cap}")
    if nodes == 1:
        return sweet_spot_cores_per_gpu
    if multi_node_cpus_per_gpu is not None:
        if multi_node_cpus_per_gpu < 1:
            raise ValueError(
                f"measured multi-node demand must be at least 1 core, got {multi_node_cpus_per_gpu}"
            )
        return multi_node_cpus_per_gpu
    per_node_cores = sweet_spot_cores_per_gpu * min(gpus_per_node, multi_node_gpu_cap)
    return max(1, -(-per_node_cores // gpus_per_node))
