"""``coda-node check``: which node capabilities are usable here, and why not.

Missing hardware is a state, not a crash: every probe returns a :class:`Capability`
with a reason an admin can act on. Probes only read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from coda_node.paths import SystemRoot


@dataclass(frozen=True, slots=True)
class Capability:
    name: str
    available: bool
    detail: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _mounts(root: SystemRoot) -> list[tuple[str, str, str, str]]:
    """(device, mount point, fs type, options) from /proc/self/mounts."""
    try:
        text = root.path("/proc/self/mounts").read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            out.append((parts[0], parts[1], parts[2], parts[3]))
    return out


def probe_cgroups(root: SystemRoot) -> list[Capability]:
    mounts = _mounts(root)
    v2 = [m for m in mounts if m[2] == "cgroup2"]
    v1 = {opt for m in mounts if m[2] == "cgroup" for opt in m[3].split(",")}
    caps = []
    if "cpuset" in v1:
        caps.append(Capability("cpuset control", True, "cgroup v1 cpuset controller mounted"))
    elif v2:
        controllers = root.path(v2[0][1] + "/cgroup.controllers")
        try:
            have = controllers.read_text().split()
        except OSError:
            have = []
        ok = "cpuset" in have
        caps.append(
            Capability(
                "cpuset control",
                ok,
                "cgroup v2, cpuset controller " + ("enabled" if ok else "not enabled at the root"),
            )
        )
    else:
        caps.append(Capability("cpuset control", False, "no cgroup cpuset controller mounted"))
    if "cpu" in v1 or v2:
        caps.append(
            Capability(
                "CPU quota", True, "cgroup " + ("v1 cpu" if "cpu" in v1 else "v2") + " controller"
            )
        )
    else:
        caps.append(Capability("CPU quota", False, "no cgroup cpu controller mounted"))
    return caps


def probe_resctrl(root: SystemRoot) -> list[Capability]:
    mounted = any(m[2] == "resctrl" for m in _mounts(root))
    info = root.path("/sys/fs/resctrl/info")
    if not mounted or not info.is_dir():
        why = "resctrl not mounted" if not mounted else "resctrl has no info/ directory"
        return [
            Capability("memory-bandwidth control", False, f"{why} (Intel RDT MBA)"),
            Capability("memory-bandwidth monitoring", False, f"{why} (Intel RDT MBM)"),
        ]
    mb = (info / "MB").is_dir()
    mon = (info / "L3_MON").is_dir()
    return [
        Capability(
            "memory-bandwidth control",
            mb,
            "resctrl MB resource" if mb else "resctrl mounted, no MB resource",
        ),
        Capability(
            "memory-bandwidth monitoring",
            mon,
            "resctrl L3_MON" if mon else "resctrl mounted, no L3_MON",
        ),
    ]


def probe_uncore(root: SystemRoot) -> Capability:
    devices = root.path("/sys/bus/event_source/devices")
    try:
        names = sorted(p.name for p in devices.iterdir())
    except OSError:
        return Capability("uncore counters", False, f"cannot list {devices}")
    imc = [n for n in names if n.startswith("uncore_imc")]
    if imc:
        return Capability("uncore counters", True, f"{len(imc)} memory-controller PMUs")
    return Capability(
        "uncore counters", False, "no uncore_imc PMUs (PMUs here: " + ", ".join(names) + ")"
    )


def probe_gpus(root: SystemRoot) -> Capability:
    devs = sorted(p.name for p in root.dev.glob("nvidia[0-9]*"))
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
    except Exception as exc:
        reason = getattr(exc, "__class__", type(exc)).__name__
        return Capability(
            "GPUs (NVML)", False, f"NVML unavailable ({reason}: {exc}); device nodes: {len(devs)}"
        )
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    return Capability("GPUs (NVML)", count > 0, f"{count} GPUs via NVML")


def probe_all(root: SystemRoot) -> list[Capability]:
    return [*probe_cgroups(root), *probe_resctrl(root), probe_uncore(root), probe_gpus(root)]
