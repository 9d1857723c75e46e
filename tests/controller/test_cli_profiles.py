"""End-to-end tests of ``coda-slurm profiles`` (slurm_plugin.cli.profiles) in tmp dirs."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from click.testing import CliRunner

from coda_common.cli import CliError, run_cli
from coda_common.store.profiles import Profile, ProfileStore, Sample, profile_stem
from slurm_plugin.cli import profiles as cli_profiles
from slurm_plugin.cli.profiles import profiles, read_profile_store_key, resolve_store


class Result(NamedTuple):
    rc: int
    out: str
    err: str


def cli(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
    """Run ``coda-slurm profiles ARGS`` the way the real entry point does (run_cli)."""
    runner = CliRunner()
    with runner.isolation(input=input, env=env) as (out, err, _mixed):
        rc = run_cli(profiles, "coda-slurm profiles", list(args))
        sys.stdout.flush()
        sys.stderr.flush()
        return Result(rc, out.getvalue().decode(), err.getvalue().decode())


def profile(signature: str, cpus: int = 8, **kw: Any) -> Profile:
    fields: dict[str, Any] = {
        "signature": signature,
        "workload": signature.split(":", 2)[2] if signature.startswith("workload:") else "run.sh",
        "cpus_per_gpu": cpus,
        "confidence": 0.85,
        "n_samples": 2,
        "updated_unix_s": time.time() - 3 * 3600,
        "source": "coda-node@gpu01",
        "gpu_model": "H100",
        "samples": (
            Sample(cores=4.0, throughput=90.5, gpus=1, nodes=1, gpu_model="H100", node="gpu01"),
            Sample(cores=8.0, throughput=120.0, gpus=1, nodes=1, gpu_model="H100", node="gpu02"),
        ),
        "fit": {"model": "amdahl", "p": 0.93},
    }
    fields.update(kw)
    return Profile(**fields)


@pytest.fixture
def store(tmp_path: Path) -> ProfileStore:
    st = ProfileStore(tmp_path / "profiles")
    st.ensure_root()
    st.write(profile("workload:1000:train", 8))
    st.write(profile("workload:2000:train", 6, multi_node_cpus_per_gpu=10))
    st.write(profile("workload:*:bert", 12, source="import", gpu_model=None))
    st.write(profile("script:1000:0123456789abcdef", 4))
    return st


def files(root: Path) -> list[str]:
    return sorted(n for n in os.listdir(root) if not n.startswith("."))


# -------------------------------------------------------------------------------- store root


def test_store_option_wins(tmp_path: Path) -> None:
    assert resolve_store(tmp_path / "s", tmp_path / "missing.conf") == tmp_path / "s"


def test_store_from_conf_option_and_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: ProfileStore
) -> None:
    conf = tmp_path / "coda.conf"
    conf.write_text(f"# coda\nProfileStore={store.root}\n")
    assert resolve_store(None, conf) == store.root
    r = cli("--conf", str(conf), "list")
    assert r.rc == 0 and "workload:1000:train" in r.out

    monkeypatch.delenv("CODA_CONF", raising=False)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))  # coda.conf beside it
    assert resolve_store(None, None) == store.root
    other = tmp_path / "other.conf"
    other.write_text("ProfileStore=/elsewhere\n")
    monkeypatch.setenv("CODA_CONF", str(other))
    assert resolve_store(None, None) == Path("/elsewhere")


def test_minimal_conf_reader_when_full_parser_is_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_profiles, "_full_config_loader", lambda: None)
    conf = tmp_path / "coda.conf"
    conf.write_text("Mode=enforce   # comment\n  profilestore=/a/b  MinConfidence=0.8\n# x=1\n")
    assert read_profile_store_key(conf) == "/a/b"
    assert resolve_store(None, conf) == Path("/a/b")
    conf.write_text("Mode=enforce\n# ProfileStore=/commented\n")
    with pytest.raises(CliError, match="no profile store configured"):
        resolve_store(None, conf)


def test_missing_conf_is_a_clear_error(tmp_path: Path) -> None:
    r = cli("--conf", str(tmp_path / "nope.conf"), "list")
    assert r.rc == 1
    assert r.err.startswith("coda-slurm profiles: cannot ")
    assert "nope.conf" in r.err and "--store" in r.err


# -------------------------------------------------------------------------------- list / show


def test_list_table_sorted_by_workload(store: ProfileStore) -> None:
    r = cli("--store", str(store.root), "list")
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].split() == [
        "WORKLOAD", "SIGNATURE", "CORES/GPU", "CONFIDENCE", "SAMPLES", "GPU", "MODEL",
        "UPDATED", "SOURCE",
    ]  # fmt: skip
    workloads = [line.split()[0] for line in lines[1:]]
    assert workloads == ["bert", "run.sh", "train", "train"]
    assert "6 (10 multi-node)" in r.out
    assert "3h ago" in r.out and "0.85" in r.out
    assert r.err == ""


def test_list_json_and_broken_files(store: ProfileStore) -> None:
    broken = store.path_for("workload:1000:broken")
    broken.write_text('{"format": "coda-profile", "format_version": 7}')
    r = cli("--store", str(store.root), "list", "--json")
    assert r.rc == 0
    doc = json.loads(r.out)
    assert [p["signature"] for p in doc["profiles"]] == [
        "workload:*:bert",
        "script:1000:0123456789abcdef",
        "workload:1000:train",
        "workload:2000:train",
    ]
    assert doc["profiles"][0]["path"] == str(store.path_for("workload:*:bert"))
    assert len(doc["errors"]) == 1 and "newer coda" in doc["errors"][0]["problem"]

    r = cli("--store", str(store.root), "list")
    assert r.rc == 0
    assert "warning: skipped" in r.err and str(broken) in r.err


def test_list_empty_and_missing_store(tmp_path: Path) -> None:
    empty = ProfileStore(tmp_path / "empty").ensure_root()
    r = cli("--store", str(empty), "list")
    assert r.rc == 0 and "No profiles in" in r.out
    r = cli("--store", str(tmp_path / "absent"), "list")
    assert r.rc == 1 and "cannot read profile store" in r.err


def test_show_by_signature_and_by_unique_workload(store: ProfileStore) -> None:
    r = cli("--store", str(store.root), "show", "workload:*:bert")
    assert r.rc == 0, r.err
    assert "Signature:" in r.out and "workload:*:bert" in r.out
    assert "Cores per GPU: 12" in r.out
    assert "Samples:       2 merged, 2 kept" in r.out
    assert "THROUGHPUT" in r.out and "gpu02" in r.out
    r2 = cli("--store", str(store.root), "show", "bert")
    assert r2.out == r.out

    r = cli("--store", str(store.root), "show", "workload:1000:train", "--json")
    assert r.rc == 0
    assert Profile.from_json_dict(json.loads(r.out), "out") == store.read("workload:1000:train")


def test_show_ambiguous_workload_lists_signatures(store: ProfileStore) -> None:
    r = cli("--store", str(store.root), "show", "train")
    assert r.rc == 1
    assert "workload:1000:train" in r.err and "workload:2000:train" in r.err
    assert "matches 2 profiles" in r.err and "pass one of the signatures" in r.err
    assert r.out == ""


def test_show_unknown(store: ProfileStore) -> None:
    r = cli("--store", str(store.root), "show", "nosuch")
    assert r.rc == 1 and "no profile for 'nosuch'" in r.err
    r = cli("--store", str(store.root), "show", "workload:1:nosuch")
    assert r.rc == 1 and "no profile with signature" in r.err


# -------------------------------------------------------------------------------- import / export


def test_export_import_round_trip(store: ProfileStore, tmp_path: Path) -> None:
    out = tmp_path / "export.json"
    r = cli("--store", str(store.root), "export", str(out))
    assert r.rc == 0, r.err
    assert "Exported 4 profile(s)" in r.err
    doc = json.loads(out.read_text())
    assert (doc["format"], doc["format_version"]) == ("coda-profiles-export", 1)
    assert len(doc["profiles"]) == 4

    dest = tmp_path / "fresh"  # import creates the store directory
    r = cli("--store", str(dest), "import", str(out))
    assert r.rc == 0, r.err
    assert "Imported 4 profile(s)" in r.out
    assert (dest.stat().st_mode & 0o777) == 0o755
    assert files(dest) == files(store.root)

    r = cli("--store", str(dest), "export")  # stdout
    assert r.rc == 0
    assert json.loads(r.out) == doc
    for name in files(dest):
        assert (dest / name).read_bytes() == (store.root / name).read_bytes()


def test_import_accepts_list_and_single_profile_and_stdin(tmp_path: Path) -> None:
    root = tmp_path / "s"
    entries = [profile("workload:*:a").to_json_dict(), profile("workload:*:b").to_json_dict()]
    src = tmp_path / "list.json"
    src.write_text(json.dumps(entries))
    assert cli("--store", str(root), "import", str(src)).rc == 0
    single = json.dumps(profile("workload:*:c").to_json_dict())
    r = cli("--store", str(root), "import", "-", input=single)
    assert r.rc == 0, r.err
    assert len(files(root)) == 3


def test_import_validates_everything_and_writes_nothing(
    store: ProfileStore, tmp_path: Path
) -> None:
    before = {n: (store.root / n).read_bytes() for n in files(store.root)}
    good = profile("workload:*:new1").to_json_dict()
    bad_cpus = profile("workload:*:new2").to_json_dict() | {"cpus_per_gpu": 0}
    bad_keys = profile("workload:*:new3").to_json_dict()
    del bad_keys["source"]
    src = tmp_path / "bad.json"
    src.write_text(json.dumps({"profiles": [good, bad_cpus, bad_keys, "nope"]}))
    r = cli("--store", str(store.root), "import", str(src))
    assert r.rc == 1
    assert "entry 2 (workload:*:new2): cpus_per_gpu must be an integer >= 1" in r.err
    assert "entry 3 (workload:*:new3): missing key(s) source" in r.err
    assert "entry 4: expected a JSON object" in r.err
    assert "nothing imported from" in r.err and "3 of 4 entries are invalid" in r.err
    assert {n: (store.root / n).read_bytes() for n in files(store.root)} == before


def test_import_duplicate_signatures_in_file(tmp_path: Path) -> None:
    p = profile("workload:*:dup").to_json_dict()
    src = tmp_path / "dup.json"
    src.write_text(json.dumps([p, p]))
    r = cli("--store", str(tmp_path / "s"), "import", str(src))
    assert r.rc == 1 and "entry 2 (workload:*:dup): repeats the signature of entry 1" in r.err
    assert not (tmp_path / "s").exists()


def test_import_refuses_existing_unless_replace(store: ProfileStore, tmp_path: Path) -> None:
    changed = profile("workload:1000:train", cpus=32).to_json_dict()
    fresh = profile("workload:*:fresh").to_json_dict()
    src = tmp_path / "imp.json"
    src.write_text(json.dumps([fresh, changed]))
    r = cli("--store", str(store.root), "import", str(src))
    assert r.rc == 1
    assert "exists: workload:1000:train" in r.err and "--replace" in r.err
    assert store.read("workload:*:fresh") is None  # nothing written, not even the new one
    assert store.read("workload:1000:train").cpus_per_gpu == 8  # type: ignore[union-attr]

    r = cli("--store", str(store.root), "import", "--replace", str(src))
    assert r.rc == 0 and "(1 replaced)" in r.out
    assert store.read("workload:1000:train").cpus_per_gpu == 32  # type: ignore[union-attr]
    assert store.read("workload:*:fresh") is not None


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json", "not valid JSON"),
        ("[" * 100_000, "not valid JSON (nested too deeply)"),
        ('{"format": "coda-profiles-export", "format_version": 2, "profiles": []}', "newer coda"),
        ('{"format": "other", "profiles": []}', 'not "coda-profiles-export"'),
        ('{"hello": 1}', 'expected a list of profiles or an object with a "profiles" list'),
        ('{"profiles": [], "extra": 1}', "unknown key(s) extra"),
    ],
)
def test_import_rejects_bad_documents(tmp_path: Path, content: str, needle: str) -> None:
    src = tmp_path / "x.json"
    src.write_text(content)
    r = cli("--store", str(tmp_path / "s"), "import", str(src))
    assert r.rc == 1 and needle in r.err
    assert not (tmp_path / "s").exists()


def test_import_refuses_a_file_that_never_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/dev/zero, a FIFO left open or a runaway export: read up to the cap, then refused
    with the way out, and nothing written."""
    monkeypatch.setattr(cli_profiles, "MAX_IMPORT_BYTES", 1 << 20)
    r = cli("--store", str(tmp_path / "s"), "import", "/dev/zero")
    assert r.rc == 1 and "larger than 1 MiB; import it in parts" in r.err
    r = cli("--store", str(tmp_path / "s"), "import", "-", input="[" + " " * (1 << 20) + "]")
    assert r.rc == 1 and "larger than 1 MiB" in r.err
    assert not (tmp_path / "s").exists()


