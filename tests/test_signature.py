"""Workload signatures and --comment directives (slurm_plugin.signature)."""

from __future__ import annotations

import hashlib

import pytest

from slurm_plugin.signature import (
    UNNAMED,
    DirectiveError,
    Directives,
    Signature,
    global_key,
    parse_coda_directives,
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
