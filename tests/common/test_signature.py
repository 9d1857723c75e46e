"""Workload signatures and --comment directives (coda_common.signature)."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable

import pytest

from coda_common.signature import (
    DEFAULT_IGNORE,
    DEFAULT_SPEC,
    NO_IGNORE,
    UNNAMED,
    DirectiveError,
    Directives,
    ScriptIgnore,
    Signature,
    SignatureIgnoreError,
    SignatureIgnoreTimeout,
    global_key,
    parse_coda_directives,
    parse_script_ignore,
    quote_label,
    strip_sbatch_lines,
    workload_signature,
)

SCRIPT = "#!/bin/bash\n#SBATCH --gpus-per-node=2\n#SBATCH --cpus-per-gpu=4\npython train.py\n"


@pytest.mark.parametrize(
    ("comment", "expected"),
    [
        (None, Directives()),
        ("", Directives()),
        ("just a note", Directives()),
        ("coda:workload=resnet50", Directives(workload="resnet50")),
        ("coda:off", Directives(off=True)),
        ("CODA:OFF", Directives(off=True)),
        ("Coda:Workload=BERT-large", Directives(workload="BERT-large")),
        ("run 7, coda:workload=resnet50; lr=0.1", Directives(workload="resnet50")),
        ("coda:workload=resnet50\tcoda:off", Directives(workload="resnet50", off=True)),
        ("a;coda:off,b", Directives(off=True)),
        ("coda:workload=llama3.1-8b_ft+lora", Directives(workload="llama3.1-8b_ft+lora")),
        ('coda:workload="resnet50"', Directives(workload="resnet50")),
        ("coda:workload=x coda:workload=x", Directives(workload="x")),
        ("coda:workload=" + "a" * 64, Directives(workload="a" * 64)),
        # "coda:" inside another token is not a directive.
        ("see http://wiki/coda:bogus and xcoda:off", Directives()),
        ("nocoda:workload=", Directives()),
        # Non-coda text may hold anything, including surrogate-escaped bytes.
        ("caf\udce9 \x00 coda:workload=ok", Directives(workload="ok")),
    ],
)
def test_parse_coda_directives(comment: str | None, expected: Directives) -> None:
    assert parse_coda_directives(comment) == expected


@pytest.mark.parametrize(
    ("comment", "fragment"),
    [
        ("coda:workload=", "missing workload name"),
        ("coda:workload", "missing workload name"),
        ('coda:workload="a b"', 'invalid workload name "a b"'),
        ("coda:workload=-lead", "invalid workload name"),
        ("coda:workload=a/b", "invalid workload name"),
        ("coda:workload=" + "a" * 65, "invalid workload name"),
        ("coda:workload=caf\udce9", r'invalid workload name "caf\\udce9"'),
        ("coda:workload=x\x00y", r"invalid workload name"),
        ("coda:xyz", 'unknown directive "coda:xyz"'),
        ("coda:off=1", "unknown directive"),
        ("coda:", "empty directive"),
        ("coda:workload=a coda:workload=b", "two workload names"),
    ],
)
def test_parse_coda_directives_errors(comment: str, fragment: str) -> None:
    with pytest.raises(DirectiveError, match=fragment) as info:
        parse_coda_directives(comment)
    message = str(info.value)
    assert message.startswith("coda: ")
    assert "--comment" in message
    assert message.isprintable()  # one clean line for sbatch's output


@pytest.mark.parametrize("pad", [0, 300])  # a short comment is kept parsed, a long one not
def test_a_comment_parses_alike_every_time(pad: int) -> None:
    """The same comment, job after job: the same directives; a bad one refused each time."""
    good = "x" * pad + " coda:workload=resnet50"
    assert [parse_coda_directives(good) for _ in range(3)] == [Directives("resnet50")] * 3
    bad = "x" * pad + " coda:workload=a/b"
    for _ in range(3):
        with pytest.raises(DirectiveError, match="invalid workload name"):
            parse_coda_directives(bad)
    assert parse_coda_directives(good.upper().replace("RESNET50", "r")) == Directives("r")


def test_invalid_name_message_matches_documented_wording() -> None:
    with pytest.raises(DirectiveError) as info:
        parse_coda_directives('coda:workload="a b"')
    assert str(info.value).startswith(
        'coda: invalid workload name "a b" in --comment (use letters, digits, . _ + -, at most 64'
    )


def test_huge_invalid_name_is_shortened_in_message() -> None:
    with pytest.raises(DirectiveError) as info:
        parse_coda_directives("coda:workload=" + "x" * 5000 + "!")
    assert len(str(info.value)) < 250


def test_10kb_comment_is_parsed_correctly() -> None:
    # Speed is measured in bench/, not asserted here (shared, noisy machines).
    noise = ("lorem ipsum, dolor; sit amet " * 400)[:10_000]
    comment = noise + " coda:workload=big-model " + noise
    assert parse_coda_directives(comment) == Directives(workload="big-model")
    assert parse_coda_directives(noise) == Directives()


def test_pathological_quotes_do_not_blow_up() -> None:
    # A quadratic parser would hang here for minutes; a linear one returns at once.
    comment = "coda:workload=" + '"' * 20_000
    with pytest.raises(DirectiveError):
        parse_coda_directives(comment)


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("", ""),
        (SCRIPT, "#!/bin/bash\npython train.py"),
        ("#!/bin/sh\r\n#SBATCH -N 1\r\necho hi  \r\n\r\n", "#!/bin/sh\necho hi"),
        ("  \t#SBATCH --gpus=1\nrun\n", "run"),
        ("#SBATCH --x\n#SBATCH --y", ""),
        ("echo a   \n\n\necho b\t\n\n   \n", "echo a\n\n\necho b"),
        ("# SBATCH is a comment, not a directive\n", "# SBATCH is a comment, not a directive"),
        ("echo '#SBATCH inside a command'\n", "echo '#SBATCH inside a command'"),
        ("#!/bin/bash\n#SBATCH --gres=gpu:2\n\n#SBATCH -t 1:00\n", "#!/bin/bash"),
    ],
)
def test_strip_sbatch_lines(script: str, expected: str) -> None:
    assert strip_sbatch_lines(script) == expected


def test_strip_is_linear_on_long_blank_runs() -> None:
    # A quadratic strip would hang here for minutes; a linear one returns at once.
    script = "a" + " " * 200_000 + "b\n" + "\t" * 200_000 + "x"
    assert strip_sbatch_lines(script) == script


def _hex16(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def test_signature_from_workload_directive() -> None:
    sig = workload_signature(1000, "train", SCRIPT, Directives(workload="resnet50"))
    assert sig == Signature("workload:1000:resnet50", "resnet50", "comment")
    assert global_key(sig) == "workload:*:resnet50"


def test_signature_from_script() -> None:
    sig = workload_signature(1000, "train", SCRIPT, Directives())
    assert sig == Signature(
        f"script:1000:{_hex16('train' + chr(0) + '#!/bin/bash' + chr(10) + 'python train.py')}",
        "train",
        "script",
    )
    assert global_key(sig) is None


def test_script_signature_ignores_sbatch_options_and_line_endings() -> None:
    other = SCRIPT.replace("--cpus-per-gpu=4", "--cpus-per-gpu=16").replace("\n", "\r\n")
    a = workload_signature(1000, "train", SCRIPT, Directives())
    b = workload_signature(1000, "train", other + "\n\n", Directives())
    assert a.key == b.key


@pytest.mark.parametrize(
    ("uid", "name", "script"),
    [
        (1001, "train", SCRIPT),  # other user
        (1000, "train2", SCRIPT),  # other job name
        (1000, "train", SCRIPT.replace("train.py", "eval.py")),  # other program
    ],
)
def test_script_signature_distinguishes_workloads(uid: int, name: str, script: str) -> None:
    base = workload_signature(1000, "train", SCRIPT, Directives())
    assert workload_signature(uid, name, script, Directives()).key != base.key


def test_signature_without_script_uses_name() -> None:
    sig = workload_signature(1000, "python", None, Directives())
    assert sig == Signature(f"name:1000:{_hex16('python')}", "python", "name")
    assert workload_signature(1000, "python", "", Directives()).key == sig.key
    assert global_key(sig) is None


def test_unnamed_jobs() -> None:
    sig = workload_signature(7, None, "echo\n", Directives())
    assert sig.workload == UNNAMED
    assert sig.key == f"script:7:{_hex16(chr(0) + 'echo')}"
    assert workload_signature(7, None, None, Directives()).workload == UNNAMED


def test_non_utf8_script_hashes_its_original_bytes() -> None:
    raw = b"#!/bin/sh\necho caf\xe9\n"
    script = raw.decode("utf-8", "surrogateescape")
    sig = workload_signature(1, "j", script, Directives())
    expected = hashlib.sha256(b"j\0#!/bin/sh\necho caf\xe9").hexdigest()[:16]
    assert sig.key == f"script:1:{expected}"


def test_lone_surrogates_still_give_a_stable_key() -> None:
    a = workload_signature(1, "j\ud800", "x\ud801", Directives())
    b = workload_signature(1, "j\ud800", "x\ud801", Directives())
    assert a.key == b.key
    assert a.key.isascii()


@pytest.mark.parametrize("name", ["a;b=c", "x y", "semi;colon", "\x00", "ü"])
def test_keys_never_hold_record_separators(name: str) -> None:
    for script in (None, "echo\n"):
        key = workload_signature(1, name, script, Directives()).key
        assert key.isascii()
        assert not any(c in key for c in ";= \t\n")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("resnet50", '"resnet50"'),
        ('a"b', '"a\\"b"'),
        ("a\\b", '"a\\\\b"'),
        ("line\nbreak", '"line\\nbreak"'),
        ("caf\udce9", '"caf\\udce9"'),
        ("naïve", '"naïve"'),
        ("x" * 70, '"' + "x" * 64 + '..."'),
    ],
)
def test_quote_label(text: str, expected: str) -> None:
    assert quote_label(text) == expected


# -- SignatureIgnore: what clients write anew into every script -------------------------------

# As dask-jobqueue 0.9's SLURMCluster writes them (cores=4, memory="4GB", processes=1): two
# workers of two clusters differ in the scheduler's port and the worker's name.
DASK_WORKER = """#!/usr/bin/env bash

