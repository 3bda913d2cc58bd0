"""Where the data comes from: one `DataSpec` parsed from "multi30k", "tfds:NAME" or "files:SRC,TGT".

The command line, the training loop and the examples all name their data by
such a string; this is the only place that reads it.
"""

from __future__ import annotations

import dataclasses
import string

# Split names accepted for the vendored Multi30k, mapped to its own names.
_MULTI30K_SPLIT_ALIASES = {"validation": "val", "valid": "val", "dev": "val", "test": "test2016"}

# The fields a "files:" path template may contain.
_TEMPLATE_FIELDS = ("split", "src", "tgt")

# How much of a streamed corpus trains the vocabulary: 2M sentences is enough text for BPE.
TOKENIZER_PAIRS_FROM_STREAM = 1_000_000


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """A parsed data spec.

    Attributes:
        kind: "multi30k" (vendored), "tfds" (TensorFlow Datasets) or "files"
            (two aligned text files).
        name: the tfds name (e.g. "wmt14_translate/de-en"), else "".
        paths: `(SRC, TGT)` path templates of "files:", which may contain
            `{split}`, `{src}` and `{tgt}`.

    Example:
    >>> DataSpec.parse("files:data/{split}.{src},data/{split}.{tgt}").paths
    ('data/{split}.{src}', 'data/{split}.{tgt}')
    >>> DataSpec.parse("tfds:wmt14_translate/de-en").streamed
    True
    """

    kind: str
    name: str = ""
    paths: tuple = ()

    @classmethod
    def parse(cls, spec: str | DataSpec) -> DataSpec:
        """Parses `spec`; a `ValueError` names the accepted forms."""
        if isinstance(spec, DataSpec):
            return spec
        if spec == "multi30k":
            return cls("multi30k")
        if isinstance(spec, str) and spec.startswith("tfds:") and len(spec) > len("tfds:"):
            return cls("tfds", name=spec[len("tfds:") :])
        if isinstance(spec, str) and spec.startswith("files:"):
            paths = tuple(path.strip() for path in spec[len("files:") :].split(","))
            if len(paths) == 2 and all(paths):
                for path in paths:
                    _check_template(path)
                return cls("files", paths=paths)
        raise ValueError(f"Unknown dataset spec {spec!r}; expected 'multi30k', 'tfds:NAME' or 'files:SRC,TGT'")

    def __str__(self):
        if self.kind == "tfds":
            return f"tfds:{self.name}"
        if self.kind == "files":
            return "files:" + ",".join(self.paths)
        return self.kind

    @property
    def streamed(self) -> bool:
        """Whether the corpus is read as a stream (tfds) rather than held in memory."""
        return self.kind == "tfds"

    def split_name(self, split: str) -> str:
        """The data set's own name of `split` ("val" is "validation" in tfds; aliases for Multi30k)."""
        if self.kind == "tfds" and split == "val":
            return "validation"
        if self.kind == "multi30k":
            return _MULTI30K_SPLIT_ALIASES.get(split, split)
        return split

    def load(self, split: str = "train", src: str = "en", tgt: str = "de", shuffle_seed=None):
        """`tf.data.Dataset` of `(source_text, target_text)` pairs of `split`.

        `shuffle_seed`: a tfds split is read with its files in an order shuffled
        with this seed (`load_tfds`); the other corpora are read in order.
        """
        split = self.split_name(split)
        if self.kind == "multi30k":
            from keras_transformer.data.corpora import load_multi30k

            return load_multi30k(split, src, tgt)
        if self.kind == "tfds":
            from keras_transformer.data.tfds import load_tfds

            return load_tfds(self.name, split=split, src=src, tgt=tgt, shuffle_seed=shuffle_seed)
        from keras_transformer.data.text import load_parallel_text

        return load_parallel_text(*self.file_paths(split, src, tgt))

    def file_paths(self, split: str, src: str = "en", tgt: str = "de") -> tuple:
        """The `(source, target)` files of `split` of a "files:" spec (its templates filled in)."""
        return tuple(p.format(split=self.split_name(split), src=src, tgt=tgt) for p in self.paths)

    def training_texts(self, src: str, tgt: str) -> list:
        """Source then target sentences of the training split, to learn a vocabulary from."""
        if self.kind == "multi30k":
            from keras_transformer.data.corpora import read_lines

            return read_lines("train", src) + read_lines("train", tgt)
        dataset = self.load("train", src, tgt)
        if self.streamed:
            dataset = dataset.take(TOKENIZER_PAIRS_FROM_STREAM)
        sources, targets = [], []
        for source_batch, target_batch in dataset.batch(65536).as_numpy_iterator():
            sources.extend(s.decode("utf-8") for s in source_batch)
            targets.extend(t.decode("utf-8") for t in target_batch)
        return sources + targets


def _check_template(path: str) -> None:
    """Refuses a "files:" path whose braces are not `{split}`, `{src}` or `{tgt}` (`{{` is a brace)."""
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(path) if field is not None]
    except ValueError as error:
        raise ValueError(f"files: path {path!r}: {error} (write a literal brace as '{{{{')") from None
    for field in fields:
        if field not in _TEMPLATE_FIELDS:
            raise ValueError(
                f"files: path {path!r} has {{{field}}}; a path may contain {{split}}, {{src}} and {{tgt}} "
                "(write a literal brace as '{{')"
            )


def load_dataset(spec, split: str = "train", src: str = "en", tgt: str = "de"):
    """Loads `(source_text, target_text)` pairs from a spec string (see `DataSpec`).

    Args:
        spec: one of

            * `"multi30k"`: the vendored Multi30k (splits "train", "val",
              "test2016"; "validation"/"valid"/"dev" and "test" are accepted
              as aliases);
            * `"tfds:NAME"`: `load_tfds(NAME, split, src, tgt)`;
            * `"files:SRC,TGT"`: `load_parallel_text(SRC, TGT)`. The paths
              may contain `{split}`, `{src}` and `{tgt}` placeholders,
              e.g. `"files:data/{split}.{src},data/{split}.{tgt}"`.
        split: split name.
        src, tgt: source and target language codes.

    Raises:
        ValueError: for an unknown spec form, split or language.
    """
    return DataSpec.parse(spec).load(split, src, tgt)
