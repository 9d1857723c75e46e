"""Real GPU training throughput against the CPU cores it is given; real pairs sharing a GPU.

Needs a CUDA GPU, PyTorch and torchvision; it is not part of the test suite. Two parts:

**cores**: for each workload one process builds the model once; each point pins the
process to the first N cores of the machine (``sched_setaffinity``, which the data loader's
worker processes inherit, as a Slurm job's tasks inherit its cpuset), starts a loader with N
workers (the usual ``num_workers = cores``), discards a warm-up and times training steps for
a fixed window. Samples per second against N is the curve that ``coda-slurm model fit``
reads (``--csv`` writes it in that form). Each point also records, through coda-node's own
code, the two signals the online profiler has: NVML utilisation
(:class:`coda_node.system.nvml.Nvml`) and the iteration count in a progress file
(:class:`coda_node.progress_client.Progress`).

* ``resnet50-jpeg``: ImageNet-style input: JPEG decode (PIL), RandomResizedCrop(224), flip,
  normalise, in the loader's workers; ResNet-50, bf16 autocast, channels-last.
* ``resnet50-decoded``: the same model fed pre-decoded uint8 images; the workers only crop
  and flip, the GPU normalises (a DALI-like or pre-processed input pipeline).
* ``lm``: a 12-layer, 768-wide causal transformer on token windows read from memory.

**pairs**: three workloads with their data already on the GPU (so the CPU is not what is
measured) run alone, then two at a time on the one GPU (separate processes, no MPS). It
records each one's iteration rate and NVML busy and memory-busy shares, and the speedup δ
of thesis eq. 4.1 for work that takes each job the same time alone:
``δ = 2 / max(r_alone / r_together)``, beside the predictor
``slurm_plugin.decision.colocate.predict_speedup`` on the solo readings.

Before either part, a check that CPU pinning is enforced here: four spinning processes
pinned to one CPU against one.

    python3 bench/bench_gpu_cores.py --out results.json --csv-dir curves/
    python3 bench/bench_gpu_cores.py --device cpu --smoke      # the code path, on a CPU

Results are written after every point, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coda_node.progress_client import Progress
from coda_node.system.nvml import Nvml
from slurm_plugin.decision.colocate import ShareCandidate, predict_speedup

# -- the machine ---------------------------------------------------------------------------


def _spin(cpu: int | None, seconds: float, out: Any) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10_000):
            n += 1
    out.put(n)


def pinning_check(seconds: float = 2.0) -> dict[str, Any]:
    """Work done by 4 processes pinned to one CPU over the work of 1: ~1.0 when pinning
    is enforced, ~4.0 when it is only recorded."""
    cpu = min(os.sched_getaffinity(0))
    ctx = mp.get_context("fork")

    def run(n_procs: int) -> int:
        q = ctx.Queue()
        procs = [ctx.Process(target=_spin, args=(cpu, seconds, q)) for _ in range(n_procs)]
        for p in procs:
            p.start()
        total = sum(q.get() for _ in procs)
        for p in procs:
            p.join()
        return total

    one = run(1)
    four = run(4)
    return {"one_proc_loops": one, "four_procs_loops": four, "ratio": four / one}


def machine_facts(torch: Any) -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    facts: dict[str, Any] = {
        "kernel": platform.release(),
        "cpu_model": model,
        "cpus_online": os.cpu_count(),
        "cpus_allowed": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    if torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name(0)
        facts["cuda"] = torch.version.cuda
    return facts


# -- NVML beside a measurement ---------------------------------------------------------------


class NvmlSampler:
    """NVML utilisation of GPU 0 every ``interval_s`` through coda-node's reader."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.nvml = Nvml()
        self._stop = threading.Event()
        self._util: list[float] = []
        self._mem: list[float] = []
        self._thread: threading.Thread | None = None

    def __enter__(self) -> NvmlSampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            samples = self.nvml.sample()
            if samples and samples[0].util_pct is not None:
                self._util.append(samples[0].util_pct)
                self._mem.append(samples[0].mem_util_pct or 0.0)

    def means_pct(self) -> tuple[float | None, float | None]:
        if not self._util:
            return None, None
        return sum(self._util) / len(self._util), sum(self._mem) / len(self._mem)

    def status(self) -> str:
        st = self.nvml.status()
        return f"{st.gpu_count} GPU(s)" if st.available else f"unavailable: {st.detail}"


# -- workloads ------------------------------------------------------------------------------


