"""sbatch options -> the job_desc fields sbatch 22.05 sends (as measured on slurmctld)."""

from __future__ import annotations

import pytest

from slurm_plugin.cli.sbatchopts import SbatchOptionError, gres_separator_of, request_from_sbatch

SCRIPT = (
    "#!/bin/sh\n#SBATCH --gpus-per-node=2\n#SBATCH -J from-script\npython x.py\n#SBATCH --gpus=9\n"
)


@pytest.mark.parametrize(
    "argv,field,value",
    [
        (["--gpus=1"], "tres_per_job", "gres:gpu:1"),
        (["-G", "a100:2"], "tres_per_job", "gres:gpu:a100:2"),
        (["--gpus-per-node=4"], "tres_per_node", "gres:gpu:4"),
        (["--gres=gpu:a100:2,shard:1"], "tres_per_node", "gres:gpu:a100:2,gres:shard:1"),
        (["--gpus-per-task", "1"], "tres_per_task", "gres:gpu:1"),
        (["--cpus-per-gpu=3"], "cpus_per_tres", "gres:gpu:3"),
        (["-c", "5"], "cpus_per_task", 5),
        (["-c5"], "cpus_per_task", 5),
        (["-N", "2-4"], "min_nodes", 2),
        (["--ntasks-per-node=8"], "ntasks_per_node", 8),
        (["--comment=coda:workload=x"], "comment", "coda:workload=x"),
        (["--exclusive", "--mem=4G", "-J", "name"], "job_name", "name"),
    ],
)
def test_option_maps_to_field(argv: list[str], field: str, value: object) -> None:
    assert getattr(request_from_sbatch(argv, "#!/bin/sh\ntrue\n", uid=7), field) == value


def test_script_lines_until_first_command_then_command_line_wins() -> None:
    req = request_from_sbatch(["--gpus-per-node=1"], SCRIPT, uid=7)
    assert req.tres_per_node == "gres:gpu:1"  # command line over #SBATCH
    assert req.job_name == "from-script"
    assert req.tres_per_job is None  # #SBATCH after the first command is ignored, as in sbatch


@pytest.mark.parametrize("argv", [["--cpus-per-gpu=x"], ["-c"], ["--nodes=-1"], ["stray"]])
def test_bad_options_say_which(argv: list[str]) -> None:
    with pytest.raises(SbatchOptionError):
        request_from_sbatch(argv, "true\n", uid=7)


@pytest.mark.parametrize("value", ["\u0663", "3_0", "1e3", "0x10", "99999999999999999999"])
def test_a_count_sbatch_refuses_is_refused(value: str) -> None:
    # sbatch reads counts with strtol: ASCII digits only ('\u0663' is an Arabic-Indic 3).
    with pytest.raises(SbatchOptionError, match="cpus-per-gpu"):
        request_from_sbatch([f"--cpus-per-gpu={value}", "--gpus=1"], "true\n", uid=7)


@pytest.mark.parametrize(
    "argv",
    [
        ["-t", "60", "-o", "out.%j", "--gpus-per-node=2"],
        ["--time", "60", "--mem", "4G", "-A", "proj", "--gpus-per-node", "2"],
        ["-vQ", "-H", "--gpus-per-node=2", "--exclusive"],
        ["-vt60", "--gpus-per-node=2"],
        ["-vt", "60", "--gpus-per-node=2", "--export=ALL"],
    ],
)
def test_options_this_tool_ignores_still_take_their_values(argv: list[str]) -> None:
    """``sbatch -t 60 job.sh`` is an everyday command line: the value of an option the
    hook does not read must not be taken for the script or reported as stray."""
    assert request_from_sbatch(argv, "#!/bin/sh\ntrue\n", uid=7).tres_per_node == "gres:gpu:2"


def test_script_lines_with_short_options_that_take_values() -> None:
    script = "#!/bin/sh\n#SBATCH -o log.%j -e err.%j\n#SBATCH -p gpu -t 1:00:00\ntrue\n"
    assert request_from_sbatch([], script, uid=7).partition == "gpu"


def test_prefer_is_read() -> None:
    req = request_from_sbatch(["--prefer", "gpu_a100", "--gpus=1"], "true\n", uid=7)
    assert req.prefer == "gpu_a100"


@pytest.mark.parametrize(
    "argv,said",
    [(["-Z"], "sbatch has no option -Z"), (["-vt"], "-t needs a value"), (["--time"], "needs")],
)
def test_unknown_or_valueless_options_are_named(argv: list[str], said: str) -> None:
    with pytest.raises(SbatchOptionError, match=said):
        request_from_sbatch(argv, "true\n", uid=7)


@pytest.mark.parametrize(
    ("argv", "node", "job", "task", "cpus_per_tres"),
    [
        (["--gpus=2"], None, "gres/gpu:2", None, None),
        (["--gres=gpu:a100:2", "--cpus-per-gpu=3"], "gres/gpu:a100:2", None, None, "gres/gpu:3"),
        (["-n1", "-c", "9", "--gpus-per-task=1"], None, None, "cpu=9,gres/gpu=1", None),
        (["--gpus-per-task=a100:2"], None, None, "gres/gpu:a100=2", None),
    ],
)
def test_the_slash_spelling_mirrors_sbatch_of_24_11(
    argv: list[str], node: str | None, job: str | None, task: str | None, cpus_per_tres: str | None
) -> None:
    req = request_from_sbatch(argv, "#!/bin/sh\n", uid=1000, sep="/")
    assert (req.tres_per_node, req.tres_per_job, req.tres_per_task, req.cpus_per_tres) == (
        node,
        job,
        task,
        cpus_per_tres,
    )


@pytest.mark.parametrize(
    ("text", "sep"),
    [("slurm-wlm 22.05.8", ":"), ("slurm 23.02.7", ":"), ("slurm 24.11.5", "/"), ("?", "/")],
)
def test_the_spelling_follows_the_release(text: str, sep: str) -> None:
    assert gres_separator_of(text) == sep


@pytest.mark.parametrize(
    ("line", "comment"),
    [
        ('#SBATCH --comment="coda:workload=x coda:off"', "coda:workload=x coda:off"),
        ("#SBATCH --comment='a # b' # a comment", "a # b"),
        ("#SBATCH --comment=a\\ b", "a b"),
        ('#SBATCH --comment="say \\"hi\\""', 'say "hi"'),
        ("#SBATCH --comment=x#not-read", "x"),
    ],
)
def test_script_lines_are_split_as_sbatch_splits_them(line: str, comment: str) -> None:
    req = request_from_sbatch([], f"#!/bin/sh\n{line}\n#SBATCH --gpus=1\ntrue\n")
    assert req.comment == comment
    assert req.tres_per_job == "gres:gpu:1"


def test_an_unmatched_quote_in_a_script_line_is_refused_as_sbatch_refuses_it() -> None:
    with pytest.raises(SbatchOptionError, match='unmatched " in #SBATCH line 2'):
        request_from_sbatch([], '#!/bin/sh\n#SBATCH --comment="open\ntrue\n')
