"""A resctrl mount under a tmp dir that behaves like the kernel where CODA touches it.

:func:`build` lays out ``<tmp>/proc/self/mounts`` and ``<tmp>/sys/fs/resctrl`` the way the
kernel does for one hardware variant, and returns a :class:`FakeResctrl` whose ``mkdir``,
``rmdir`` and ``write`` stand in for the kernel's handlers (fs/resctrl/rdtgroup.c,
ctrlmondata.c): a new group gets its files, CLOSIDs and RMIDs run out with ENOSPC, bad
schemata values are refused with EINVAL and a ``info/last_cmd_status`` message in the
kernel's words, tasks that exited give ESRCH, rmdir moves tasks back to the parent. Files
are re-rendered after every change, so code under test reads real files.

Variants (``VARIANTS``):

* ``full``: two sockets, L3 CAT (20-bit cbm_mask, 16 CLOSIDs), MB (10 %/10 %, 8 CLOSIDs),
  L3_MON with llc_occupancy, mbm_total_bytes and mbm_local_bytes (224 RMIDs).
* ``nomb``: as ``full`` without MB.
* ``nombm``: as ``full`` but L3_MON lists llc_occupancy only (CMT without MBM).
* ``mba_mbps``: as ``full``, mounted with ``-o mba_MBps`` (MB values in MBps).
* ``cat_only``: L3 CAT only: no MB, no monitoring.
* ``cdp``: mounted with ``-o cdp``: L3CODE/L3DATA (8 CLOSIDs each) plus MB and L3_MON.
* ``unmounted``: ``/sys/fs/resctrl`` is an empty directory and not in the mount table.
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from coda_node.system.paths import SystemRoot
from coda_node.system.resctrl import MBA_MAX_MBPS, ResctrlControl, ResctrlInfo, discover

VARIANTS = ("full", "nomb", "nombm", "mba_mbps", "cat_only", "cdp", "unmounted")

CBM_LEN = 20
CBM_MASK = (1 << CBM_LEN) - 1
MIN_CBM_BITS = 1
MB_MIN = 10
MB_GRAN = 10
ALL_EVENTS = ("llc_occupancy", "mbm_total_bytes", "mbm_local_bytes")
ROOT_PIDS = (1, 2, 812, 1000, 1001, 1002, 4242)

OTHER_MOUNTS = (
    "sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0",
    "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0",
    "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0",
)


@dataclass(frozen=True, slots=True)
class Spec:
    mounted: bool = True
    l3: bool = True
    cdp: bool = False
    mb: bool = True
    mba_mbps: bool = False
    mon_features: tuple[str, ...] = ALL_EVENTS  # () means no L3_MON at all

    @property
    def mon(self) -> bool:
        return bool(self.mon_features)


SPECS: dict[str, Spec] = {
    "full": Spec(),
    "nomb": Spec(mb=False),
    "nombm": Spec(mon_features=("llc_occupancy",)),
    "mba_mbps": Spec(mba_mbps=True),
    "cat_only": Spec(mb=False, mon_features=()),
    "cdp": Spec(cdp=True),
    "unmounted": Spec(mounted=False),
}


def _os_error(code: int, path: Path) -> OSError:
    return OSError(code, os.strerror(code), str(path))


class FakeResctrl:
    """The kernel side of a fixture resctrl mount. ``writes`` logs every write() the code
    under test made, as (path relative to the resctrl root, bytes), accepted or not."""

    def __init__(
        self,
        base: Path,
        variant: str,
        *,
        domains: tuple[int, ...] = (0, 1),
        num_rmids: int = 224,
    ) -> None:
        self.spec = SPECS[variant]
        self.root = SystemRoot(base)
        self.path = base / "sys/fs/resctrl"
        self.domains = domains
        self.num_rmids = num_rmids
        self.live_pids: set[int] = set(ROOT_PIDS)
        self.writes: list[tuple[str, bytes]] = []
        self._schemata: dict[str, dict[str, dict[int, int]]] = {}  # group -> resource -> dom
        self._mon_groups: dict[str, list[str]] = {}  # ctrl group ("" = root) -> mon names
        self._task_ctrl: dict[int, str] = {}
        self._task_mon: dict[int, str | None] = {}
        self._build(base)

    # -- layout ------------------------------------------------------------------------

    @property
    def resources(self) -> tuple[str, ...]:
        """Schemata resource names in the kernel's order (rdt_resources_all)."""
        names: list[str] = []
        if self.spec.l3:
            names += ["L3CODE", "L3DATA"] if self.spec.cdp else ["L3"]
        if self.spec.mb:
            names.append("MB")
        return tuple(names)

    @property
    def num_closids(self) -> int:
        counts = []
        if self.spec.l3:
            counts.append(8 if self.spec.cdp else 16)
        if self.spec.mb:
            counts.append(8)
        return min(counts, default=0)

    def _default_schemata(self) -> dict[str, dict[int, int]]:
        mb_default = MBA_MAX_MBPS if self.spec.mba_mbps else 100
        return {
            r: dict.fromkeys(self.domains, mb_default if r == "MB" else CBM_MASK)
            for r in self.resources
        }

    def _build(self, base: Path) -> None:
        mounts = list(OTHER_MOUNTS)
        opts = ["rw", "relatime"]
        if self.spec.cdp:
            opts.append("cdp")
        if self.spec.mba_mbps:
            opts.append("mba_MBps")
        if self.spec.mounted:
            mounts.append(f"resctrl /sys/fs/resctrl resctrl {','.join(opts)} 0 0")
        (base / "proc/self").mkdir(parents=True, exist_ok=True)
        (base / "proc/self/mounts").write_text("\n".join(mounts) + "\n")
        self.path.mkdir(parents=True, exist_ok=True)
        if not self.spec.mounted:
            return
        info = self.path / "info"
        usage = ";".join(f"{d}={'S' * CBM_LEN}" for d in self.domains)
        cache_files = {
            "bit_usage": usage,
            "cbm_mask": f"{CBM_MASK:x}",
            "min_cbm_bits": str(MIN_CBM_BITS),
            "num_closids": "8" if self.spec.cdp else "16",
            "shareable_bits": "0",
            "sparse_masks": "0",
        }
        for name in self.resources:
            if name != "MB":
                _write_files(info / name, cache_files)
        if self.spec.mb:
            _write_files(
                info / "MB",
                {
                    "bandwidth_gran": str(MB_GRAN),
                    "delay_linear": "1",
                    "min_bandwidth": str(MB_MIN),
                    "num_closids": "8",
                    "thread_throttle_mode": "max",
                },
            )
        if self.spec.mon:
            _write_files(
                info / "L3_MON",
                {
                    "max_threshold_occupancy": "1441792",
                    "mon_features": "\n".join(self.spec.mon_features),
                    "num_rmids": str(self.num_rmids),
                },
            )
        _write_files(info, {"last_cmd_status": "ok"})
        _write_files(self.path, {"cpus": "ffff", "cpus_list": "0-15", "mode": "shareable"})
        for pid in ROOT_PIDS:
            self._task_ctrl[pid] = ""
            self._task_mon[pid] = None
        self._populate_ctrl("")
        self._render()

    def _populate_ctrl(self, name: str) -> None:
        gdir = self.path / name if name else self.path
        if name:
            _write_files(gdir, {"cpus": "0000", "cpus_list": "", "mode": "shareable"})
        self._schemata[name] = self._default_schemata()
        if self.spec.mon:
            (gdir / "mon_groups").mkdir(exist_ok=True)
            self._mon_groups[name] = []
            self._populate_mon_data(gdir)

    def _populate_mon_data(self, gdir: Path) -> None:
        for d in self.domains:
            _write_files(
                gdir / "mon_data" / f"mon_L3_{d:02d}", dict.fromkeys(self.spec.mon_features, "0")
            )

    def _render(self) -> None:
        """Write schemata and tasks of every group as the kernel would show them."""
        width = max((len(r) for r in self.resources), default=0)
        for group, resources in self._schemata.items():
            gdir = self.path / group if group else self.path
            lines = []
            for r, values in resources.items():
                doms = ";".join(f"{d}={_show_value(r, v)}" for d, v in values.items())
                lines.append(f"{r:>{width}}:{doms}")
            if lines:
                (gdir / "schemata").write_text("\n".join(lines) + "\n")
            members = sorted(p for p, g in self._task_ctrl.items() if g == group)
            (gdir / "tasks").write_text("".join(f"{p}\n" for p in members))
            for mon in self._mon_groups.get(group, []):
                mdir = gdir / "mon_groups" / mon
                mine = sorted(p for p in members if self._task_mon.get(p) == mon)
                (mdir / "tasks").write_text("".join(f"{p}\n" for p in mine))

    # -- kernel handlers ---------------------------------------------------------------

    def _status(self, text: str) -> None:
        (self.path / "info/last_cmd_status").write_text(text + "\n")

    def _rmids_in_use(self) -> int:
        # One per control group (the root's is RMID 0) and one per MON group.
        return len(self._schemata) + sum(len(v) for v in self._mon_groups.values())

    def _where(self, path: Path) -> tuple[str, str | None]:
        """(ctrl group, mon group) for a directory path in the mount; ValueError if none."""
        rel = path.relative_to(self.path).parts
        if len(rel) == 1:
            return rel[0], None
        if len(rel) == 2 and rel[0] == "mon_groups":
            return "", rel[1]
        if len(rel) == 3 and rel[1] == "mon_groups":
            return rel[0], rel[2]
        raise ValueError(path)

    def mkdir(self, path: Path) -> None:
        self._status("ok")
        if path.exists():
            raise _os_error(errno.EEXIST, path)
        try:
            ctrl, mon = self._where(path)
        except ValueError:
            raise _os_error(errno.EPERM, path) from None
        if mon is None:
            if not self.resources:
                raise _os_error(errno.EPERM, path)
            if len(self._schemata) >= self.num_closids:  # the root holds CLOSID 0
                self._status("Out of CLOSIDs")
                raise _os_error(errno.ENOSPC, path)
        elif not self.spec.mon or ctrl not in self._schemata:
            raise _os_error(errno.EPERM if self.spec.mon else errno.ENOENT, path)
        if self.spec.mon and self._rmids_in_use() >= self.num_rmids:
            self._status("Out of RMIDs")
            raise _os_error(errno.ENOSPC, path)
        path.mkdir()
        if mon is None:
            self._populate_ctrl(ctrl)
        else:
            _write_files(path, {"cpus": "0000", "cpus_list": ""})
            self._populate_mon_data(path)
            self._mon_groups[ctrl].append(mon)
        self._render()

    def rmdir(self, path: Path) -> None:
        self._status("ok")
        if not path.is_dir():
            raise _os_error(errno.ENOENT, path)
        try:
            ctrl, mon = self._where(path)
        except ValueError:
            raise _os_error(errno.EPERM, path) from None
        if mon is None:
            if ctrl not in self._schemata or not ctrl:
                raise _os_error(errno.EPERM, path)
            for pid, group in self._task_ctrl.items():
                if group == ctrl:  # "Removing a directory will move all tasks ... to the parent"
                    self._task_ctrl[pid], self._task_mon[pid] = "", None
            del self._schemata[ctrl]
            self._mon_groups.pop(ctrl, None)
        else:
            for pid, m in self._task_mon.items():
                if m == mon and self._task_ctrl[pid] == ctrl:
                    self._task_mon[pid] = None
            self._mon_groups[ctrl].remove(mon)
        shutil.rmtree(path)
        self._render()

    def write(self, path: Path, data: bytes) -> None:
        self.writes.append((str(path.relative_to(self.path)), data))
        self._status("ok")
        if not path.is_file():
            raise _os_error(errno.ENOENT, path)
        if path.name == "schemata":
            self._write_schemata(path.parent, data)
        elif path.name == "tasks":
            self._write_tasks(path.parent, data)
        else:
            path.write_bytes(data)

    def _einval(self, path: Path, status: str | None = None) -> OSError:
        if status is not None:
            self._status(status)
        return _os_error(errno.EINVAL, path)

    def _write_schemata(self, gdir: Path, data: bytes) -> None:
        group = "" if gdir == self.path else gdir.name
        path = gdir / "schemata"
        text = data.decode()
        if not text.endswith("\n"):  # "Valid input requires a trailing newline"
            raise self._einval(path)
        staged: dict[str, dict[int, int]] = {}
        for line in text[:-1].split("\n"):
            name, sep, rest = line.partition(":")
            name = name.strip()
            if not sep:
                raise self._einval(path, "Missing ':'")
            if not rest:
                raise self._einval(path, f"Missing '{name}' value")
            if name not in self.resources:
                raise self._einval(path, f"Unknown or unsupported resource name '{name}'")
            for item in rest.split(";"):
                if not item:
                    continue
                dom_text, eq, val = item.partition("=")
                if not eq or not dom_text.isdigit():
                    raise self._einval(path, "Missing '=' or non-numeric domain")
                dom = int(dom_text)
                if dom not in self.domains:
                    raise self._einval(path)
                if dom in staged.setdefault(name, {}):
                    raise self._einval(path, f"Duplicate domain {dom}")
                staged[name][dom] = self._parse_value(path, name, val.strip())
        for name, values in staged.items():
            self._schemata[group][name].update(values)
        self._render()

    def _parse_value(self, path: Path, resource: str, val: str) -> int:
        if resource == "MB":
            if not val.isdigit():
                raise self._einval(path, f"Invalid MB value {val}")
            bw = int(val)
            if self.spec.mba_mbps:
                return bw
            if not MB_MIN <= bw <= 100:
                raise self._einval(path, f"MB value {bw} out of range [{MB_MIN},100]")
            return -(-bw // MB_GRAN) * MB_GRAN  # the kernel rounds up to the next step
        try:
            mask = int(val, 16)
        except ValueError:
            raise self._einval(path, f"Non-hex character in the mask {val}") from None
        if mask == 0 or mask > CBM_MASK:
            raise self._einval(path, "Mask out of range")
        low = mask & -mask
        run = ((mask + low) & ~mask) - low
        if run != mask:
            raise self._einval(path, f"The mask {mask:x} has non-consecutive 1-bits")
        if run.bit_count() < MIN_CBM_BITS:
            raise self._einval(path, f"Need at least {MIN_CBM_BITS} bits in the mask")
        return mask

    def _write_tasks(self, gdir: Path, data: bytes) -> None:
        path = gdir / "tasks"
        try:
            pid = int(data.decode().strip(), 0)  # kstrtoint(strstrip(buf), 0): one id only
        except ValueError:
            raise self._einval(path) from None
        if pid <= 0:
            raise self._einval(path)
        if pid not in self.live_pids:
            self._status(f"No task {pid}")
            raise _os_error(errno.ESRCH, path)
        ctrl, mon = ("", None) if gdir == self.path else self._where(gdir)
        if mon is None:
            self._task_ctrl[pid], self._task_mon[pid] = ctrl, None
        elif self._task_ctrl.get(pid) != ctrl:
            raise self._einval(path, "Can't move task to different control group")
        else:
            self._task_mon[pid] = mon
        self._render()

    # -- test helpers ------------------------------------------------------------------

    def exit_task(self, pid: int) -> None:
        """The task exits: gone from every tasks file, ESRCH from now on."""
        self.live_pids.discard(pid)
        self._task_ctrl.pop(pid, None)
        self._task_mon.pop(pid, None)
        self._render()

    def set_counter(self, group: str, domain: int, event: str, value: int | str) -> None:
        """Set ``<group>/mon_data/mon_L3_<domain>/<event>`` ("" is the root group)."""
        gdir = self.path / group if group else self.path
        (gdir / "mon_data" / f"mon_L3_{domain:02d}" / event).write_text(f"{value}\n")

    def text(self, rel: str) -> str:
        return (self.path / rel).read_text()

    def control(self, info: ResctrlInfo | None = None) -> ResctrlControl:
        """A ResctrlControl wired to this fake kernel."""
        return ResctrlControl(
            self.root,
            info if info is not None else discover(self.root),
            mkdir=self.mkdir,
            rmdir=self.rmdir,
            write=self.write,
        )


def _show_value(resource: str, value: int) -> str:
    """As older kernels print schemata values: "%0*x" masks, "%*u" MB with width 3."""
    if resource == "MB":
        return f"{value:3d}"
    return f"{value:0{(CBM_LEN + 3) // 4}x}"


def _write_files(directory: Path, files: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (directory / name).write_text(content + "\n" if content else "")


def build(
    base: Path, variant: str, *, domains: tuple[int, ...] = (0, 1), num_rmids: int = 224
) -> FakeResctrl:
    """Lay out ``variant`` under ``base`` (see the module docstring for the variants)."""
    return FakeResctrl(base, variant, domains=domains, num_rmids=num_rmids)