class JpegImages:
    """ImageNet-style samples: in-memory JPEGs decoded and augmented per item."""

    def __init__(self, blobs: list[bytes], length: int, transform: Any) -> None:
        self.blobs, self.length, self.transform = blobs, length, transform

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from PIL import Image

        img = Image.open(io.BytesIO(self.blobs[i % len(self.blobs)])).convert("RGB")
        return self.transform(img), i % 1000


class DecodedImages:
    """Pre-decoded uint8 images; a random 224 crop and a flip per item."""

    def __init__(self, images: Any, length: int) -> None:
        self.images, self.length = images, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import torch

        img = self.images[i % len(self.images)]
        g = torch.Generator().manual_seed(i)
        top, left = torch.randint(0, img.shape[1] - 224 + 1, (2,), generator=g).tolist()
        crop = img[:, top : top + 224, left : left + 224]
        if torch.rand((), generator=g) < 0.5:
            crop = crop.flip(-1)
        return crop.contiguous(), i % 1000


class TokenWindows:
    def __init__(self, tokens: Any, seq_len: int, length: int) -> None:
        self.tokens, self.seq_len, self.length = tokens, seq_len, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Any:
        start = (i * 7919) % (len(self.tokens) - self.seq_len - 1)
        return self.tokens[start : start + self.seq_len + 1].clone()


