"""TRES string parsing and editing (slurm_plugin.decision.tres)."""

from __future__ import annotations

import pytest

from slurm_plugin.decision.tres import (
    MAX_TRES_CHARS,
    TresError,
    TresItem,
    cpus_per_gpu,
    gpu_count,
    gpu_types,
    gres_separator,
    parse_tres,
    set_gpu_count,
    task_cpus,
    with_task_cpus,
)


@pytest.mark.parametrize(
    ("text", "items"),
    [
        (None, ()),
        ("", ()),
        ("gres:gpu:2", (TresItem("gres", "gpu", None, 2),)),
        ("gres:gpu", (TresItem("gres", "gpu", None, 1),)),
        ("gpu:4", (TresItem("", "gpu", None, 4),)),
        ("gpu", (TresItem("", "gpu", None, 1),)),
        ("gres:gpu:a100:2", (TresItem("gres", "gpu", "a100", 2),)),
        ("gpu:a100", (TresItem("", "gpu", "a100", 1),)),
        ("gpu:1g.10gb:3", (TresItem("", "gpu", "1g.10gb", 3),)),
        ("gres:gpu:a100_3g.20gb:1", (TresItem("gres", "gpu", "a100_3g.20gb", 1),)),
        ("gpu:1g.10gb", (TresItem("", "gpu", "1g.10gb", 1),)),
        ("gres/gpu:2", (TresItem("gres", "gpu", None, 2),)),
        ("gres:gpu:0", (TresItem("gres", "gpu", None, 0),)),
        ("gres:gpu:1k", (TresItem("gres", "gpu", None, 1024),)),
        ("gres:gpu:2K", (TresItem("gres", "gpu", None, 2048),)),
        ("license:foo:1", (TresItem("license", "foo", None, 1),)),
        ("license:matlab@licsrv:3", (TresItem("license", "matlab@licsrv", None, 3),)),
        (
            "gres:gpu:a100:2,gres:shard:4,license:foo:1",
            (
                TresItem("gres", "gpu", "a100", 2),
                TresItem("gres", "shard", None, 4),
                TresItem("license", "foo", None, 1),
            ),
        ),
        (
            "gres:gpu:a100:1;gres:gpu:v100:2",
            (TresItem("gres", "gpu", "a100", 1), TresItem("gres", "gpu", "v100", 2)),
        ),
        # Blank items from stray separators are skipped, like Slurm's tokenizer.
        ("gres:gpu:2,", (TresItem("gres", "gpu", None, 2),)),
        (
            " gres:gpu:2 , gres:mps:100 ",
            (
                TresItem("gres", "gpu", None, 2),
                TresItem("gres", "mps", None, 100),
            ),
        ),
        (",,", ()),
    ],
)
def test_parse_tres(text: str | None, items: tuple[TresItem, ...]) -> None:
    assert parse_tres(text) == items


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("gres::2", "empty name"),
        (":2", "empty name"),
        ("gres:gpu:-1", "invalid count"),
        ("gres:gpu:2.5", "invalid count"),
        ("gres:gpu:a100:x", "invalid count"),
        ("gres:gpu:a100:", "invalid count"),
        ("gres:gpu:99999999999999999999", "invalid count"),
        ("gres:gpu:1000001", "too large"),
        ("gres:gpu:1m", "too large"),  # 1 MiB GPUs
        ("gpu:1g", "too large"),  # a count with suffix g, not a MIG type
        ("gres:gpu:a100:2:3", "too many fields"),
        ("gres:gpu:a b:1", "invalid type"),
        ("gres:gpu:\x01:1", "invalid type"),
        ("gres:gp\x00u:1", "invalid name"),
        ("gres:gpu\n:1", "invalid name"),
        ("gres:gpu:\udcff\udcfe:1", "invalid type"),  # non-UTF-8 bytes via surrogateescape
        ("gres:gpü:1", "invalid name"),
        ("foo/gpu:1", "unknown TRES kind"),
        ("gres:-gpu:1", "invalid name"),
        ("gres:gpu:_x:1", "invalid type"),
    ],
)
def test_parse_tres_rejects(text: str, fragment: str) -> None:
    with pytest.raises(TresError, match=fragment):
        parse_tres(text)


