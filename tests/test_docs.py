"""The docs stay true: every coda.conf key is documented with its real default."""

from __future__ import annotations

from pathlib import Path

from coda_common.config.codaconf import CONFIG_KEYS, parse_config

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_every_config_key_is_documented_with_its_default() -> None:
    text = (DOCS / "config.md").read_text()
    for key, spec in CONFIG_KEYS.items():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{key}` |")), None)
        assert row is not None, f"{key} missing from docs/config.md"
        assert (f"`{spec.default}`" in row) if spec.default else "(empty)" in row, row


def test_the_documented_example_parses() -> None:
    text = (DOCS / "config.md").read_text()
    example = text.split("## Example", 1)[1].split("```")[1]
    cfg, warnings = parse_config(example, "docs/config.md")
    assert cfg.max_cpus_per_gpu == 32 and cfg.exclude_partitions == ("debug",)
    assert warnings == []


def test_every_documented_simulate_command_is_valid_for_todays_cli() -> None:
    """docs/evaluation.md shows each table under the command that produced it;
    ``bench/check_evaluation.py`` re-runs them (minutes). This checks, in milliseconds, that
    each still parses: its options, trace, placements, --param names and --coda-conf keys."""
    import importlib.util
    import shlex
    import sys

    from slurm_plugin.cli import simulate as cs
    from slurm_plugin.sim.workloads import JobModel

    path = DOCS.parent / "bench" / "check_evaluation.py"
    spec = importlib.util.spec_from_file_location("check_evaluation", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("check_evaluation", mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    blocks = mod.find_blocks((DOCS / "evaluation.md").read_text())
    assert len(blocks) >= 15, [b.command for b in blocks]
    for block in blocks:
        if not block.command.startswith("coda-slurm simulate "):
            # A bench script that runs such commands itself (the eliminator's sweep).
            script = DOCS.parent / shlex.split(block.command)[1]
            assert script.is_file() and script.parent.name == "bench", block.command
            continue
        args = shlex.split(block.command)[2:]
        ctx = cs.simulate_cmd.make_context("simulate", args)
        p = ctx.params
        assert p["trace_spec"].split(":")[0] in ("philly", "muri", "alibaba", "synthetic"), block
        cs._parse_placement(p["placement_spec"])
        JobModel().with_params(cs._params(p["param_items"]))
        conf = cs._merge_conf(cs.CODA_CONF + p["coda_conf_items"])
        _, warnings = parse_config("\n".join(conf), "--coda-conf")
        assert warnings == [], (block.command, warnings)
        assert block.output and block.output[0].startswith(p["trace_spec"].split(":")[0]), block
