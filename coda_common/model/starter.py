"""The starter table: cores per GPU of named models from published measurements, which a
site imports on its first day (``coda-slurm profiles starter``) as low-confidence global
profiles, so that a never-seen job whose script names one of these models starts from its
figure (``PriorsFromNames``) rather than from the node's share.

Each entry says where its figure comes from and the GPU and host it was measured on.

* The SoCC'18 poster's table (:data:`coda_common.model.curves.REFERENCE_WORKLOADS`): "CPU
  number required for best 1-GPU performance on P100 Azure VM (24 cores in total)".
* This project's own measurement on one NVIDIA H200 with 16 cores
  (``bench/bench_gpu_cores.py``, raw output in ``tests/data/h200/``, docs/evaluation.md
  "Real GPU training against cores"): ResNet-50 on an ImageNet-style JPEG pipeline was still
  rising at 16 cores (the fit's 15 is a floor); the transformer LM needed 1.

CODA's characterisation (ICDCS'20, section I.B) gives its per-model figures only as a plot
(Fig. 4), so no figure of it is in the table; its findings shape how the table is used:
demand per GPU is independent of batch size (Insight 1) and linear in a node's GPUs (I.C),
so one figure per GPU serves every job size.

Other GPU generations.  The figures are used as measured, whatever GPU a site has.  A
faster GPU drains its input faster, so a data pipeline on the CPU needs more cores to keep
it busy ("better GPU, more CPU", SoCC'18), but by how much depends on the model: Takayama
et al. (MLPerf on P100 and V100) found V100 training times of 0.66 to 1.01 of P100's across
nine benchmarks, and this project's H200 run found the LM at 1 core as on a P100 while
ResNet-50 with JPEG decoding needed more than 16.  A prior is a floor, never a cut: a figure
too low for a newer GPU leaves a first run where the node's share would have, and coda-node's
profile of the job corrects it from its first run.  A site that knows its GPUs' speed-up on
such pipelines scales every figure with ``coda-slurm profiles starter --scale F`` (1.5 from
Takayama's 0.66 for GPU-bound models on a V100, for instance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from coda_common.model.curves import REFERENCE_WORKLOADS
from coda_common.store.profiles import Profile

__all__ = [
    "STARTER_CONFIDENCE",
    "STARTER_SOURCE",
    "STARTER_TABLE",
    "StarterEntry",
    "scaled_cores",
    "starter_profiles",
]

STARTER_SOURCE = "starter"
"""The ``source`` of every profile the starter table writes (``profiles list`` shows it)."""

STARTER_CONFIDENCE = 0.1
"""The confidence of a starter profile: far below any MinConfidence a site would run, so the
hook never takes one for a measured profile; it serves as a prior only."""


@dataclass(frozen=True, slots=True)
class StarterEntry:
    """One model of the starter table."""

    name: str
    """The NAME of its global profile (``workload:*:NAME``)."""
    spellings: tuple[str, ...]
    """Other NAMEs under which the same figure is written (one profile each)."""
    cores_per_gpu: int
    gpu: str
    host_cores: int
    source: str
    note: str = ""


_SPELLINGS = {
    "Googlenet": ("inception-v1",),
    "LanguageModel": ("rnnlm",),
    "Bi-Att-Flow": ("bidaf",),
}

_H200 = (
    "this project's measurement, bench/bench_gpu_cores.py on one NVIDIA H200 with 16 cores "
    "(tests/data/h200/, docs/evaluation.md, Real GPU training against cores)"
)

STARTER_TABLE: tuple[StarterEntry, ...] = (
    *(
        StarterEntry(
            name=w.name.lower(),
            spellings=_SPELLINGS.get(w.name, ()),
            cores_per_gpu=w.sweet_spot_cores,
            gpu=w.gpu,
            host_cores=w.host_cores,
            source=w.source,
        )
        for w in REFERENCE_WORKLOADS
    ),
    StarterEntry(
        name="resnet50",
        spellings=("resnet-50",),
        cores_per_gpu=15,
        gpu="H200",
        host_cores=16,
        source=_H200,
        note="JPEG decoding and augmentation on the CPU; still rising at 16 cores, so a floor. "
        "Fed pre-decoded images, the same model needed 4.",
    ),
)
"""Every entry, by NAME."""


def scaled_cores(entry: StarterEntry, scale: float) -> int:
    """``entry``'s cores per GPU times ``scale``, rounded up, at least 1."""
    return max(1, math.ceil(entry.cores_per_gpu * scale - 1e-9))


def starter_profiles(scale: float, now_unix_s: float) -> list[Profile]:
    """One global profile ``workload:*:NAME`` per NAME and spelling of the table, its figure
    times ``scale`` (:func:`scaled_cores`), at :data:`STARTER_CONFIDENCE` with source
    :data:`STARTER_SOURCE`; ``fit`` says where the figure comes from."""
    out = []
    for entry in STARTER_TABLE:
        fit = {
            "method": "starter",
            "measured_cores_per_gpu": entry.cores_per_gpu,
            "scale": scale,
            "gpu": entry.gpu,
            "host_cores": entry.host_cores,
            "source": entry.source,
        }
        if entry.note:
            fit["note"] = entry.note
        for name in (entry.name, *entry.spellings):
            out.append(
                Profile(
                    signature=f"workload:*:{name}",
                    workload=name,
                    cpus_per_gpu=scaled_cores(entry, scale),
                    confidence=STARTER_CONFIDENCE,
                    n_samples=0,
                    updated_unix_s=now_unix_s,
                    source=STARTER_SOURCE,
                    gpu_model=entry.gpu,
                    fit=dict(fit),
                ).validated(f"starter entry {name}")
            )
    return out