def test_export_skips_broken_files_with_warning(store: ProfileStore, tmp_path: Path) -> None:
    (store.root / f"{profile_stem('workload:1:x')}.json").write_text("garbage")
    r = cli("--store", str(store.root), "export")
    assert r.rc == 0
    assert len(json.loads(r.out)["profiles"]) == 4
    assert "warning: skipped" in r.err


# -------------------------------------------------------------------------------- delete


def test_delete_asks_and_respects_no(store: ProfileStore) -> None:
    sig = "workload:2000:train"
    r = cli("--store", str(store.root), "delete", sig, input="n\n")
    assert r.rc == 130 and "aborted" in r.err
    assert "Delete profile workload:2000:train (train, 6 cores/GPU, 2 samples)?" in r.out
    assert store.read(sig) is not None

    r = cli("--store", str(store.root), "delete", sig, input="y\n")
    assert r.rc == 0 and "Deleted profile" in r.out
    assert store.read(sig) is None


def test_delete_yes_unknown_and_broken(store: ProfileStore) -> None:
    r = cli("--store", str(store.root), "delete", "--yes", "workload:*:bert")
    assert r.rc == 0 and store.read("workload:*:bert") is None
    r = cli("--store", str(store.root), "delete", "--yes", "workload:*:bert")
    assert r.rc == 1 and "no profile with signature" in r.err
    r = cli("--store", str(store.root), "delete", "--yes", "bert")
    assert r.rc == 1 and "is not workload:<uid>:<NAME>" in r.err

    broken = store.path_for("workload:1:broken")
    broken.write_text("{")
    r = cli("--store", str(store.root), "delete", "workload:1:broken", input="y\n")
    assert r.rc == 0 and "unusable: not valid JSON" in r.out
    assert not broken.exists()