#SBATCH -J dask-worker
#SBATCH -n 1
#SBATCH --cpus-per-task={cores}
#SBATCH --mem=4G
#SBATCH -t 00:30:00
#SBATCH --gpus-per-node=1

/opt/venv/bin/python -m distributed.cli.dask_worker tcp://10.1.2.3:{port} --name {name} \
--nthreads {cores} --memory-limit 3.73GiB --nanny --death-timeout 60
"""

# As submitit 1.5's AutoExecutor writes them (folder="/home/u/logs/%j"): submit() and
# map_array() differ in %j against %A_%a (and the #SBATCH --array line).
SUBMITIT = """#!/bin/bash

# Parameters
{array}#SBATCH --error=/home/u/logs/{j}/{j}_0_log.err
#SBATCH --gpus-per-node=1
#SBATCH --job-name=submitit
#SBATCH --output=/home/u/logs/{j}/{j}_0_log.out
#SBATCH --signal=USR2@90
#SBATCH --wckey=submitit

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /home/u/logs/{j}/{j}_%t_log.out --error /home/u/logs/{j}/{j}_%t_log.err \
/opt/venv/bin/python -u -m submitit.core._submit {folder}
"""


def key(script: str, ignore: ScriptIgnore = DEFAULT_IGNORE, name: str = "j") -> str:
    return workload_signature(1000, name, script, Directives(), ignore).key


def test_workers_of_every_dask_cluster_are_one_workload() -> None:
    a = DASK_WORKER.format(cores=4, port=39555, name="SLURMCluster-0")
    b = DASK_WORKER.format(cores=8, port=41017, name="SLURMCluster-3")
    assert key(a, name="dask-worker") == key(b, name="dask-worker")
    # Without the built-in set each worker is a workload of its own, as before.
    assert key(a, NO_IGNORE, "dask-worker") != key(b, NO_IGNORE, "dask-worker")
    other = a.replace("distributed.cli.dask_worker", "train.py")
    assert key(other, name="dask-worker") != key(a, name="dask-worker")


def test_a_submitit_array_and_single_job_of_one_function_are_one_workload() -> None:
    single = SUBMITIT.format(array="", j="%j", folder="/home/u/logs/%j")
    array = SUBMITIT.format(array="#SBATCH --array=0-1%2\n", j="%A_%a", folder="/home/u/logs/%j")
    assert key(single, name="submitit") == key(array, name="submitit")
    assert key(single, NO_IGNORE, "submitit") != key(array, NO_IGNORE, "submitit")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("out/multirun/2026-01-31/12-00-00/x", "out/multirun/2026-02-01/09-30-15/x"),
        ("logs/2026-01-31_12-00-00.123456", "logs/2026-11-25_16-02-59.5"),
        (
            "run 550e8400-e29b-41d4-a716-446655440000 x",
            "run 123e4567-e89b-12d3-a456-426614174000 x",
        ),
        ("ck/0123456789abcdef0123456789abcdef/", "ck/fedcba9876543210fedcba9876543210/"),
    ],
)
def test_run_ids_in_paths_do_not_make_a_new_workload(a: str, b: str) -> None:
    assert key(f"#!/bin/sh\npython t.py {a}\n") == key(f"#!/bin/sh\npython t.py {b}\n")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("python train.py --epochs 90", "python train.py --epochs 100"),
        ("python train.py", "python eval.py"),
        ("cp data/2017/x .", "cp data/2018/x ."),
        ("echo deadbeefdeadbeefdeadbeefdeadbeef0", "echo deadbeefdeadbeefdeadbeefdeadbeef1"),
        ("echo 12026-01-31T12:00:00", "echo 12026-01-31T12:00:01"),
    ],
)
def test_a_changed_command_still_makes_a_new_workload(a: str, b: str) -> None:
    assert key(f"#!/bin/sh\n{a}\n") != key(f"#!/bin/sh\n{b}\n")


def test_an_admins_patterns_and_sets() -> None:
    ignore = parse_script_ignore(r"@submitit --seed[=\x20]++[0-9]++")
    assert ignore.spec == r"@submitit --seed[=\x20]++[0-9]++"
    assert key("#!/bin/sh\ntrain --seed 1 --lr 3\n", ignore) == key(
        "#!/bin/sh\ntrain --seed=42 --lr 3\n", ignore
    )
    assert key("#!/bin/sh\ntrain --lr 3\n", ignore) != key("#!/bin/sh\ntrain --lr 4\n", ignore)
    # Only the sets named: a dask worker is no longer folded.
    a = DASK_WORKER.format(cores=4, port=1, name="a")
    assert key(a, ignore) != key(DASK_WORKER.format(cores=4, port=2, name="a"), ignore)
    assert parse_script_ignore("") == NO_IGNORE
    assert parse_script_ignore(DEFAULT_SPEC) == DEFAULT_IGNORE


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("@slurm", "unknown set '@slurm' (@builtin"),
        ("(a+)+$", "can backtrack"),
        ("(a|aa)*b", "can backtrack"),
        (r"\s*\s*x", "can backtrack"),
        ("x{1,100}y", "can backtrack"),
        (r"(a)\1", "refers back"),
        ("(a)?(?(1)b|c)", "refers back"),
        ("[a-", "not a regular expression"),
        ("x?+", "matches the empty text"),
    ],
)
def test_patterns_that_could_stall_slurmctld_are_refused(value: str, why: str) -> None:
    with pytest.raises(SignatureIgnoreError, match=re.escape(why)):
        parse_script_ignore(value)


@pytest.mark.parametrize(
    "value", [r"tcp://\S++", r"--name[=\x20]++\S++", "(?:ab|cd)++", "x{3}", "a?b", "(?>a++)b"]
)
def test_patterns_that_cannot_backtrack_into_a_repeat_are_taken(value: str) -> None:
    assert parse_script_ignore(value).admin is not None


MB = 1 << 20
HOSTILE = {
    "hex": "0123456789abcdef" * (MB // 16),
    "uuid-like": "-00000000-0000-0000-0000-00000000000" * (MB // 36),
    "dask-like": "dask_worke" * (MB // 10),
    "percent": "%A_%" * (MB // 4),
    "date-like": "2024-01-01T12:00:0" * (MB // 18),
    "worker lines": "dask_worker tcp://x:1 --name y\n" * (MB // 31),
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_built_in_sets_cost_milliseconds_on_a_hostile_1_mb_script(text: str) -> None:
    # Catastrophic backtracking would take seconds to hours on 1 MB; hashing the script
    # alone takes a few ms. The bound is loose so that a busy machine cannot fail it.
    best_s = min(_timed(lambda: key("#!/bin/sh\n" + text)) for _ in range(3))
    assert best_s < 0.5


def test_an_admins_slow_pattern_gives_up_within_its_budget() -> None:
    ignore = parse_script_ignore(r"[^\s]++X")  # quadratic on a long word without an X
    script = "#!/bin/sh\n" + ("a" * 1000 + "\n") * 1000
    started = time.perf_counter()
    with pytest.raises(SignatureIgnoreTimeout):
        key(script, ignore)
    # The pattern alone would run for seconds; giving up is what keeps it far under that.
    assert time.perf_counter() - started < 0.5
    # A long line is left as written; the patterns never see it.
    assert key("#!/bin/sh\n" + "a" * 5000 + "\n", ignore)


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started
