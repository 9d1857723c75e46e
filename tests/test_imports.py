"""Imports run one way: the layers of each package, what each package may use of the other,
which modules stay pure, and no import circles.

Read from the source with ``ast`` (every ``import``, also those inside functions), nothing is
imported. The rules are what holds today; each place that breaks one is in ``KNOWN`` with
its reason, so a new violation fails here and a fixed one must leave the list
(``test_every_known_exception_still_exists``). The folder map in docs/architecture.md
names the same layers.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("coda_common", "slurm_plugin", "coda_node")

# Layers, lowest first, one folder each: a module may import modules of its own folder or
# of a lower layer's.
# The code both sides use. Slurm's syntax (its configuration files, host lists, JSON
# records) is the ground; coda.conf is written in it; the store keeps the records; the model
# fits them; publishing carries a node's records to the store and refits them. It imports
# neither of the others, so a GPU node installs it without the controller.
COMMON_LAYERS: dict[str, tuple[str, ...]] = {
    "leaves": ("cli", "signature"),
    "slurm syntax": ("slurm", "slurm.*"),
    "configuration": ("config", "config.*"),
    "store": ("store", "store.*"),
    "model": ("model", "model.*"),
    "publish": ("publish", "publish.*"),
}
# The tick reads (sampling), decides (policy), writes (enforce); the status modules turn
# what enforce recorded into the view; the daemon and its CLI wire all of them.
NODE_LAYERS: dict[str, tuple[str, ...]] = {
    "interfaces": ("system", "system.*", "progress_client"),
    "sampling": ("sampling", "sampling.*"),
    "policy": ("policy", "policy.*"),
    "enforce": ("enforce", "enforce.*"),
    "status": ("status", "status.*"),
    "daemon": ("daemon", "daemon.*", "cli"),
}
# The controller: Slurm's command output and what the nodes can give a job are read below
# the pure decision; reserve plans on Slurm's records; the hook decides each submission;
# the simulator replays the decision and reserve; the CLI fronts them all; the dev tools
# start a private Slurm with the hook installed.
CONTROLLER_LAYERS: dict[str, tuple[str, ...]] = {
    "slurm commands": ("slurm", "slurm.*"),
    "node capacity": ("config", "config.*"),
    "decision": ("decision", "decision.*"),
    "reserve": ("reserve", "reserve.*"),
    "hook": ("hook", "hook.*"),
    "simulator": ("sim", "sim.*"),
    "cli": ("cli", "cli.*"),
    "dev tools": ("devtools", "devtools.*"),
}
LAYERS = {"coda_common": COMMON_LAYERS, "slurm_plugin": CONTROLLER_LAYERS, "coda_node": NODE_LAYERS}
# Who may import whom across packages: everyone the common code, nobody the controller
# from the node. Of the controller only the simulator, the CLI and the dev tools use the
# node, and the simulator only its pure policies (it ticks coda-node's own allocator and
# eliminator).
CONTROLLER_MAY_USE_NODE = ("sim.*", "cli", "cli.*", "devtools.*")
SIM_MAY_USE_NODE = set(NODE_LAYERS["policy"])
# Pure: no file, clock, process, thread or hardware access of their own.
PURE = {
    "coda_node": set(NODE_LAYERS["policy"]),
    "coda_common": {
        "signature",
        "store.request",
        "store.usage",
        "store.jobsummary",
        "slurm.adminrecord",
        "slurm.hostlist",
        "slurm.ranges",
    },
    "slurm_plugin": {
        "decision.decide",
        "decision.priors",
        "decision.placement",
        "decision.colocate",
        "decision.tres",
        "reserve.plan",
        "slurm.scontrol",
    },
}
IMPURE_IMPORTS = {
    "os",
    "io",
    "pathlib",
    "subprocess",
    "socket",
    "shutil",
    "tempfile",
    "glob",
    "fcntl",
    "signal",
    "threading",
    "time",
    "ctypes",
    "cffi",
    "pynvml",
}

# Each break of a rule above that exists today: (importer, imported, why). Full module names.
KNOWN_LIST: tuple[tuple[str, str, str], ...] = (
    (
        "coda_common.signature",
        "time",
        "a CPU-time budget on admins' regular expressions (perf_counter_ns), not a reading",
    ),
)
KNOWN = {(a, b): why for a, b, why in KNOWN_LIST}
# Import circles that exist today: (modules, why).
KNOWN_CIRCLES_LIST: tuple[tuple[frozenset[str], str], ...] = ()
KNOWN_CIRCLES = dict(KNOWN_CIRCLES_LIST)


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> dict[str, int]:
    """Every module ``name`` imports, resolved to a module of ours where it is one, with
    the line of its first import."""
    tree = ast.parse(path.read_text(), str(path))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.setdefault(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.setdefault(sub if sub in MODULES else base, node.lineno)
    return found


IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def _ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def _matches(short: str, patterns: tuple[str, ...] | set[str]) -> bool:
    return any(short == p or (p.endswith("*") and short.startswith(p[:-1])) for p in patterns)


def _short(name: str) -> str:
    return name.split(".", 1)[1] if "." in name else ""


def _layer(name: str) -> int | None:
    pkg, short = name.split(".")[0], _short(name)
    for rank, members in enumerate(LAYERS[pkg].values()):
        if _matches(short, members):
            return rank
    return None


def _edges() -> Iterator[tuple[str, str, int]]:
    for importer, found in IMPORTS.items():
        for imported, line in found.items():
            if imported != importer:
                yield importer, imported, line


def _violations() -> list[tuple[str, str, int, str]]:
    out = []
    for importer, imported, line in _edges():
        if not _ours(imported) or not _short(importer) or not _short(imported):
            continue
        src_pkg, dst_pkg = importer.split(".")[0], imported.split(".")[0]
        src, dst = _short(importer), _short(imported)
        if src_pkg == dst_pkg:
            if (_layer(importer) or 0) < (_layer(imported) or 0):
                out.append((importer, imported, line, "imports a higher layer"))
        elif src_pkg == "coda_common":
            out.append((importer, imported, line, "the common code uses a side"))
        elif dst_pkg == "coda_common":
            continue
        elif src_pkg == "coda_node":
            out.append((importer, imported, line, "the node uses a controller module"))
        elif not _matches(src, CONTROLLER_MAY_USE_NODE):
            out.append((importer, imported, line, "the controller uses the node"))
        elif src.startswith("sim") and not _matches(dst, SIM_MAY_USE_NODE):
            out.append((importer, imported, line, "the simulator uses more than the policies"))
    for pkg, pure in PURE.items():
        for name in sorted(
            m for m in MODULES if m.startswith(f"{pkg}.") and _matches(_short(m), pure)
        ):
            for imported, line in IMPORTS[name].items():
                if imported.split(".")[0] in IMPURE_IMPORTS:
                    out.append((name, imported, line, "a pure module does I/O or reads a clock"))
    return out


def test_every_module_has_a_layer() -> None:
    """A new module is placed in a layer here (and in docs/architecture.md's folder map)."""
    unplaced = [n for n in MODULES if _short(n) and _layer(n) is None]
    assert unplaced == [], f"add these to a package's layers in LAYERS: {unplaced}"


def test_imports_run_one_way() -> None:
    new = [
        f"{MODULES[a].relative_to(ROOT)}:{line}: {a} -> {b}: {why}"
        for a, b, line, why in _violations()
        if (a, b) not in KNOWN
    ]
    assert new == [], "\n".join(new)


def _circles() -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph = {a: {b for b in found if b in MODULES and b != a} for a, found in IMPORTS.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_new_import_circles() -> None:
    new = [sorted(c) for c in _circles() if c not in KNOWN_CIRCLES]
    assert new == [], f"import circles: {new}"


def test_every_known_exception_still_exists() -> None:
    """A fixed violation leaves the list, so the list is always what is left to do."""
    found = {(a, b) for a, b, _, _ in _violations()}
    gone = [pair for pair in KNOWN if pair not in found]
    circles = set(_circles())
    gone += [sorted(c) for c in KNOWN_CIRCLES if c not in circles]
    assert gone == [], f"no longer true, remove from KNOWN / KNOWN_CIRCLES: {gone}"


@pytest.mark.parametrize(
    ("importer", "imported", "expected"),
    [
        ("coda_node.sampling.snapshot", "coda_node.enforce.enforcer", "imports a higher layer"),
        ("coda_common.store.profiles", "coda_common.model.fit", "imports a higher layer"),
        ("coda_common.slurm.slurmjson", "coda_common.config.codaconf", "imports a higher layer"),
        ("slurm_plugin.decision.decide", "slurm_plugin.hook.journal", "imports a higher layer"),
        (
            "coda_node.policy.targets",
            "slurm_plugin.hook.submit",
            "the node uses a controller module",
        ),
        ("slurm_plugin.hook.submit", "coda_node.daemon.service", "the controller uses the node"),
        (
            "coda_common.store.profiles",
            "slurm_plugin.decision.decide",
            "the common code uses a side",
        ),
        ("coda_node.daemon.service", "slurm_plugin.cli.main", "the node uses a controller module"),
        (
            "slurm_plugin.sim.engine",
            "coda_node.system.cgroups",
            "the simulator uses more than the policies",
        ),
    ],
)
def test_the_rules_catch_a_violation(
    importer: str, imported: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rule fails on an import that breaks it (the checker itself can fail)."""
    monkeypatch.setitem(IMPORTS, importer, {**IMPORTS[importer], imported: 1})
    assert (importer, imported, 1, expected) in _violations()