# -------------------------------------------------------------------------------- usage records


def test_show_and_import_usage_records(tmp_path: Path) -> None:
    root = tmp_path / "s"
    usage = [
        {
            "gpu_model": "A100",
            "gpu_util": 0.82,
            "gpu_mem_bw_util": 0.41,
            "pcie_bytes_per_s_per_gpu": 9.5e9,
            "iter_per_s_per_gpu": 12.5,
            "ticks": 40,
            "updated_unix_s": time.time() - 120,
        },
        {
            "gpu_model": "V100",
            "gpu_util": 0.9,
            "gpu_mem_bw_util": 0.5,
            "pcie_bytes_per_s_per_gpu": None,
            "iter_per_s_per_gpu": None,
            "ticks": 3,
            "updated_unix_s": time.time() - 7200,
        },
    ]
    entry = profile("workload:*:resnet50").to_json_dict() | {"usage": usage}
    r = cli("--store", str(root), "import", "-", input=json.dumps(entry))
    assert r.rc == 0, r.err
    r = cli("--store", str(root), "show", "resnet50")
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert "PCIE/GPU" in r.out and "ITER/S/GPU" in r.out
    a100 = next(line for line in lines if line.startswith("A100"))
    assert a100.split() == ["A100", "82%", "41%", "9.50", "GB/s", "12.5", "40", "2m", "ago"]
    v100 = next(line for line in lines if line.startswith("V100"))
    assert v100.split() == ["V100", "90%", "50%", "-", "-", "3", "2h", "ago"]

    # A measurement out of range is refused with the entry and field named.
    usage[0]["gpu_util"] = 82
    bad = profile("workload:*:alexnet").to_json_dict() | {"usage": usage}
    r = cli("--store", str(root), "import", "-", input=json.dumps(bad))
    assert r.rc == 1
    assert "usage[0].gpu_util must be a number within 0..1" in r.err
    assert files(root) == [f"{profile_stem('workload:*:resnet50')}.json"]


