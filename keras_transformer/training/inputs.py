"""A run's inputs, checked before anything is written, and the fingerprint that ties a vocabulary to its data.

`check_inputs` reads every file of the training and validation splits of a
"files:" spec once (present, readable, UTF-8, the two sides with as many
lines), so that a bad file is refused before the run directory exists. What it
read makes the data's fingerprint, recorded beside the vocabulary it trains
(`run_dir.TOKENIZER_DATA_FILENAME`): a later run with other data is refused
rather than given a vocabulary learned on different text (§5.1: the
vocabulary is learned from the training data).
"""

from __future__ import annotations

import json
import os

from keras_transformer.data.spec import DataSpec
from keras_transformer.data.text import check_text_file
from keras_transformer.errors import ParameterError
from keras_transformer.run_dir import TOKENIZER_DATA_FILENAME, TOKENIZER_FILENAME, atomic_write_text


def check_inputs(args):
    """Checks the data files of a run's splits; returns the training data's fingerprint.

    Args:
        args: the run's `TrainingArgs`.

    Returns:
        a dict: `data`, `src`, `tgt`, and for "files:" data `files`, the
        `[{"path", "lines", "sha256"}]` of the two training files.

    Raises:
        ParameterError: (`data`) an unknown spec, one file for both sides of
            a split, or a file of a split that is missing, unreadable, empty,
            not UTF-8, or whose line count differs from the other side's;
            (`tgt`) the source language again, for a named corpus;
            (`validation_split`) validation that would read the training files.
    """
    try:
        spec = DataSpec.parse(args.data)
    except ValueError as error:
        raise ParameterError("data", str(error)) from None
    fingerprint = {"data": str(spec), "src": args.src, "tgt": args.tgt}
    if spec.kind != "files":
        if args.src == args.tgt:
            raise ParameterError(
                "tgt", f"must differ from the source language ({args.src}): data {spec} would pair each sentence "
                "with itself."
            )  # fmt: skip
        return fingerprint
    check_validation_files(spec, args)
    splits = ["train"]
    if args.validation_split and spec.file_paths(args.validation_split, args.src, args.tgt) != spec.file_paths(
        "train", args.src, args.tgt
    ):
        splits.append(args.validation_split)
    for split in splits:
        described = _checked_pair(spec.file_paths(split, args.src, args.tgt), split)
        if split == "train":
            fingerprint["files"] = described
    return fingerprint


def _checked_pair(paths, split):
    """`check_text_file` of a split's source and target files, refused unless they are two files of as many lines."""
    described = []
    for path in paths:
        try:
            described.append(check_text_file(path))
        except ValueError as error:
            raise ParameterError("data", f"{error} ({split} split).") from None
    if os.path.realpath(paths[0]) == os.path.realpath(paths[1]):
        named = paths[0] if paths[0] == paths[1] else f"{paths[0]} and {paths[1]} are one file"
        raise ParameterError(
            "data", f"names one file ({named}) for both sides of the {split} split: each line would be paired with "
            "itself."
        )  # fmt: skip
    source, target = described
    if source["lines"] != target["lines"]:
        raise ParameterError(
            "data",
            f"files of the {split} split have different line counts: {source['path']} has {source['lines']}, "
            f"{target['path']} has {target['lines']} (line i of one translates line i of the other).",
        )
    return described


def check_validation_files(spec, args):
    """Refuses a validation split that reads the training files ("files:" paths without `{split}`)."""
    if spec.kind != "files" or not args.validation_split or spec.split_name(args.validation_split) == "train":
        return  # an explicit validation split "train" is what it says
    paths = spec.file_paths(args.validation_split, args.src, args.tgt)
    if paths == spec.file_paths("train", args.src, args.tgt):
        raise ParameterError(
            "validation_split",
            f"{args.validation_split!r} would read the training files of data {args.data!r} ({', '.join(paths)}), "
            "as the paths have no {split}. Put {split} in them (files:data/{split}.en,data/{split}.de reads "
            "data/train.* and data/val.*) or set validation_split to None.",
        )


def same_data(recorded, fingerprint):
    """Whether two fingerprints name the same training data: the same file contents, or the same spec.

    File paths may differ (a run started from another directory); the bytes
    (SHA-256) and the languages may not.

    Example:
        >>> a = {"data": "files:a.en,a.de", "src": "en", "tgt": "de", "files": [{"path": "a.en", "sha256": "1"}]}
        >>> same_data(a, {**a, "data": "files:../a.en,../a.de", "files": [{"path": "../a.en", "sha256": "1"}]})
        True
        >>> same_data(a, {**a, "files": [{"path": "a.en", "sha256": "2"}]})
        False
    """

    def key(value):
        files = value.get("files")
        content = [f.get("sha256") for f in files] if files else value.get("data")
        return content, value.get("src"), value.get("tgt")

    return key(recorded) == key(fingerprint)


def describe_data(fingerprint):
    """`data src->tgt`, with the checksums of the files of "files:" data, for messages.

    Example:
        >>> describe_data({"data": "multi30k", "src": "en", "tgt": "de"})
        'multi30k en->de'
    """
    text = f"{fingerprint.get('data')} {fingerprint.get('src')}->{fingerprint.get('tgt')}"
    files = fingerprint.get("files")
    if files:
        text += " (" + ", ".join(f"{f['path']} sha256 {f['sha256'][:12]}" for f in files) + ")"
    return text


def tie_vocabulary_to_data(run_dir, fingerprint):
    """Refuses a vocabulary learned on other data; records the data of one about to be learned.

    With `spm.model` in `run_dir` and the fingerprint of its data beside it
    (`TOKENIZER_DATA_FILENAME`), the two must be the same data (`same_data`).
    A vocabulary without a recorded fingerprint (one put there by hand, or by
    `--init-from`) is used as it is. Without `spm.model`, the fingerprint is
    written first, so the vocabulary trained next is never without it.

    Raises:
        ParameterError: (`data`) the vocabulary was learned on other data; names both.
    """
    model_path = os.path.join(run_dir, TOKENIZER_FILENAME)
    data_path = os.path.join(run_dir, TOKENIZER_DATA_FILENAME)
    if not os.path.exists(model_path):
        atomic_write_text(data_path, json.dumps(fingerprint, indent=2, sort_keys=True))
        return
    if not os.path.exists(data_path):
        return
    try:
        with open(data_path, encoding="utf-8") as f:
            recorded = json.load(f)
    except (OSError, ValueError):
        recorded = {"data": f"unreadable {data_path}"}
    if not same_data(recorded, fingerprint):
        raise ParameterError(
            "data",
            f"{describe_data(fingerprint)} is not the data the vocabulary {model_path} was learned on, "
            f"{describe_data(recorded)}: use another output directory, or delete {model_path} and {data_path} "
            "to learn a vocabulary on this data.",
        )
