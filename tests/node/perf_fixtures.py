"""sysfs/procfs trees for coda_node.system.perf, laid out like the kernel's.

The kernel puts each PMU at ``/sys/devices/<pmu>`` and links it from
``/sys/bus/event_source/devices/<pmu> -> ../../../devices/<pmu>``; a PMU directory has
``type``, optionally ``cpumask``, ``format/<term>`` ("config:0-7") and
``events/<alias>`` ("event=0x04,umask=0x03") with ``<alias>.scale`` / ``<alias>.unit``.
The values below follow arch/x86/events/intel/uncore_snbep.c (SKX) and
arch/x86/events/{intel,amd}/core.c; the PMU type numbers are assigned dynamically by
the kernel, so the ones here are only plausible.

- :func:`make_skx_tree`: a 2-socket Skylake-SP server, 28 cores x 2 threads per socket
  (CPUs 0-27 and 56-83 on socket 0, 28-55 and 84-111 on socket 1), so every uncore
  cpumask is "0,28". Options add the Ice Lake-style free-running IMC PMUs or drop the
  free-running IIO PMUs.
- :func:`make_amd_tree`: a 2-socket Zen host: core PMU, software PMUs, no Intel uncore.
"""

from __future__ import annotations

from pathlib import Path

from coda_node.system.paths import SystemRoot

SKX_SOCKETS = 2
SKX_CORES_PER_SOCKET = 28
SKX_CPUS = SKX_SOCKETS * SKX_CORES_PER_SOCKET * 2

# Dynamically assigned PMU type numbers (plausible, fixed for the tests).
SKX_TYPES: dict[str, int] = {
    "software": 1,
    "tracepoint": 2,
    "cpu": 4,
    "breakpoint": 5,
    "msr": 6,
    "uprobe": 7,
    "kprobe": 8,
    **{f"uncore_iio_{i}": 30 + i for i in range(6)},
    **{f"uncore_iio_free_running_{i}": 36 + i for i in range(6)},
    **{f"uncore_imc_{i}": 50 + i for i in range(6)},
    **{f"uncore_imc_free_running_{i}": 60 + i for i in range(2)},
}

CAS_SCALE = "6.103515625e-5"  # 64 / 2**20: one 64-byte line per CAS, in MiB
IIO_BW_SCALE = "3.814697266e-6"  # 4 / 2**20: 4 bytes per count, in MiB

INTEL_CORE_FORMAT = {
    "event": "config:0-7",
    "umask": "config:8-15",
    "edge": "config:18",
    "pc": "config:19",
    "any": "config:21",
    "inv": "config:23",
    "cmask": "config:24-31",
    "in_tx": "config:32",
    "in_tx_cp": "config:33",
    "offcore_rsp": "config1:0-63",
    "ldlat": "config1:0-15",
    "frontend": "config1:0-23",
}
INTEL_CORE_EVENTS = {
    "cpu-cycles": "event=0x3c",
    "instructions": "event=0xc0",
    "ref-cycles": "event=0x00,umask=0x03",
    "cache-misses": "event=0x2e,umask=0x41",
    "mem-loads": "event=0xcd,umask=0x1,ldlat=3",
    "mem-stores": "event=0xd0,umask=0x82",
    "topdown-total-slots": "event=0x3c,umask=0x0,any=1",
    "topdown-total-slots.scale": "2",
}
SKX_UNCORE_FORMAT = {  # snbep_uncore_format_group
    "event": "config:0-7",
    "umask": "config:8-15",
    "edge": "config:18",
    "inv": "config:23",
    "thresh": "config:24-31",
}
SKX_IIO_FORMAT = {  # skx_uncore_iio_format_group
    "event": "config:0-7",
    "umask": "config:8-15",
    "edge": "config:18",
    "inv": "config:23",
    "thresh": "config:24-35",
    "ch_mask": "config:36-43",
    "fc_mask": "config:44-46",
}
SKX_IMC_EVENTS = {  # hswep_uncore_imc_events
    "clockticks": "event=0x00,umask=0x00",
    "cas_count_read": "event=0x04,umask=0x03",
    "cas_count_read.scale": CAS_SCALE,
    "cas_count_read.unit": "MiB",
    "cas_count_write": "event=0x04,umask=0x0c",
    "cas_count_write.scale": CAS_SCALE,
    "cas_count_write.unit": "MiB",
}
ICX_IMC_FREE_RUNNING_EVENTS = {  # icx_uncore_imc_freerunning_events
    "dclk": "event=0xff,umask=0x10",
    "read": "event=0xff,umask=0x20",
    "read.scale": CAS_SCALE,
    "read.unit": "MiB",
    "write": "event=0xff,umask=0x21",
    "write.scale": CAS_SCALE,
    "write.unit": "MiB",
}