def test_show_and_import_a_cpu_workloads_bandwidth(tmp_path: Path) -> None:
    root = tmp_path / "s"
    cpu_usage = {
        "mem_bw_bytes_per_s_per_cpu": 4.5e9,
        "ticks": 90,
        "updated_unix_s": time.time() - 300,
    }
    entry = profile("workload:*:stream").to_json_dict() | {"cpu_usage": cpu_usage}
    r = cli("--store", str(root), "import", "-", input=json.dumps(entry))
    assert r.rc == 0, r.err
    r = cli("--store", str(root), "show", "stream")
    assert r.rc == 0, r.err
    said = "As a CPU job: memory bandwidth 4.50 GB/s per CPU over 90 ticks (updated 5m ago)"
    assert said in r.out
    cpu_usage["ticks"] = 0
    bad = profile("workload:*:etl").to_json_dict() | {"cpu_usage": cpu_usage}
    r = cli("--store", str(root), "import", "-", input=json.dumps(bad))
    assert r.rc == 1 and "cpu_usage.ticks" in r.err


@pytest.mark.parametrize("seconds", ["nan", "inf", "1e99"])
def test_collect_watch_an_interval_no_timer_holds_is_a_usage_error(seconds: str) -> None:
    from slurm_plugin.cli.main import cli as coda_slurm

    runner = CliRunner()
    with runner.isolation() as (_out, err, _mixed):
        rc = run_cli(coda_slurm, "coda-slurm", ["profiles", "collect", "--watch", seconds])
        sys.stderr.flush()
        said = err.getvalue().decode()
    assert rc == 2, said
    assert "Invalid value for '--watch'" in said


