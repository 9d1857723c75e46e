"""``coda-slurm model``: fit the CPU-demand model to measured probes.

``model fit SAMPLES.csv`` reads a CSV whose header names ``cores`` and ``throughput`` (any
order, other columns ignored) and optionally ``gpus``; with ``gpus`` the samples are turned
into per-GPU cores and throughput first (CODA: demand is linear in GPUs on one node).

The report says when the curve was still rising at the most cores measured (the next
lower count measured reaches less than the plateau fraction of the top): the plateau and
the sweet spot are then only lower bounds, whatever the fit's confidence says, because
the fit can only place its plateau where it saw one.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

import click

from coda_common.cli import CliError, emit_json
from coda_common.model.fit import Fit, ModelError, fit_curve, normalise_samples

_REQUIRED_COLUMNS = ("cores", "throughput")


@click.group(name="model")
def model() -> None:
    """The CPU-demand model (throughput vs cores, SoCC'18 predictor)."""


def _read_samples(path: Path) -> tuple[list[float], list[float], list[int] | None]:
    """Parse SAMPLES.csv; every problem is a CliError naming the file and line."""
    try:
        # newline="" as the csv module asks, so quoted newlines and \r\n parse correctly.
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                raise CliError(f"{path}: empty file", "expected a header with cores,throughput")
            names = [h.strip().lower() for h in header]
            missing = [c for c in _REQUIRED_COLUMNS if c not in names]
            if missing:
                raise CliError(
                    f"{path}: line 1: header has no {', '.join(missing)} column",
                    f"found {', '.join(n or '(empty)' for n in names)}; "
                    "expected at least cores,throughput",
                )
            i_cores = names.index("cores")
            i_thr = names.index("throughput")
            i_gpus = names.index("gpus") if "gpus" in names else None
            cores: list[float] = []
            throughput: list[float] = []
            gpus: list[int] = []
            for row in reader:
                if not row or all(not cell.strip() for cell in row):
                    continue
                line = reader.line_num
                cores.append(_number(path, line, row, i_cores, "cores"))
                throughput.append(_number(path, line, row, i_thr, "throughput"))
                if i_gpus is not None:
                    g = _number(path, line, row, i_gpus, "gpus")
                    if g != int(g) or g < 1:
                        raise CliError(
                            f"{path}: line {line}: gpus must be a positive integer", f"got {g:g}"
                        )
                    gpus.append(int(g))
    except OSError as exc:
        raise CliError(f"cannot read {path}", exc.strerror or str(exc)) from exc
    except UnicodeDecodeError as exc:
        raise CliError(f"cannot read {path}", "not UTF-8 text") from exc
    except csv.Error as exc:  # a field past the csv module's limit
        raise CliError(f"cannot read {path}", f"line {reader.line_num}: {exc}") from exc
    return cores, throughput, (gpus if i_gpus is not None else None)


def _number(path: Path, line: int, row: list[str], index: int, column: str) -> float:
    if index >= len(row):
        raise CliError(f"{path}: line {line}: no {column} value", f"row has {len(row)} fields")
    text = row[index].strip()
    try:
        value = float(text)
    except ValueError:
        raise CliError(f"{path}: line {line}: {column} is not a number", f"got {text!r}") from None
    if not math.isfinite(value):
        raise CliError(f"{path}: line {line}: {column} is not a finite number", f"got {text!r}")
    return value


def _rising_at_top(
    cores: Sequence[float], throughput: Sequence[float], plateau_fraction: float
) -> tuple[float, float, float] | None:
    """``(lower, top, share)`` when the mean throughput at the second-highest core count
    measured, ``lower``, is under ``plateau_fraction`` of the mean at the highest, ``top``
    (``share`` is that ratio); else None. Nothing measured then shows where the curve
    stops rising."""
    by_cores: dict[float, list[float]] = {}
    for c, y in zip(cores, throughput, strict=True):
        by_cores.setdefault(float(c), []).append(float(y))
    if len(by_cores) < 2:
        return None
    lower, top = sorted(by_cores)[-2:]
    y_lower = sum(by_cores[lower]) / len(by_cores[lower])
    y_top = sum(by_cores[top]) / len(by_cores[top])
    if y_top <= 0 or y_lower >= plateau_fraction * y_top:
        return None
    return lower, top, y_lower / y_top


def _text_report(fit: Fit, per_gpu: bool, rising: tuple[float, float, float] | None = None) -> str:
    unit = "cores per GPU" if per_gpu else "cores"
    # Same threshold next_probe stops at by default: below it, more probes would help.
    low = "; low: measure more core counts near the knee" if fit.confidence < 0.9 else ""
    rows = [
        ("samples", f"{fit.n_samples} at {fit.distinct_cores} distinct core counts"),
        (
            "sweet spot",
            f"{fit.sweet_spot_cores} {unit} (reaches {fit.plateau_fraction:.0%} of the plateau)",
        ),
        ("knee θ", f"{fit.theta_cores:.2f} {unit}  (of the best-fitting curve)"),
        ("plateau P2", f"{fit.p2:.6g}" + (" per GPU" if per_gpu else "")),
        ("P0, P1", f"{fit.p0:.6g}, {fit.p1:.6g}  (S = P0·log C + P1·C below θ)"),
        (
            "confidence",
            f"{fit.confidence:.2f}  (P[{fit.sweet_spot_cores} {unit} reach "
            f"{fit.plateau_fraction:.0%} of the plateau])" + low,
        ),
        ("R²", f"{fit.r2:.3f}"),
        ("RMSE", f"{fit.rmse_rel:.1%} of mean throughput"),
    ]
    if rising is not None:
        lower, top, share = rising
        rows.insert(
            1,
            (
                "still rising",
                f"{lower:g} {unit} reach only {share:.0%} of the throughput at {top:g}: "
                f"the plateau was not reached; the sweet spot may be above {top:g} {unit}",
            ),
        )
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


@model.command(name="fit")
@click.argument("samples_csv", metavar="SAMPLES.csv", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the fit as JSON.")
@click.option(
    "--plateau-fraction",
    type=click.FloatRange(0.0, 1.0, min_open=True),
    default=0.95,
    show_default=True,
    help="The sweet spot is the fewest cores that reach this fraction of the plateau.",
)
def fit_cmd(samples_csv: Path, as_json: bool, plateau_fraction: float) -> None:
    """Fit throughput-vs-cores samples and print the sweet spot."""
    cores, throughput, gpus = _read_samples(samples_csv)
    try:
        if gpus is not None:
            c, y = normalise_samples(zip(cores, throughput, gpus, strict=True))
            cores, throughput = [float(v) for v in c], [float(v) for v in y]
        fit = fit_curve(cores, throughput, plateau_fraction=plateau_fraction)
    except ModelError as exc:
        raise CliError(f"cannot fit {samples_csv}", str(exc)) from exc
    per_gpu = gpus is not None
    rising = _rising_at_top(cores, throughput, plateau_fraction)
    if as_json:
        emit_json(
            {
                **fit.to_dict(),
                "per_gpu": per_gpu,
                "still_rising": rising is not None,
                "measured_top_cores": max(cores),
            }
        )
    else:
        click.echo(_text_report(fit, per_gpu, rising))
