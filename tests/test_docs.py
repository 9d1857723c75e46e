"""The docs stay true: every coda.conf key is documented with its real default."""

from __future__ import annotations

from pathlib import Path

from slurm_plugin.conf import CONFIG_KEYS, parse_config

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