# -------------------------------------------------------------------------------- starter


def test_starter_imports_the_table_as_low_confidence_global_profiles(
    store: ProfileStore,
) -> None:
    r = cli("--store", str(store.root), "starter")
    assert r.rc == 0, r.err
    alexnet = store.read("workload:*:alexnet")
    assert alexnet is not None and (alexnet.cpus_per_gpu, alexnet.source) == (19, "starter")
    assert alexnet.confidence < 0.8 and alexnet.n_samples == 0
    assert alexnet.fit is not None and alexnet.fit["gpu"] == "P100"
    assert "SoCC'18" in alexnet.fit["source"]
    # Every spelling is its own global profile with the same figure.
    bidaf = store.read("workload:*:bidaf")
    assert bidaf is not None and bidaf.cpus_per_gpu == 8
    # The site's own bert profile (not in the table) is untouched.
    bert = store.read("workload:*:bert")
    assert bert is not None and bert.cpus_per_gpu == 12


def test_starter_keeps_a_sites_own_profile_unless_replace(store: ProfileStore) -> None:
    store.write(profile("workload:*:alexnet", 6, source="import"))
    r = cli("--store", str(store.root), "starter")
    assert r.rc == 0 and "kept: workload:*:alexnet (import, 6 per GPU)" in r.err
    assert "1 kept as they were" in r.out
    kept = store.read("workload:*:alexnet")
    assert kept is not None and kept.cpus_per_gpu == 6
    r = cli("--store", str(store.root), "starter", "--replace")
    replaced = store.read("workload:*:alexnet")
    assert r.rc == 0 and replaced is not None and replaced.cpus_per_gpu == 19


def test_starter_scale_rewrites_starter_profiles_rounding_up(store: ProfileStore) -> None:
    assert cli("--store", str(store.root), "starter").rc == 0
    r = cli("--store", str(store.root), "starter", "--scale", "1.5")
    assert r.rc == 0, r.err
    alexnet = store.read("workload:*:alexnet")
    lm = store.read("workload:*:languagemodel")
    assert alexnet is not None and alexnet.cpus_per_gpu == 29  # ceil(19 x 1.5)
    assert lm is not None and lm.cpus_per_gpu == 2
    assert alexnet.fit is not None and alexnet.fit["measured_cores_per_gpu"] == 19


