"""``specops generate`` on the embedded pair: greedy speculative output equals the target
alone (draft model and n-gram), accepted drafts are marked, metrics are printed."""

from __future__ import annotations

import re

from specops import cli

PROMPT = "def add(a, b):\n    return a + b\n\n\ndef "
FLAGS = ["--prompt", PROMPT, "--max-tokens", "24", "--device", "cpu", "--dtype", "float32"]


def generated(out: str) -> str:
    """The generated text: between the prompt header and the summary lines."""
    body = out.split(f"--- prompt: {PROMPT!r}")[1].split("\n--- ")[0]
    return body.split("\n", 1)[1]


def test_greedy_generate_is_lossless_and_marks_drafts(capsys):
    cli.main(["generate", *FLAGS, "--no-spec", "--color", "never"])
    alone = capsys.readouterr().out
    cli.main(["generate", *FLAGS, "--color", "always"])
    spec = capsys.readouterr().out
    cli.main(["generate", *FLAGS, "--ngram", "--k", "3", "--color", "never"])
    ngram = capsys.readouterr().out
    plain = generated(spec).replace(cli.GREEN, "").replace(cli.RESET, "")
    assert plain == generated(alone) == generated(ngram) and plain.startswith(PROMPT)
    assert cli.GREEN in generated(spec)  # some tokens came from accepted drafts
    match = re.search(r"acceptance ([0-9.]+), mean accepted length ([0-9.]+)", spec)
    assert match and 0 < float(match.group(1)) <= 1 and 1 < float(match.group(2)) <= 5
    assert "proposer draft, k 4, scorer paged-verify" in spec and "proposer none, k 0" in alone