def test_error_names_the_bad_item() -> None:
    with pytest.raises(TresError) as info:
        parse_tres("gres:shard:2,gres:gpu:-3,license:x:1")
    assert "gres:gpu:-3" in str(info.value)
    assert "shard" not in str(info.value)


def test_too_long_string_rejected_even_if_well_formed() -> None:
    text = ",".join(["gres:gpu:1"] * (MAX_TRES_CHARS // 10 + 1))
    assert len(text) > MAX_TRES_CHARS
    with pytest.raises(TresError, match="too long"):
        parse_tres(text)
    with pytest.raises(TresError):
        gpu_count(text)


def test_error_message_is_bounded_for_huge_item() -> None:
    with pytest.raises(TresError) as info:
        parse_tres("gres:" + "x" * 3000 + ":a b")
    assert len(str(info.value)) < 200


@pytest.mark.parametrize(
    ("text", "count"),
    [
        (None, 0),
        ("", 0),
        ("gres:gpu:2", 2),
        ("gres:gpu", 1),
        ("gpu:3", 3),
        ("gres:gpu:a100:2,gres:gpu:v100:1", 3),
        ("gres:gpu:1g.10gb:3,gres:gpu:2g.20gb:1", 4),
        ("gres:shard:4,license:foo:1", 0),
        ("gres:gpu:0", 0),
        ("license:gpu:5", 0),  # a license called gpu is not a GPU
        ("bb:gpu:5", 0),
        ("gres:shard:8,gres:gpu:a100:2,license:foo:1", 2),
        ("gres/gpu:a100:4", 4),
        ("gres:gpu:1k", 1024),
    ],
)
def test_gpu_count(text: str | None, count: int) -> None:
    assert gpu_count(text) == count


@pytest.mark.parametrize("text", ["gres:gpu:-1", "gres:gpu:x:y:z", "gres:gpu:\x7f"])
def test_gpu_count_raises_on_malformed(text: str) -> None:
    with pytest.raises(TresError):
        gpu_count(text)


@pytest.mark.parametrize(
    ("text", "types"),
    [
        (None, ()),
        ("gres:gpu:2", ()),
        ("gres:gpu:a100:2", ("a100",)),
        ("gres:gpu:a100:2,gres:gpu:v100:1,gres:gpu:a100:1", ("a100", "v100")),
        ("gres:gpu:1g.10gb:3,gres:shard:2", ("1g.10gb",)),
        ("gres:nic:mlx5:1", ()),
    ],
)
def test_gpu_types(text: str | None, types: tuple[str, ...]) -> None:
    assert gpu_types(text) == types


@pytest.mark.parametrize(
    ("text", "value"),
    [
        (None, None),
        ("", None),
        ("gres:gpu:3", 3),
        ("gres:shard:2", None),
        ("gres:shard:2,gres:gpu:12", 12),
        ("gpu:5", 5),
    ],
)
def test_cpus_per_gpu(text: str | None, value: int | None) -> None:
    assert cpus_per_gpu(text) == value


@pytest.mark.parametrize(
    ("text", "count", "expected"),
    [
        (None, 6, "gres:gpu:6"),
        ("", 6, "gres:gpu:6"),
        ("gres:gpu:3", 6, "gres:gpu:6"),
        ("gpu:3", 6, "gres:gpu:6"),
        ("gres:shard:2", 6, "gres:shard:2,gres:gpu:6"),
        ("gres:shard:2,gres:gpu:3,license:foo:1", 4, "gres:shard:2,gres:gpu:4,license:foo:1"),
        # Typed GPU entries are replaced by the one untyped entry, in place of the first.
        ("gres:gpu:a100:4,gres:shard:1,gres:gpu:2", 8, "gres:gpu:8,gres:shard:1"),
        ("gres:shard:1;gres:gpu:2", 5, "gres:shard:1,gres:gpu:5"),
        ("gres:gpu:3", 1000000, "gres:gpu:1000000"),
    ],
)
def test_set_gpu_count(text: str | None, count: int, expected: str) -> None:
    result = set_gpu_count(text, count)
    assert result == expected
    assert cpus_per_gpu(result) == count
    # The result parses again and keeps every non-GPU entry.
    non_gpu = [i for i in parse_tres(text) if not i.is_gpu]
    assert [i for i in parse_tres(result) if not i.is_gpu] == non_gpu


@pytest.mark.parametrize("count", [0, -1, 1000001])
def test_set_gpu_count_rejects_bad_count(count: int) -> None:
    with pytest.raises(ValueError):
        set_gpu_count("gres:gpu:3", count)


def test_set_gpu_count_rejects_malformed_input() -> None:
    with pytest.raises(TresError):
        set_gpu_count("gres:gpu:3,gres::1", 4)


def test_parse_is_cached_but_returns_equal_values() -> None:
    first = parse_tres("gres:gpu:a100:2")
    second = parse_tres("gres:gpu:a100:2")
    assert first == second
    with pytest.raises(AttributeError):
        first[0].count = 3  # type: ignore[misc]


# ------------------------------------------------- the 23.11+ spelling (24.11, 26.05)

# What sbatch of Slurm 24.11 sends for each form (job_submit/lua probe on a dev cluster).
SLASH_FORMS = [
    ("gres/gpu:2", 2, None),  # --gpus=2, --gpus-per-node=2, --gres=gpu:2
    ("gres/gpu:a100:2", 2, "a100"),  # --gres=gpu:a100:2, --gpus=a100:2
    ("gres/gpu=1", 1, None),  # tres_per_task of --gpus-per-task=1
    ("cpu=9,gres/gpu=1", 1, None),  # tres_per_task of -c 9 --gpus-per-task=1
    ("gres/gpu:a100=2", 2, "a100"),  # tres_per_task of --gpus-per-task=a100:2
]


@pytest.mark.parametrize(("text", "gpus", "gpu_type"), SLASH_FORMS)
def test_slash_spelling_is_read(text: str, gpus: int, gpu_type: str | None) -> None:
    assert gpu_count(text) == gpus
    assert gpu_types(text) == ((gpu_type,) if gpu_type else ())
    assert gres_separator(text) == "/"


def test_the_separator_follows_the_jobs_own_gpu_request() -> None:
    assert gres_separator(None, "gres/gpu:2") == "/"
    assert gres_separator("gres:gpu:2") == ":"
    assert gres_separator("cpu=3", None, "gres:gpu:1") == ":"
    assert gres_separator("gpu:2") == ":"  # no kind named: the 22.05 spelling
    assert gres_separator(None) == ":"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, "gres/gpu:6"),
        ("gres/gpu:3", "gres/gpu:6"),
        ("gres/shard:2,gres/gpu:a100:3", "gres/shard:2,gres/gpu:6"),
    ],
)
def test_set_gpu_count_in_the_slash_spelling(text: str | None, expected: str) -> None:
    assert set_gpu_count(text, 6, "/") == expected
    with pytest.raises(ValueError, match="separator"):
        set_gpu_count(text, 6, "=")


@pytest.mark.parametrize(
    ("text", "cpus", "rewritten"),
    [
        ("cpu=9,gres/gpu=1", 9, "cpu=12,gres/gpu=1"),
        ("cpu=3", 3, "cpu=12"),
        ("gres/gpu=1,cpu=4,license/foo=1", 4, "gres/gpu=1,cpu=12,license/foo=1"),
        ("gres/gpu=1", None, "gres/gpu=1"),
        ("gres:gpu:1", None, "gres:gpu:1"),
        (None, None, None),
    ],
)
def test_task_cpus_are_found_and_rewritten(
    text: str | None, cpus: int | None, rewritten: str | None
) -> None:
    assert task_cpus(text) == cpus
    assert with_task_cpus(text, 12) == rewritten


@pytest.mark.parametrize(
    "text",
    [
        "gpu=",
        "=3",
        "cpu=x",
        "gres/gpu:a:b=1",
        "gres/gpu:1=2",
        "cpu=-1",
        "gres:gpu:=4",
        "gres/gpu:=4",
        "gpu:=2",
    ],
)
def test_bad_counts_after_equals_are_refused(text: str) -> None:
    with pytest.raises(TresError):
        parse_tres(text)