def _skx_iio_free_running_events() -> dict[str, str]:
    events = {"ioclk": "event=0xff,umask=0x10"}
    for port in range(4):
        for direction, base in (("in", 0x20), ("out", 0x24)):
            name = f"bw_{direction}_port{port}"
            events[name] = f"event=0xff,umask={base + port:#x}"
            events[f"{name}.scale"] = IIO_BW_SCALE
            events[f"{name}.unit"] = "MiB"
        events[f"util_in_port{port}"] = f"event=0xff,umask={0x30 + 2 * port:#x}"
        events[f"util_out_port{port}"] = f"event=0xff,umask={0x31 + 2 * port:#x}"
    return events


def write_pmu(
    root: Path,
    name: str,
    pmu_type: int,
    *,
    formats: dict[str, str] | None = None,
    events: dict[str, str] | None = None,
    cpumask: str | None = None,
) -> Path:
    """/sys/devices/<name> plus its /sys/bus/event_source/devices link, as the kernel does."""
    device = root / "sys/devices" / name
    device.mkdir(parents=True)
    (device / "type").write_text(f"{pmu_type}\n")
    (device / "perf_event_mux_interval_ms").write_text("4\n")
    (device / "uevent").write_text("")
    if formats is not None:
        (device / "format").mkdir()
        for term, text in formats.items():
            (device / "format" / term).write_text(f"{text}\n")
    if events is not None:
        (device / "events").mkdir()
        for alias, text in events.items():
            (device / "events" / alias).write_text(f"{text}\n")
    if cpumask is not None:
        (device / "cpumask").write_text(f"{cpumask}\n")
    bus = root / "sys/bus/event_source/devices"
    bus.mkdir(parents=True, exist_ok=True)
    (bus / name).symlink_to(Path("../../../devices") / name)
    return device


def write_topology(root: Path, package_of_cpu: list[int]) -> None:
    cpus = root / "sys/devices/system/cpu"
    for cpu, package in enumerate(package_of_cpu):
        topo = cpus / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "die_id").write_text("0\n")
    (cpus / "online").write_text(f"0-{len(package_of_cpu) - 1}\n")
    (cpus / "possible").write_text(f"0-{len(package_of_cpu) - 1}\n")


def write_proc(root: Path, *, paranoid: int | None, cap_eff: int) -> None:
    if paranoid is not None:
        kernel = root / "proc/sys/kernel"
        kernel.mkdir(parents=True)
        (kernel / "perf_event_paranoid").write_text(f"{paranoid}\n")
    status = root / "proc/self/status"
    status.parent.mkdir(parents=True, exist_ok=True)
    status.write_text(f"Name:\tcoda-node\nCapPrm:\t{cap_eff:016x}\nCapEff:\t{cap_eff:016x}\n")


ROOT_CAPS = (1 << 41) - 1  # CapEff of root on a 6.x kernel: every capability, incl. 38


def _software_pmus(root: Path, types: dict[str, int]) -> None:
    write_pmu(root, "software", types["software"])
    write_pmu(root, "tracepoint", types["tracepoint"])
    write_pmu(root, "breakpoint", types["breakpoint"])
    write_pmu(
        root, "msr", types["msr"], formats={"event": "config:0-63"}, events={"tsc": "event=0x00"}
    )
    write_pmu(
        root,
        "uprobe",
        types["uprobe"],
        formats={"retprobe": "config:0", "ref_ctr_offset": "config:32-63"},
    )
    write_pmu(root, "kprobe", types["kprobe"], formats={"retprobe": "config:0"})


