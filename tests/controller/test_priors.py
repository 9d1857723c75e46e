"""Priors from names: which global profile a job's text names, and what the decision makes
of it (a floor, never a cut; the user-value rules and the caps still apply)."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest

from coda_common.config.codaconf import CodaConfig, parse_config
from coda_common.signature import name_problem
from coda_common.slurm.adminrecord import parse_admin_record
from slurm_plugin.decision import priors
from slurm_plugin.decision.decide import JobRequest, ProfileView, decide

UID = 1000


def view(name: str, cpg: int, conf: float = 0.2, mn: int | None = None) -> ProfileView:
    return ProfileView(f"workload:*:{name}", name, cpg, conf, 0, mn)


GLOBAL = {
    v.signature: v
    for v in (
        view("alexnet", 16),
        view("lm", 1),
        view("resnet50", 6),
        view("bert-base-uncased", 3),
        view("bert", 2),
        view("vit_b_16", 9),
        view("gpt2", 4),
        view("Overfeat", 22),
    )
}


def match(text: str, aliases: tuple[tuple[str, str], ...] = ()) -> tuple[str, ...]:
    index = priors.index_for(GLOBAL, aliases)
    return index.match(priors.scan_text(None, text, None))


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("srun python train.py --arch alexnet --lr 0.1 /data/imagenet", ("alexnet",)),
        ("python main.py --arch=AlexNet", ("alexnet",)),
        ("m = torchvision.models.resnet50(weights=None)", ("resnet50",)),
        ("--model=bert-base-uncased", ("bert", "bert-base-uncased")),
        ("--model BERT_base.Uncased", ("bert", "bert-base-uncased")),
        ("model_name: vit_b_16", ("vit_b_16",)),
        ("model_name: vit-b.16", ("vit_b_16",)),
        ('tok = AutoModel.from_pretrained("gpt2")', ("gpt2",)),
        ("gpt2-xl", ("gpt2",)),
        ("overfeat", ("Overfeat",)),
        ("#SBATCH -J alexnet\nsleep 1", ("alexnet",)),
        # Whole words only: a name inside a longer word is not named.
        ("resnet50x4 roberta-base myalexnet alexnet2 gpt", ()),
        ("resnet-50", ()),  # a different spelling: PriorAliases covers it
        ("vit b 16", ()),  # words in a row must be joined by - _ .
        ("bert base uncased", ("bert",)),
        ("", ()),
        ("sleep 300", ()),
    ],
)
def test_a_name_is_matched_as_whole_words(text: str, names: tuple[str, ...]) -> None:
    assert match(text) == names


def test_aliases_name_a_profile_and_an_alias_of_no_profile_names_nothing() -> None:
    aliases = (("resnet-50", "resnet50"), ("rn50", "resnet50"), ("caffenet", "nosuch"))
    assert match("--arch ResNet_50", aliases) == ("resnet50",)
    assert match("--arch rn50", aliases) == ("resnet50",)
    assert match("--arch caffenet", aliases) == ()


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("a", "shorter than 2 characters"),
        ("50", "has no letter"),
        ("c++", "holds a character other than letters, digits, - _ ."),
        ("résnet", "holds a character other than letters, digits, - _ ."),
        ("bert--base", "has an empty word"),
        ("bert-", "has an empty word"),
        ("lm", None),
        ("Vit_B_16", None),
    ],
)
def test_names_that_can_never_match(name: str, problem: str | None) -> None:
    got = name_problem(name)
    assert got == problem if problem is None else (got or "").startswith(problem)


def test_a_profile_name_that_cannot_match_is_left_out_not_an_error() -> None:
    odd = {
        "workload:*:c++": view("c++", 30),
        "workload:*:7": view("7", 30),
        "workload:*:x": view("x", 30),
    }
    index = priors.index_for(odd)
    assert index.match(priors.scan_text("c++ 7 x", "c++ 7 x", None)) == ()


def test_a_several_word_name_does_not_match_across_runs_or_double_joiners() -> None:
    assert match("vit_b 16 vit b_16 vit--b-16") == ()
    assert match("x-vit_b_16-y") == ("vit_b_16",)


def test_the_scan_reads_a_bounded_head_and_tail_of_a_huge_script() -> None:
    body = "x " * (50 << 20)  # 100 MiB of words
    script = "--arch alexnet\n" + body + "\n--model gpt2"
    text = priors.scan_text("job", script, None)
    assert len(text) <= priors.SCAN_HEAD_CHARS + priors.SCAN_TAIL_CHARS + 8
    index = priors.index_for(GLOBAL)
    assert index.match(text) == ("alexnet", "gpt2")
    # A name in the middle of a huge script is never read.
    middle = body[: 25 << 20] + " overfeat " + body[: 25 << 20]
    assert index.match(priors.scan_text("job", middle, None)) == ()


def test_several_word_names_checked_per_job_are_bounded() -> None:
    n = priors.MAX_PHRASE_CHECKS + 20
    many = {f"workload:*:w{i}-tail": view(f"w{i}-tail", 8) for i in range(n)}
    index = priors.index_for(many)
    # Every first word is in the text, and every one of the names is named: only
    # MAX_PHRASE_CHECKS of them are checked.
    text = " ".join(f"w{i}-tail" for i in range(n))
    assert len(index.match(priors.scan_text(None, text, None))) == priors.MAX_PHRASE_CHECKS


def test_the_index_is_built_once_per_snapshot_and_aliases() -> None:
    a = priors.index_for(GLOBAL)
    assert priors.index_for(GLOBAL) is a
    assert priors.index_for(GLOBAL, (("rn50", "resnet50"),)) is not a
    assert priors.index_for(dict(GLOBAL)) is not a


# -- the decision ------------------------------------------------------------------------------

SCRIPT = "#!/bin/bash\nsrun python train.py --arch alexnet --lr 0.1 /data/imagenet\n"


def job(**fields: Any) -> JobRequest:
    base: dict[str, Any] = {
        "uid": UID,
        "job_name": "train.sh",
        "tres_per_node": "gres:gpu:1",
        "script": SCRIPT,
    }
    base.update(fields)
    return JobRequest(**base)


def cfg(**fields: Any) -> CodaConfig:
    return replace(CodaConfig(), **fields)


def share8(gpn: int) -> int | None:
    return 8


def cap32(gpn: int) -> int | None:
    return 32


def run(req: JobRequest, config: CodaConfig, profiles: Any = None, cap: Any = cap32) -> Any:
    d = decide(req, config, GLOBAL if profiles is None else profiles, cap, node_share=share8)
    record = parse_admin_record(d.admin_comment) if d.admin_comment else {}
    return d, record


def test_a_never_seen_script_that_names_a_model_gets_the_models_cores() -> None:
    d, record = run(job(), cfg(default_cpus_per_gpu="share"))
    assert (d.action, d.cpus_per_tres) == ("default", "gres:gpu:16")
    assert record["src"] == "prior:alexnet" and record["cpg"] == "16"
    assert 'the job names "alexnet"' in (d.user_msg or "")
    assert "src=prior:alexnet" in d.log_msg


def test_without_a_default_the_prior_still_sizes_the_first_run() -> None:
    d, record = run(job(), cfg())
    assert (d.action, d.cpus_per_tres, record["src"]) == ("default", "gres:gpu:16", "prior:alexnet")


def test_a_prior_never_lowers_what_the_job_would_get_without_it() -> None:
    d, record = run(job(script="python train.py --model gpt2"), cfg(default_cpus_per_gpu="share"))
    # gpt2's 4 is below the node's share of 8: the share decides.
    assert (d.cpus_per_tres, record["src"]) == ("gres:gpu:8", "default")


def test_of_several_names_the_one_giving_most_wins() -> None:
    d, record = run(job(script="--teacher overfeat --student alexnet"), cfg())
    assert (d.cpus_per_tres, record["src"]) == ("gres:gpu:22", "prior:Overfeat")


def test_the_caps_bound_a_prior() -> None:
    d, record = run(job(), cfg(max_cpus_per_gpu=12))
    assert (d.cpus_per_tres, record["src"]) == ("gres:gpu:12", "prior:alexnet")

    def cap10(gpn: int) -> int | None:
        return 10

    d, record = run(job(), cfg(), cap=cap10)
    assert (d.cpus_per_tres, record["src"]) == ("gres:gpu:10", "prior:alexnet")
    # Capped at the share itself, the prior gives nothing the share does not.
    d, record = run(job(), cfg(default_cpus_per_gpu="share"), cap=lambda g: 8)
    assert (d.cpus_per_tres, record["src"]) == ("gres:gpu:8", "default")


def test_a_users_own_value_is_kept_unless_unprofiled_values_are_raised() -> None:
    req = job(cpus_per_tres="gres:gpu:2")
    d, record = run(req, cfg(default_cpus_per_gpu="share"))
    assert (d.action, d.cpus_per_tres, record["src"]) == ("keep", None, "prior:alexnet")
    assert "kept your --cpus-per-gpu=2" in (d.user_msg or "")
    d, record = run(req, cfg(default_cpus_per_gpu="share", unprofiled_user_value="raise"))
    assert (d.action, d.cpus_per_tres, record["src"]) == ("raise", "gres:gpu:16", "prior:alexnet")
    # A user who asked for more keeps it: a prior only raises.
    d, _ = run(job(cpus_per_tres="gres:gpu:20"), cfg(unprofiled_user_value="raise"))
    assert (d.action, d.cpus_per_tres) == ("keep", None)


def test_a_per_task_request_is_raised_per_task() -> None:
    req = job(cpus_per_task=2, ntasks_per_node=2, tres_per_node="gres:gpu:2")
    d, record = run(req, cfg(default_cpus_per_gpu=4, unprofiled_user_value="raise"))
    # 16 per GPU x 2 GPUs over 2 tasks.
    assert (d.action, d.cpus_per_task, record["src"]) == ("raise", 16, "prior:alexnet")


def test_the_jobs_own_confident_profile_wins_over_any_prior() -> None:
    d0, rec0 = run(job(), cfg())
    workload_key = rec0["sig"]
    own = {**GLOBAL, workload_key: ProfileView(workload_key, "train.sh", 5, 0.95, 12, None)}
    d, record = run(job(), cfg(), own)
    assert (d.action, d.cpus_per_tres, record["src"]) == ("set", "gres:gpu:5", "profile")
    # A weak profile of its own does not hide the prior.
    weak = {**GLOBAL, workload_key: ProfileView(workload_key, "train.sh", 5, 0.3, 1, None)}
    d, record = run(job(), cfg(), weak)
    assert (d.cpus_per_tres, record["src"]) == ("gres:gpu:16", "prior:alexnet")
    assert d0.cpus_per_tres == "gres:gpu:16"


def test_priors_can_be_turned_off_and_aliased_in_coda_conf() -> None:
    off, _ = parse_config("PriorsFromNames=no\n", "coda.conf")
    d, record = run(job(), off)
    assert (d.action, d.cpus_per_tres) == ("skip", None)
    aliased, _ = parse_config("PriorAliases=alexnet:caffenet\n", "coda.conf")
    d, record = run(job(script="--arch CaffeNet"), aliased)
    assert (d.cpus_per_tres, record["src"]) == ("gres:gpu:16", "prior:alexnet")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("alexnet", "expected NAME:ALIAS"),
        ("alexnet:", "expected NAME:ALIAS"),
        ("alexnet:c++", "ALIAS 'c++'"),
        ("7:seven", "NAME '7'"),
        ("alexnet:a", "ALIAS 'a'"),
    ],
)
def test_a_bad_alias_is_an_error_naming_it(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_config(f"PriorAliases={value}\n", "coda.conf")


def test_the_directive_name_names_a_prior_and_a_weak_shared_profile_is_one() -> None:
    d, record = run(job(script="sleep 1", comment="coda:workload=alexnet"), cfg())
    assert (d.cpus_per_tres, record["src"]) == ("gres:gpu:16", "prior:alexnet")
    strong = {**GLOBAL, "workload:*:alexnet": view("alexnet", 16, conf=0.95)}
    d, record = run(job(script="sleep 1", comment="coda:workload=alexnet"), cfg(), strong)
    assert (d.action, record["src"]) == ("set", "global")


def test_advise_mode_records_the_prior_and_writes_nothing() -> None:
    d, record = run(job(), cfg(mode="advise"))
    assert (d.action, d.cpus_per_tres) == ("advise", None)
    assert (record["would"], record["src"]) == ("default", "prior:alexnet")


def test_a_multi_node_job_takes_the_multi_node_rule_of_its_prior() -> None:
    req = job(tres_per_node="gres:gpu:8", min_nodes=2)
    d, record = run(req, cfg(multi_node_gpu_cap=2))
    # ceil(16 x min(8, 2) / 8) = 4 per GPU.
    assert (d.cpus_per_tres, record["src"]) == ("gres:gpu:4", "prior:alexnet")


def test_hostile_text_in_a_script_is_only_read() -> None:
    hostile = "\x00\udcff" * 1000 + " alexnet;cpg=64;src=profile " + "é" * 1000
    d, record = run(job(script=hostile, job_name="a\nb;c=d"), cfg())
    assert (d.cpus_per_tres, record["src"], record["cpg"]) == ("gres:gpu:16", "prior:alexnet", "16")
