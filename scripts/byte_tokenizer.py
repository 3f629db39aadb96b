"""The byte-level tokenizer of the embedded draft/target pair, built with `tokenizers`.

Token id = byte value (0..255); two special tokens follow: ``<|bos|>`` = 256 and
``<|eos|>`` = 257 (vocabulary 258). The model is a BPE with no merges over the ByteLevel
alphabet (each byte shown as one printable character), so any text encodes to its UTF-8
bytes one id each and ``decode`` gives the bytes back. Nothing here is learned: the file is
the same on every machine.

Standalone use (writes ``tokenizer.json``)::

    python3 scripts/byte_tokenizer.py specops/assets/pair/tokenizer.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

NUM_BYTES = 256
BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
BOS_ID = NUM_BYTES
EOS_ID = NUM_BYTES + 1
VOCAB_SIZE = NUM_BYTES + 2


def byte_to_char() -> dict[int, str]:
    """The ByteLevel alphabet: byte value -> one printable character.

    Bytes that are printable Latin-1 characters stand for themselves; the others (control
    characters, space, a few Latin-1 gaps) take code points 256, 257, ... in byte order, so
    no byte becomes whitespace or a control character inside the vocabulary.
    """
    printable = [b for b in range(NUM_BYTES) if (0x21 <= b <= 0x7E) or (0xA1 <= b <= 0xAC) or (0xAE <= b <= 0xFF)]
    table = {b: chr(b) for b in printable}
    next_code_point = NUM_BYTES
    for b in range(NUM_BYTES):
        if b not in table:
            table[b] = chr(next_code_point)
            next_code_point += 1
    return table


def build_tokenizer():
    """The byte-level ``tokenizers.Tokenizer`` (vocabulary 258, ids = bytes + BOS + EOS)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in byte_to_char().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=False))
    # use_regex=False: no splitting into words, every byte is its own token anyway.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(BOS_TOKEN, special=True), AddedToken(EOS_TOKEN, special=True)])
    if tokenizer.token_to_id(BOS_TOKEN) != BOS_ID or tokenizer.token_to_id(EOS_TOKEN) != EOS_ID:
        raise RuntimeError("special token ids differ from the byte-level layout (BOS 256, EOS 257)")
    return tokenizer


def tokenizer_json() -> str:
    """``tokenizer.json`` text, with sorted keys so the file is byte-identical everywhere."""
    return json.dumps(json.loads(build_tokenizer().to_str()), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_tokenizer(path: str | Path) -> Path:
    """Write ``tokenizer.json`` to ``path`` (parent folders are created) and return it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tokenizer_json(), encoding="utf-8")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", help="where to write tokenizer.json")
    print(write_tokenizer(parser.parse_args().path))


if __name__ == "__main__":
    main()