def skx_package_of_cpu() -> list[int]:
    per = SKX_CORES_PER_SOCKET
    # Linux enumerates first threads of socket 0, then socket 1, then the siblings.
    return [(cpu % (2 * per)) // per for cpu in range(SKX_CPUS)]


def make_skx_tree(
    root: Path,
    *,
    imc_programmable: bool = True,
    imc_free_running: bool = False,
    iio_free_running: bool = True,
    paranoid: int | None = 2,
    cap_eff: int = ROOT_CAPS,
) -> SystemRoot:
    """A 2-socket Skylake-SP-like server. Returns the SystemRoot pointing at it."""
    _software_pmus(root, SKX_TYPES)
    write_pmu(root, "cpu", SKX_TYPES["cpu"], formats=INTEL_CORE_FORMAT, events=INTEL_CORE_EVENTS)
    uncore_cpumask = f"0,{SKX_CORES_PER_SOCKET}"
    for i in range(6):
        # The programmable IIO PMUs have no events/ directory: only raw codes work there.
        write_pmu(
            root,
            f"uncore_iio_{i}",
            SKX_TYPES[f"uncore_iio_{i}"],
            formats=SKX_IIO_FORMAT,
            cpumask=uncore_cpumask,
        )
        if iio_free_running:
            write_pmu(
                root,
                f"uncore_iio_free_running_{i}",
                SKX_TYPES[f"uncore_iio_free_running_{i}"],
                formats={"event": "config:0-7", "umask": "config:8-15"},
                events=_skx_iio_free_running_events(),
                cpumask=uncore_cpumask,
            )
        if imc_programmable:
            write_pmu(
                root,
                f"uncore_imc_{i}",
                SKX_TYPES[f"uncore_imc_{i}"],
                formats=SKX_UNCORE_FORMAT,
                events=SKX_IMC_EVENTS,
                cpumask=uncore_cpumask,
            )
    if imc_free_running:
        for i in range(2):
            write_pmu(
                root,
                f"uncore_imc_free_running_{i}",
                SKX_TYPES[f"uncore_imc_free_running_{i}"],
                formats={"event": "config:0-7", "umask": "config:8-15"},
                events=ICX_IMC_FREE_RUNNING_EVENTS,
                cpumask=uncore_cpumask,
            )
    write_topology(root, skx_package_of_cpu())
    write_proc(root, paranoid=paranoid, cap_eff=cap_eff)
    return SystemRoot(root)


AMD_TYPES: dict[str, int] = {
    "software": 1,
    "tracepoint": 2,
    "cpu": 4,
    "breakpoint": 5,
    "msr": 9,
    "uprobe": 7,
    "kprobe": 6,
    "power": 10,
    "amd_df": 11,
    "amd_l3": 12,
}
AMD_CORE_FORMAT = {  # arch/x86/events/amd/core.c: the event select is split in two
    "event": "config:0-7,32-35",
    "umask": "config:8-15",
    "edge": "config:18",
    "inv": "config:23",
    "cmask": "config:24-31",
}


def make_amd_tree(root: Path, *, paranoid: int | None = 2, cap_eff: int = ROOT_CAPS) -> SystemRoot:
    """A 2-socket Zen host, 64 CPUs per socket: no uncore_imc / uncore_iio at all."""
    _software_pmus(root, AMD_TYPES)
    write_pmu(
        root,
        "cpu",
        AMD_TYPES["cpu"],
        formats=AMD_CORE_FORMAT,
        events={"cpu-cycles": "event=0x76", "instructions": "event=0xc0"},
    )
    write_pmu(
        root,
        "power",
        AMD_TYPES["power"],
        formats={"event": "config:0-7"},
        events={
            "energy-pkg": "event=0x02",
            "energy-pkg.scale": "2.3283064365386962890625e-10",
            "energy-pkg.unit": "Joules",
        },
        cpumask="0,64",
    )
    # The data fabric and L3 PMUs count AMD's own events; none is a memory controller
    # with named CAS events.
    write_pmu(
        root,
        "amd_df",
        AMD_TYPES["amd_df"],
        formats={"event": "config:0-7,32-35,59-60", "umask": "config:8-15"},
        cpumask="0,64",
    )
    write_pmu(
        root,
        "amd_l3",
        AMD_TYPES["amd_l3"],
        formats={"event": "config:0-7", "umask": "config:8-15"},
        cpumask="0,8,16,24,32,40,48,56,64,72,80,88,96,104,112,120",
    )
    write_topology(root, [cpu // 64 for cpu in range(128)])
    write_proc(root, paranoid=paranoid, cap_eff=cap_eff)
    return SystemRoot(root)
