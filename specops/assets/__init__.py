"""Files shipped inside the package: the embedded byte-level draft/target pair.

The pair lives in ``specops/assets/pair/`` (``target/``, ``draft/``: Hugging Face Llama
checkpoints, ``tokenizer.json``: the byte-level tokenizer); ``pair/README.md`` says how it
was trained. It lets the engine run with nothing downloaded.
"""

from __future__ import annotations

from pathlib import Path

PAIR_DIR = Path(__file__).resolve().parent / "pair"
PAIR_FILES = (
    "tokenizer.json",
    "target/config.json",
    "target/model.safetensors",
    "draft/config.json",
    "draft/model.safetensors",
)


def pair_path() -> Path:
    """The folder of the embedded pair, after checking that every file of it is there.

    Returns
    -------
    Path
        ``.../specops/assets/pair``, holding ``target/`` and ``draft/`` (each a Hugging Face
        Llama checkpoint: ``config.json`` + ``model.safetensors``) and ``tokenizer.json``.

    Raises
    ------
    FileNotFoundError
        When a file is missing (the weights are trained on a GPU and committed apart from
        the code), naming the missing files and the command that makes them.
    """
    missing = [name for name in PAIR_FILES if not (PAIR_DIR / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"the embedded draft/target pair is incomplete: {', '.join(missing)} missing under {PAIR_DIR}; "
            f"train it with `python3 scripts/train_pair.py --out {PAIR_DIR}` (see {PAIR_DIR / 'README.md'})"
        )
    return PAIR_DIR


def tokenizer_path() -> Path:
    """The byte-level ``tokenizer.json`` of the pair (present even before the weights are).

    Raises
    ------
    FileNotFoundError
        When the package was installed without its data files.
    """
    path = PAIR_DIR / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the package was installed without its data files")
    return path


__all__ = ["PAIR_DIR", "PAIR_FILES", "pair_path", "tokenizer_path"]
