"""The README demo: a real local Slurm, profiled workloads, plain sbatch, rewritten jobs.

1. Start a private one-node cluster (32 CPUs, 4 fake A100s, ``DefCpuPerGPU=4``) with
   job_submit/coda loaded.
2. Profile a few workloads the way a node daemon would: probe core counts chosen by
   the experiment design on throughput curves with the sweet spots the SoCC'18 poster
   measured on a P100, fit the model, publish the profiles to the store.
3. Submit GPU jobs of different workloads with plain ``sbatch`` and show the
   ``CpusPerTres`` slurmctld recorded, and what sbatch told the user.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from coda_common.model.curves import REFERENCE_WORKLOADS, noisy_samples
from coda_common.model.fit import ModelError, fit_curve, next_probe
from coda_common.model.starter import starter_profiles
from coda_common.store.profiles import Profile, ProfileStore, Sample
from slurm_plugin.devtools.cluster import DevCluster

DEMO_WORKLOADS = ("Alexnet", "Googlenet", "LanguageModel", "DeepSpeech")
PROBE_BUDGET = 8
NOISE_REL = 0.02

JOBS: tuple[tuple[str, list[str]], ...] = (
    ("alexnet, 2 GPUs", ["--gpus-per-node=2", "--comment=coda:workload=alexnet"]),
    ("languagemodel, 1 GPU", ["--gpus-per-node=1", "--comment=coda:workload=languagemodel"]),
    ("deepspeech, --gres", ["--gres=gpu:a100:2", "--comment=coda:workload=deepspeech"]),
    ("googlenet, 4 GPUs", ["--gpus-per-node=4", "--comment=coda:workload=googlenet"]),
    ("unprofiled script", ["--gpus=1", "--job-name=new-model"]),
    ("script names overfeat", ["--gpus=1", "--job-name=first-run"]),
    (
        "user asked 8/GPU",
        ["--gpus-per-node=1", "--cpus-per-gpu=8", "--comment=coda:workload=languagemodel"],
    ),
    ("CPU-only job", ["--ntasks=4"]),
)


SCRIPTS = {
    "script names overfeat": "#!/bin/sh\nsrun python train.py --arch overfeat /data\n",
}


def profile_workload(name: str, sweet_spot: int, host_cores: int, seed: int) -> Profile:
    """Probe, fit and build the profile of one reference workload (a simulated node)."""
    rng = np.random.default_rng(seed)
    samples: list[tuple[float, float]] = []
    for _ in range(PROBE_BUDGET):
        cores = next_probe(samples, max_cores=host_cores)
        if cores is None:
            break
        throughput = float(noisy_samples(rng, sweet_spot, np.array([cores]), NOISE_REL)[0])
        samples.append((float(cores), throughput))
    fit = fit_curve([c for c, _ in samples], [t for _, t in samples])
    return Profile(
        signature=f"workload:*:{name.lower()}",
        workload=name.lower(),
        cpus_per_gpu=fit.sweet_spot_cores,
        confidence=fit.confidence,
        n_samples=len(samples),
        updated_unix_s=time.time(),
        source="demo (SoCC'18 P100 curve)",
        gpu_model="P100",
        samples=tuple(
            Sample(cores=c, throughput=t, gpus=1, nodes=1, gpu_model="P100", node="demo")
            for c, t in samples
        ),
        fit=fit.to_dict(),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/demo", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--keep",
        action="store_true",
        help="leave the cluster running (stop it with scripts/dev-cluster down)",
    )
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="coda-demo-"))
    cluster = DevCluster(root)
    out = sys.stdout.write
    out(f"Starting a private Slurm in {root} ...\n")
    cluster.up()
    try:
        _profile(cluster, out)
        time.sleep(1.5)  # the hook's reloader polls the store every ReloadIntervalS=1
        _submit(cluster, out)
    finally:
        if args.keep:
            out(
                f"\nCluster left running: export SLURM_CONF={cluster.slurm_conf}\n"
                f"Stop it with: scripts/dev-cluster down --dir {root}\n"
            )
        else:
            cluster.down()
    return 0


def _profile(cluster: DevCluster, out: Callable[[str], object]) -> None:
    """Profile the demo's workloads into the cluster's store, saying what each gave."""
    store = ProfileStore(cluster.profile_store)
    out(
        "\nProfiling workloads (probes chosen by the experiment design, then a fit of\n"
        "S(C) = P0*log C + P1*C below the sweet spot, plateau above it):\n"
    )
    out(f"  {'workload':14} {'true':>5} {'fitted':>7} {'probes':>7} {'confidence':>11}\n")
    for i, ref in enumerate(w for w in REFERENCE_WORKLOADS if w.name in DEMO_WORKLOADS):
        try:
            prof = profile_workload(ref.name, ref.sweet_spot_cores, ref.host_cores, seed=i)
        except ModelError as exc:
            out(f"  {ref.name:14} could not be profiled: {exc}\n")
            continue
        store.write(prof)
        out(
            f"  {prof.workload:14} {ref.sweet_spot_cores:>5} {prof.cpus_per_gpu:>7} "
            f"{prof.n_samples:>7} {prof.confidence:>11.2f}\n"
        )
    measured = {
        p.signature for p in (store.read(f"workload:*:{w.lower()}") for w in DEMO_WORKLOADS) if p
    }
    starter = [p for p in starter_profiles(1.0, time.time()) if p.signature not in measured]
    for p in starter:
        store.write(p)
    out(
        f"\nImported {len(starter)} starter-table profiles (coda-slurm profiles starter): "
        "priors for\nnever-seen scripts that name those models.\n"
    )


def _submit(cluster: DevCluster, out: Callable[[str], object]) -> None:
    """Submit the demo's jobs held, show what the hook made of each, then cancel them."""
    out("\nSubmitting with plain sbatch (node: 32 CPUs, 4 GPUs; partition DefCpuPerGPU=4):\n")
    rows = []
    for label, opts in JOBS:
        # One never-seen script names its model: it gets the starter table's figure.
        script = SCRIPTS.get(label, "#!/bin/sh\nsleep 60\n")
        job_id, said = cluster.sbatch(["--hold", *opts], script)
        fields = cluster.show_job(job_id)
        gpus = fields.get("TresPerNode") or fields.get("TresPerJob") or "-"
        rows.append(
            (
                job_id,
                label,
                gpus,
                fields.get("CpusPerTres", "-") or "-",
                said.strip().replace("sbatch: ", ""),
            )
        )
    out(f"  {'job':>4}  {'what':22} {'GPUs asked':17} {'CpusPerTres':12}  sbatch said\n")
    for job_id, label, gpus, cpt, said in rows:
        out(f"  {job_id:>4}  {label:22} {gpus:17} {cpt:12}  {said or '-'}\n")
    out("  (a '-' CpusPerTres on a GPU job means Slurm's own DefCpuPerGPU applies)\n")
    out("\nslurmctld's log (job_submit/coda lines):\n")
    for line in cluster.ctld_log.read_text(errors="replace").splitlines():
        if "job_submit/coda" in line:
            out(f"  {line}\n")
    cluster.run(["scancel", *[str(r[0]) for r in rows]], check=False)


if __name__ == "__main__":
    raise SystemExit(main())
