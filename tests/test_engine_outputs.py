"""Output handling (specops.engine.outputs) and the embedded pair's byte-level tokenizer.

The processor, fed tokens in arbitrary step sizes, must end exactly where a plain
re-decode of the whole sequence says it should (``expected_output`` below)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specops.assets import tokenizer_path
from specops.engine.outputs import (
    FinishReason,
    IncrementalDetokenizer,
    OutputProcessor,
    StopParams,
)

EOS = 257
REPO = Path(__file__).resolve().parents[1]
TEXTS = ["plain ascii", "héllo wörld", "日本語のテキスト", "emoji 🎉🐍 mix é", "tabs\tand\nnewlines\r\n", "\x00\x7f\x1b"]


def byte_decode(ids: list[int]) -> str:
    """The reference: bytes of the ids below 256, invalid UTF-8 as U+FFFD."""
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer.from_file(str(tokenizer_path()))


def chunked(items: list, sizes: list[int]) -> list[list]:
    """``items`` cut into runs of the given sizes (cycled), like tokens per step."""
    runs, start, i = [], 0, 0
    while start < len(items):
        size = sizes[i % len(sizes)] if sizes else 1
        runs.append(items[start:start + size])
        start += size
        i += 1
    return runs


# --- the byte-level tokenizer ------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_round_trip(tokenizer, text):
    ids = tokenizer.encode(text).ids
    assert ids == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text


def test_tokenizer_special_tokens(tokenizer):
    assert tokenizer.get_vocab_size() == 258
    assert tokenizer.token_to_id("<|bos|>") == 256 and tokenizer.token_to_id("<|eos|>") == 257
    assert tokenizer.encode("<|bos|>a<|eos|>").ids == [256, 97, 257]
    assert tokenizer.decode([256, 97, 257], skip_special_tokens=True) == "a"


@given(st.binary(max_size=24))
def test_tokenizer_decodes_any_bytes_like_python(tokenizer_bytes):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path()))
    assert tokenizer.decode(list(tokenizer_bytes)) == tokenizer_bytes.decode("utf-8", errors="replace")


def test_committed_tokenizer_matches_the_generator():
    spec = importlib.util.spec_from_file_location("byte_tokenizer", REPO / "scripts" / "byte_tokenizer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert tokenizer_path().read_text(encoding="utf-8") == module.tokenizer_json()


# --- the incremental detokenizer ---------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_detokenizer_emits_whole_characters(tokenizer, text):
    detokenizer = IncrementalDetokenizer(lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    data = text.encode("utf-8")
    pieces = [detokenizer.push(b) for b in data]
    assert "".join(pieces) + detokenizer.flush() == text
    for piece in pieces:
        assert "\ufffd" not in piece
    # A character's text appears with its last byte, nothing before.
    for i, piece in enumerate(pieces):
        complete = data[: i + 1].decode("utf-8", errors="ignore")
        assert "".join(pieces[: i + 1]) == complete, (i, piece)


def test_detokenizer_flushes_an_unfinished_character():
    detokenizer = IncrementalDetokenizer(byte_decode)
    assert detokenizer.push(ord("a")) == "a"
    assert detokenizer.push(0xE6) == "" and detokenizer.push(0x97) == ""
    assert detokenizer.flush() == "\ufffd"


def test_detokenizer_reads_prompt_as_context_only():
    prompt = list("日本".encode())
    detokenizer = IncrementalDetokenizer(byte_decode, prompt_token_ids=prompt)
    assert "".join(detokenizer.push(b) for b in "語x".encode()) == "語x"


@given(st.binary(max_size=40), st.lists(st.integers(1, 5), min_size=1, max_size=4))
def test_detokenizer_matches_whole_decode(data, sizes):
    detokenizer = IncrementalDetokenizer(byte_decode)
    text = "".join(detokenizer.push(b) for run in chunked(list(data), sizes) for b in run) + detokenizer.flush()
    assert text == data.decode("utf-8", errors="replace")


# --- stop handling -------------------------------------------------------------------------


def expected_output(tokens: list[int], params: StopParams):
    """(token_ids, text, finish_reason, stop_reason) by re-decoding every prefix whole."""
    for i in range(1, len(tokens) + 1):
        if params.eos_token_id is not None and tokens[i - 1] == params.eos_token_id:
            return tokens[:i], byte_decode(tokens[: i - 1]), FinishReason.STOP, tokens[i - 1]
        text = byte_decode(tokens[:i])
        found = [(text.find(s), s) for s in params.stop if s in text]
        if found:
            index, stop = min(found, key=lambda item: item[0])
            return tokens[:i], text[:index], FinishReason.STOP, stop
        if i == params.max_tokens:
            return tokens[:i], text, FinishReason.LENGTH, None
    return tokens, None, None, None


def run_steps(params: StopParams, steps: list[list[int]]) -> tuple[OutputProcessor, str]:
    processor = OutputProcessor(params, byte_decode)
    streamed = ""
    for step in steps:
        if processor.output.finished:
            break
        streamed += processor.append(step)
        assert processor.output.text == streamed
        assert not any(s in streamed for s in params.stop)
    return processor, streamed


def test_stop_string_spanning_steps():
    processor, streamed = run_steps(StopParams(max_tokens=50, stop=("END",)), [list(b"abcE"), list(b"N"), list(b"Dxyz")])
    out = processor.output
    assert (streamed, out.finish_reason, out.stop_reason) == ("abc", FinishReason.STOP, "END")
    assert out.token_ids == list(b"abcEND")  # the token completing the stop string is kept, the rest dropped


def test_text_is_held_back_only_while_it_may_begin_a_stop_string():
    processor = OutputProcessor(StopParams(max_tokens=50, stop=("xyz", "qq")), byte_decode)
    assert processor.append(list(b"abcx")) == "abc"  # "x" may begin "xyz"
    assert processor.append(list(b"y")) == ""  # "xy" too
    assert processor.append(list(b"aq")) == "xya"  # "q" may begin "qq"
    assert processor.append(list(b"b")) == "qb"
    assert processor.append(list(b"qqz")) == ""
    assert (processor.output.text, processor.output.stop_reason) == ("abcxyaqb", "qq")


def test_eos_mid_step_drops_later_tokens():
    processor, streamed = run_steps(StopParams(max_tokens=50, eos_token_id=EOS), [[104, 105, EOS, 106, 107]])
    out = processor.output
    assert (streamed, out.token_ids, out.finish_reason, out.stop_reason) == ("hi", [104, 105, EOS], FinishReason.STOP,
                                                                             EOS)


def test_max_tokens_cuts_a_step():
    processor, streamed = run_steps(StopParams(max_tokens=3, eos_token_id=EOS), [[97], [98, 99, 100, 101]])
    out = processor.output
    assert (streamed, out.token_ids, out.finish_reason) == ("abc", [97, 98, 99], FinishReason.LENGTH)


def test_finish_flushes_an_unfinished_character():
    processor, streamed = run_steps(StopParams(max_tokens=2), [[97, 0xE6]])
    assert streamed == "a\ufffd" and processor.output.finish_reason is FinishReason.LENGTH


def test_multibyte_character_split_across_steps():
    data = list("→é".encode())
    processor, streamed = run_steps(StopParams(max_tokens=50, stop=("é",)), [data[:1], data[1:3], data[3:4], data[4:]])
    assert streamed == "→" and processor.output.stop_reason == "é"


def test_append_after_finish_raises():
    processor, _ = run_steps(StopParams(max_tokens=1), [[97]])
    with pytest.raises(RuntimeError, match="finished"):
        processor.append([98])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2, "eos_token_id": -1}, "eos_token_id"),
        ({"max_tokens": 2, "stop": ("",)}, "stop"),
        ({"max_tokens": 2, "stop": "ab"}, "stop"),
    ],
)
def test_stop_params_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StopParams(**kwargs)


@st.composite
def token_runs(draw):
    """Bytes of text over a small alphabet (so stop strings recur), with an occasional
    invalid byte or EOS in it."""
    tokens = list(draw(st.text(alphabet="ab\né€", max_size=16)).encode())
    for _ in range(draw(st.integers(0, 2))):
        tokens.insert(draw(st.integers(0, len(tokens))), draw(st.sampled_from([0xFF, EOS])))
    return tokens


@given(
    tokens=token_runs(),
    data=st.data(),
    max_tokens=st.integers(1, 40),
    use_eos=st.booleans(),
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=4),
)
def test_processor_matches_whole_decode(tokens, data, max_tokens, use_eos, sizes):
    # Stop strings cut from the text itself (so they do occur, often across steps) or free.
    source = byte_decode(tokens).replace("\ufffd", "")
    cut = st.tuples(st.integers(0, len(source)), st.integers(1, 3)).map(lambda c: source[c[0]:c[0] + c[1]])
    free = st.text(alphabet="ab\né€", min_size=1, max_size=3)
    stop = data.draw(st.lists(st.one_of(cut, free).filter(bool), max_size=3))
    params = StopParams(max_tokens=max_tokens, eos_token_id=EOS if use_eos else None, stop=tuple(stop))
    processor, streamed = run_steps(params, chunked(tokens, sizes))
    token_ids, text, reason, stop_reason = expected_output(tokens, params)
    out = processor.output
    assert out.token_ids == token_ids
    assert (out.finish_reason, out.stop_reason) == (reason, stop_reason)
    if reason is None:
        assert byte_decode(tokens).startswith(out.text)  # unfinished: a prefix, the rest held back
    else:
        assert out.text == text == streamed