def _jpeg_blobs(n: int, seed: int = 0) -> list[bytes]:
    """Photographs are not available offline: smooth random fields with noise, encoded at
    ImageNet's mean size (about 400x350) and JPEG quality 90, cost PIL about what real
    photographs do to decode."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    blobs = []
    for _ in range(n):
        w, h = int(rng.integers(350, 500)), int(rng.integers(300, 400))
        base = rng.random((h // 16 + 1, w // 16 + 1, 3)) * 255
        img = np.kron(base, np.ones((16, 16, 1)))[:h, :w]
        img = np.clip(img + rng.normal(0, 20, img.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=90)
        blobs.append(buf.getvalue())
    return blobs


@dataclass
class Workload:
    name: str
    model: Any
    dataset: Any
    batch: int
    step: Callable[[Any], None]


def build_workload(name: str, device: str, smoke: bool) -> Workload:
    import torch
    import torch.nn.functional as F
    import torchvision
    from torchvision import transforms

    dev = torch.device(device)
    use_amp = dev.type == "cuda"
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255

    def image_model() -> Any:
        arch = torchvision.models.resnet18 if smoke else torchvision.models.resnet50
        return arch(num_classes=1000).to(dev).to(memory_format=torch.channels_last)

    if name in ("resnet50-jpeg", "resnet50-decoded"):
        model = image_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        batch = 8 if smoke else 128
        if name == "resnet50-jpeg":
            tf = transforms.Compose(
                [
                    transforms.RandomResizedCrop(224 if not smoke else 64),
                    transforms.RandomHorizontalFlip(),
                    transforms.ToTensor(),
                    transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
                ]
            )
            dataset = JpegImages(_jpeg_blobs(16 if smoke else 256), 10**7, tf)
        else:
            gen = torch.Generator().manual_seed(0)
            images = torch.randint(
                0, 256, (64 if smoke else 512, 3, 256, 256), dtype=torch.uint8, generator=gen
            )
            dataset = DecodedImages(images, 10**7)

        def step(batch_data: Any) -> None:
            x, y = batch_data
            x = x.to(dev, non_blocking=True)
            y = y.to(dev, non_blocking=True)
            if x.dtype == torch.uint8:
                x = (x.float() - mean) / std
            x = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_amp):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return Workload(name, model, dataset, batch, step)

    if name == "lm":
        width, layers, seq_len, vocab = (64, 2, 32, 512) if smoke else (768, 12, 512, 32000)
        layer = torch.nn.TransformerEncoderLayer(
            width, width // 64, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        model = torch.nn.ModuleDict(
            {
                "emb": torch.nn.Embedding(vocab, width),
                "body": torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False),
                "head": torch.nn.Linear(width, vocab),
            }
        ).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(seq_len, device=dev)
        tokens = torch.randint(0, vocab, (2_000_000,), generator=torch.Generator().manual_seed(0))
        dataset = TokenWindows(tokens, seq_len, 10**7)

        def lm_step(batch_data: Any) -> None:
            seq = batch_data.to(dev, non_blocking=True)
            x, y = seq[:, :-1], seq[:, 1:]
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_amp):
                h = model["body"](model["emb"](x), mask=mask, is_causal=True)
                loss = F.cross_entropy(model["head"](h).flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return Workload(name, model, dataset, 4 if smoke else 32, lm_step)

    raise ValueError(f"unknown workload {name!r}")


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure_point(
    wl: Workload, cores: list[int], device: str, warmup_s: float, window_s: float
) -> dict[str, Any]:
    import torch

    os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(len(cores))
    loader = torch.utils.data.DataLoader(
        wl.dataset,
        batch_size=wl.batch,
        num_workers=len(cores),
        pin_memory=device.startswith("cuda"),
        prefetch_factor=2,
        shuffle=False,
        drop_last=True,
        persistent_workers=False,
    )
    with tempfile.NamedTemporaryFile(prefix="coda-progress-") as progress_file:
        progress = Progress(progress_file.name, min_interval_s=0.0)
        it = iter(loader)
        t_first = time.perf_counter()
        steps = 0
        while True:
            wl.step(next(it))
            steps += 1
            if steps >= 3 and time.perf_counter() - t_first >= warmup_s:
                break
        _sync(device)
        sampler = NvmlSampler()
        with sampler:
            t0 = time.perf_counter()
            cpu0 = time.process_time()
            n = 0
            progress.step(0)
            count0 = progress.iterations
            while time.perf_counter() - t0 < window_s or n < 3:
                wl.step(next(it))
                progress.step()
                n += 1
            _sync(device)
            elapsed_s = time.perf_counter() - t0
            main_cpu_s = time.process_time() - cpu0
        progress.flush()
        reported = int(Path(progress_file.name).read_text().split()[0]) - count0
    del it
    util_pct, mem_util_pct = sampler.means_pct()
    return {
        "cores": len(cores),
        "samples_per_s": n * wl.batch / elapsed_s,
        "steps": n,
        "window_s": elapsed_s,
        "gpu_util_pct": util_pct,
        "gpu_mem_util_pct": mem_util_pct,
        "progress_file_steps": reported,
        "main_process_cpu_s": main_cpu_s,
    }


def run_cores(
    args: argparse.Namespace, results: dict[str, Any], save: Callable[[], None], deadline: float
) -> None:
    import torch

    allowed = sorted(os.sched_getaffinity(0))
    plan: dict[str, list[int]] = {
        "resnet50-jpeg": [1, 2, 3, 4, 6, 8, 12, 16],
        "resnet50-decoded": [1, 2, 3, 4, 6, 8, 16],
        "lm": [1, 2, 4, 8],
    }
    if args.smoke:
        plan = {k: [1, 2] for k in plan}
    for name in args.workloads:
        counts = [c for c in plan[name] if c <= len(allowed)]
        results["cores"][name] = {"points": []}
        t_build = time.perf_counter()
        wl = build_workload(name, args.device, args.smoke)
        torch.backends.cudnn.benchmark = True
        results["cores"][name]["batch"] = wl.batch
        results["cores"][name]["build_s"] = time.perf_counter() - t_build
        for c in counts:
            if time.monotonic() + args.warmup_s + args.window_s + 5 > deadline:
                results["cores"][name]["cut_short"] = f"budget ended before {c} cores"
                break
            point = measure_point(wl, allowed[:c], args.device, args.warmup_s, args.window_s)
            results["cores"][name]["points"].append(point)
            save()
            print(
                f"{name:18} {c:3d} cores {point['samples_per_s']:9.1f}/s  "
                f"GPU {point['gpu_util_pct']}%",
                flush=True,
            )
        os.sched_setaffinity(0, set(allowed))
        del wl
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        if args.csv_dir:
            Path(args.csv_dir).mkdir(parents=True, exist_ok=True)
            rows = ["cores,throughput"] + [
                f"{p['cores']},{p['samples_per_s']:.2f}" for p in results["cores"][name]["points"]
            ]
            (Path(args.csv_dir) / f"{name}.csv").write_text("\n".join(rows) + "\n")


# -- pairs on one GPU -----------------------------------------------------------------------

PAIR_WORKLOADS = ("resnet50", "vgg11", "lm")


def _pair_member(
    name: str, device: str, smoke: bool, window_s: float, start: Any, out: Any
) -> None:
    import torch
    import torch.nn.functional as F
    import torchvision

    dev = torch.device(device)
    use_amp = dev.type == "cuda"
    torch.backends.cudnn.benchmark = True
    if name == "lm":
        wl = build_workload("lm", device, smoke)
        batch = next(iter(torch.utils.data.DataLoader(wl.dataset, batch_size=wl.batch)))
        batch = batch.to(dev)

        def step() -> None:
            wl.step(batch)
    else:
        arch = {"resnet50": torchvision.models.resnet50, "vgg11": torchvision.models.vgg11}[name]
        model = arch(num_classes=1000).to(dev).to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        size = 64 if smoke else 224
        x = torch.randn(4 if smoke else 64, 3, size, size, device=dev).contiguous(
            memory_format=torch.channels_last
        )
        y = torch.randint(0, 1000, (x.shape[0],), device=dev)

        def step() -> None:
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_amp):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    for _ in range(5):
        step()
    _sync(device)
    start.wait()
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < window_s or n < 3:
        step()
        n += 1
        if n % 4 == 0:
            _sync(device)
    _sync(device)
    out.put((name, n / (time.perf_counter() - t0)))


def _run_together(names: tuple[str, ...], args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(len(names) + 1)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_pair_member, args=(n, args.device, args.smoke, args.pair_window_s, start, out)
        )
        for n in names
    ]
    for p in procs:
        p.start()
    start.wait(timeout=300)
    time.sleep(min(1.0, args.pair_window_s / 4))  # NVML's own averaging window
    sampler = NvmlSampler()
    with sampler:
        time.sleep(args.pair_window_s * 0.7)
    rates: dict[str, float] = {}
    for _ in procs:
        name, rate = out.get(timeout=300)
        rates[name] = rate
    for p in procs:
        p.join()
    util, mem = sampler.means_pct()
    return {"its_per_s": rates, "gpu_util_pct": util, "gpu_mem_util_pct": mem}


def run_pairs(
    args: argparse.Namespace, results: dict[str, Any], save: Callable[[], None], deadline: float
) -> None:
    names = PAIR_WORKLOADS
    solo: dict[str, Any] = {}
    per_run_s = args.pair_window_s + 25
    for n in names:
        if time.monotonic() + per_run_s > deadline:
            results["pairs"]["cut_short"] = f"budget ended before {n} alone"
            return
        solo[n] = _run_together((n,), args)
        results["pairs"]["alone"][n] = solo[n]
        save()
        print(
            f"alone {n:10} {solo[n]['its_per_s'][n]:8.2f} it/s  GPU {solo[n]['gpu_util_pct']}% "
            f"mem {solo[n]['gpu_mem_util_pct']}%",
            flush=True,
        )
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    for a, b in pairs:
        if time.monotonic() + per_run_s > deadline:
            results["pairs"]["cut_short"] = f"budget ended before {a}+{b}"
            return
        both = _run_together((a, b), args)
        slow = max(
            solo[a]["its_per_s"][a] / both["its_per_s"][a],
            solo[b]["its_per_s"][b] / both["its_per_s"][b],
        )
        cand = [
            ShareCandidate(
                workload=n,
                gpu_util=(solo[n]["gpu_util_pct"] or 0.0) / 100,
                gpu_mem_bw_util=(solo[n]["gpu_mem_util_pct"] or 0.0) / 100,
            )
            for n in (a, b)
        ]
        row = {
            "pair": [a, b],
            "together": both,
            "measured_speedup": 2.0 / slow,
            "predicted_speedup": predict_speedup(cand[0], cand[1]),
        }
        results["pairs"]["together"].append(row)
        save()
        print(
            f"{a}+{b}: measured δ {row['measured_speedup']:.3f}  "
            f"predicted {row['predicted_speedup']:.3f}",
            flush=True,
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_cores.json")
    ap.add_argument("--csv-dir", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny models and two points each")
    ap.add_argument("--workloads", nargs="*", default=["resnet50-jpeg", "resnet50-decoded", "lm"])
    ap.add_argument("--parts", nargs="*", default=["cores", "pairs"])
    ap.add_argument("--warmup-s", type=float, default=4.0)
    ap.add_argument("--window-s", type=float, default=5.0)
    ap.add_argument("--pair-window-s", type=float, default=6.0)
    ap.add_argument("--budget-s", type=float, default=400.0)
    args = ap.parse_args()

    import torch

    deadline = time.monotonic() + args.budget_s
    results: dict[str, Any] = {
        "machine": machine_facts(torch),
        "nvml": NvmlSampler().status(),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "cores": {},
        "pairs": {"alone": {}, "together": []},
    }

    def save() -> None:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")

    results["pinning"] = pinning_check(0.5 if args.smoke else 2.0)
    save()
    print(json.dumps(results["machine"]), results["nvml"], results["pinning"], flush=True)
    if "cores" in args.parts:
        share = args.budget_s * (0.7 if "pairs" in args.parts else 1.0)
        run_cores(args, results, save, min(deadline, time.monotonic() + share))
    if "pairs" in args.parts:
        run_pairs(args, results, save, deadline)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