@pytest.mark.parametrize("scale", ["nan", "0", "-1", "11", "inf"])
def test_starter_refuses_a_bad_scale(store: ProfileStore, scale: str) -> None:
    r = cli("--store", str(store.root), "starter", "--scale", scale)
    assert r.rc == 2 and "--scale" in r.err
    assert store.read("workload:*:alexnet") is None


def test_starter_list_writes_nothing_and_names_sources(store: ProfileStore) -> None:
    r = cli("--store", str(store.root), "starter", "--list", "--json")
    doc = json.loads(r.out)
    rows = {p["signature"]: p for p in doc["profiles"]}
    assert rows["workload:*:alexnet"]["cpus_per_gpu"] == 19
    assert rows["workload:*:resnet50"]["gpu"] == "H200" and rows["workload:*:resnet50"]["note"]
    assert store.read("workload:*:alexnet") is None
    text = cli("--store", str(store.root), "starter", "--list").out
    assert "alexnet" in text and "P100" in text and "resnet50: JPEG" in text


def test_share_copies_a_measured_profile_to_the_shared_key(store: ProfileStore) -> None:
    assert cli("--store", str(store.root), "starter").rc == 0
    store.write(profile("workload:1000:alexnet", 9))
    r = cli("--store", str(store.root), "share", "workload:1000:alexnet")
    assert r.rc == 0, r.err
    shared = store.read("workload:*:alexnet")
    # The site's own measurement replaces the starter figure.
    assert shared is not None and (shared.cpus_per_gpu, shared.confidence) == (9, 0.85)
    assert shared.source == "shared:workload:1000:alexnet" and len(shared.samples) == 2
    # A second share would overwrite a measured shared profile: only with --replace.
    r = cli("--store", str(store.root), "share", "workload:1000:alexnet")
    assert r.rc == 1 and "pass --replace" in r.err


def test_share_of_a_script_profile_needs_the_models_name(store: ProfileStore) -> None:
    r = cli("--store", str(store.root), "share", "script:1000:0123456789abcdef")
    assert r.rc == 1 and "pass --as NAME" in r.err
    assert store.read("workload:*:run.sh") is None
    r = cli("--store", str(store.root), "share", "script:1000:0123456789abcdef", "--as", "vit_b_16")
    shared = store.read("workload:*:vit_b_16")
    assert r.rc == 0 and shared is not None and shared.cpus_per_gpu == 4


@pytest.mark.parametrize("name", ["x", "c++", "7", "bert--base", "a" * 65])
def test_share_refuses_a_name_no_script_can_name(store: ProfileStore, name: str) -> None:
    before = files(store.root)
    r = cli("--store", str(store.root), "share", "workload:1000:train", "--as", name)
    assert r.rc == 1 and "NAME" in r.err
    assert files(store.root) == before


def test_show_a_measured_multi_node_figure(store: ProfileStore) -> None:
    store.merge_multi_node("workload:1000:train", 3.0, 1_700_000_000.0)
    store.merge_multi_node("workload:1000:train", 5.25, 1_700_000_100.0)
    r = cli("--store", str(store.root), "show", "workload:1000:train")
    assert r.rc == 0, r.err
    assert "measured 5.25 per GPU (p90 of 2 per-node figures kept, 2 merged)" in r.out
    # A job that used all the cores it had on a node shows only a floor of its demand.
    store.merge_multi_node("workload:1000:train", 5.25, 1_700_000_200.0, starved=True)
    r = cli("--store", str(store.root), "show", "workload:1000:train")
    assert "measured 5.25 per GPU (p90 of 3 per-node figures kept, 3 merged)" in r.out
    store.merge_multi_node("workload:1000:train", 6.0, 1_700_000_300.0, starved=True)
    r = cli("--store", str(store.root), "show", "workload:1000:train")
    # Starved at the top: twice it, at most the profile's single-node 8.
    assert (
        "measured 6.00 per GPU (p90 of 4 per-node figures kept, 4 merged; "
        "starved, a floor: the hook looks at 8.00)"
    ) in r.out
