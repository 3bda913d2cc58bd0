"""Joint source-target subword tokenizer (SentencePiece BPE), usable in-graph.

Vaswani et al. (2017), §5.1 "Training Data and Batching": "Sentences were encoded
using byte-pair encoding, which has a shared source-target vocabulary of about
37000 tokens" (WMT14 en-de). This module trains the same kind of vocabulary --
BPE over the source and target text *jointly* -- with SentencePiece, and wraps
the trained model in `tensorflow_text.SentencepieceTokenizer` so that
tokenization runs inside `tf.data`, `tf.function` and exported SavedModels
without Python.

Special ids (`keras_transformer.special_ids`) are fixed for every model trained
here (and checked when a model is loaded), so the rest of the code can rely on them:

| constant | id | meaning                                              |
|----------|----|------------------------------------------------------|
| PAD_ID   | 0  | padding; never produced when encoding text           |
| UNK_ID   | 1  | unknown piece (rare: byte fallback is on by default) |
| BOS_ID   | 2  | start of sequence (decoder input only)               |
| EOS_ID   | 3  | end of sequence                                      |

Example:

    tok = train_tokenizer(src_lines + tgt_lines, "runs/x/spm", vocab_size=8000)
    ids = tok.tokenize(["A dog runs."])          # RaggedTensor int32, no BOS/EOS
    tok.detokenize(ids)                          # [b"A dog runs."]
    tok = Tokenizer("runs/x/spm.model")          # or Tokenizer(tok.model_proto)
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
from collections.abc import Iterable

import numpy as np
import sentencepiece as spm
import tensorflow as tf
import tensorflow_text as tf_text

from keras_transformer import compat
from keras_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

__all__ = [
    "PAD_ID",
    "UNK_ID",
    "BOS_ID",
    "EOS_ID",
    "Tokenizer",
    "train_tokenizer",
    "vocabulary_difference",
]

logger = logging.getLogger(__name__)


class Tokenizer(tf.Module):
    """A trained SentencePiece model with fixed special ids, usable in-graph.

    `tokenize`/`detokenize`/`id_to_piece` are TensorFlow ops (through
    `tensorflow_text.SentencepieceTokenizer`), so they work inside `tf.data`
    maps and `tf.function`. The class is a `tf.Module`: attaching an instance
    to a module that is saved with `tf.saved_model.save` stores the
    SentencePiece model inside the SavedModel (as the tokenizer op's resource).
    The serialized model is also available as `model_proto` (bytes) for
    exporters that prefer to ship it as an explicit asset file.

    Args:
        model: path of a `.model` file written by SentencePiece (any path
            `tf.io.gfile` can read), or the serialized model proto as bytes.
        name: `tf.Module` name.

    Raises:
        ValueError: if the model's special ids are not PAD=0, UNK=1, BOS=2, EOS=3.
    """

    def __init__(self, model: str | os.PathLike | bytes, name: str = "tokenizer"):
        super().__init__(name=name)
        if isinstance(model, (bytes, bytearray)):
            proto = bytes(model)
        else:
            with tf.io.gfile.GFile(os.fspath(model), "rb") as f:
                proto = f.read()
        processor = spm.SentencePieceProcessor(model_proto=proto)
        found = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
        expected = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
        if found != expected:
            raise ValueError(
                "SentencePiece model has special ids (pad, unk, bos, eos) = "
                f"{found}, expected {expected}; train it with train_tokenizer()."
            )
        self._proto = proto
        # Python-side processor: used for vocab size and piece strings only.
        self._processor = processor
        self._sp = tf_text.SentencepieceTokenizer(model=proto, out_type=tf.int32, add_bos=False, add_eos=False)
        # A resource with a shared name survives tf.random.set_seed (tensorflow/text#570).
        shared_name = "keras_transformer_spm_" + hashlib.sha256(proto).hexdigest()[:24]
        self._resource = compat.shared_sentencepiece_resource(proto, shared_name)
        compat.attach_sentencepiece_resource(self._sp, self._resource)
        # sampling_alpha -> a tf_text tokenizer on the same model resource. Set past tf.Module's attribute
        # tracking: samplers are for training input, and a SavedModel of this tokenizer needs none of them.
        object.__setattr__(self, "_samplers", {})

    # -- properties ---------------------------------------------------------
    @property
    def model_proto(self) -> bytes:
        """The serialized SentencePiece `ModelProto` (what `save` writes)."""
        return self._proto

    @property
    def vocab_size(self) -> int:
        """Number of ids, including the four special ids (ids are `0..vocab_size-1`)."""
        return int(self._processor.get_piece_size())

    @property
    def max_bytes_per_token(self) -> int | None:
        """The most bytes of text one token stands for, or None if there is no such bound.

        A piece matches its own characters, of at most 4 UTF-8 bytes each; with
        byte fallback an unknown character is one token per byte. Without byte
        fallback a run of unknown characters is one unknown token however long
        it is, and a normalizer other than "identity" may compose several
        characters into one (NFKC): no bound. `make_batches` drops a pair with
        a side over `max_length` times this many bytes before tokenizing it
        (`data.within_byte_limit`).
        """
        from sentencepiece import sentencepiece_model_pb2

        model = sentencepiece_model_pb2.ModelProto()
        model.ParseFromString(self._proto)
        if not model.trainer_spec.byte_fallback or model.normalizer_spec.name != "identity":
            return None
        text_pieces = (model.SentencePiece.NORMAL, model.SentencePiece.USER_DEFINED)
        return 4 * max(len(piece.piece) for piece in model.pieces if piece.type in text_pieces)

    pad_id = PAD_ID
    unk_id = UNK_ID
    bos_id = BOS_ID
    eos_id = EOS_ID

    # -- in-graph ops -------------------------------------------------------
    def tokenize(self, strings, sampling_alpha: float = 0.0) -> tf.RaggedTensor:
        """Encodes text to subword ids, without BOS/EOS.

        Args:
            strings: a `tf.string` tensor (or str / list of str). A rank-1
                input of N strings gives a `tf.RaggedTensor` of shape [N, None];
                a scalar string gives a dense 1-D tensor.
            sampling_alpha: 0 (default) gives the one best segmentation. Above
                0, a random segmentation of each string, new at every call
                (subword regularization): for a BPE model each merge is skipped
                with probability `sampling_alpha` (BPE-dropout, Provilkov et
                al., 2020; 0.1 there); for a unigram model segmentations are
                sampled from all of them with smoothing `sampling_alpha`
                (Kudo, 2018). SentencePiece draws from its own random
                generator, so sampled ids are not reproducible by a TF seed.

        Returns:
            int32 ids in `[1, vocab_size)`; `PAD_ID` (0) is never produced.
            A sampled segmentation detokenizes to the same text as the best one.
        """
        sampling_alpha = sampling_alpha or 0.0  # None: the best segmentation, like 0
        if not 0.0 <= sampling_alpha <= 1.0:
            raise ValueError(f"sampling_alpha must be in [0, 1], got {sampling_alpha!r}.")
        strings = tf.convert_to_tensor(strings, dtype=tf.string)
        if not sampling_alpha:
            return self._sp.tokenize(strings)
        return self._sampling_tokenizer(float(sampling_alpha)).tokenize(strings)

    def _sampling_tokenizer(self, alpha):
        if alpha not in self._samplers:
            # nbest_size=-1: sample from all segmentations (unigram); BPE models ignore it.
            sampler = tf_text.SentencepieceTokenizer(
                model=self._proto, out_type=tf.int32, nbest_size=-1, alpha=alpha, add_bos=False, add_eos=False
            )
            compat.attach_sentencepiece_resource(sampler, self._resource)
            self._samplers[alpha] = sampler
        return self._samplers[alpha]

    def detokenize(self, ids) -> tf.Tensor:
        """Decodes ids back to text.

        Everything from the first `EOS_ID` on is dropped, and so are all
        `PAD_ID` and `BOS_ID` tokens, so raw decoder output (`[BOS] y [EOS]
        <pad>...` or padded batches) can be passed directly.

        Args:
            ids: integer ids, dense (padded) or `tf.RaggedTensor`; rank 1 (one
                sequence) or rank 2 (a batch). NumPy arrays and lists work too.

        Returns:
            A scalar `tf.string` for rank-1 input, a [batch] `tf.string`
            tensor for rank-2 input.
        """
        if isinstance(ids, tf.RaggedTensor):
            ragged = ids
        else:
            ids = tf.convert_to_tensor(ids)
            if ids.shape.rank == 1:
                return self.detokenize(ids[tf.newaxis])[0]
            if ids.shape.rank != 2:
                raise ValueError(f"detokenize expects rank 1 or 2 ids, got shape {ids.shape}")
            ragged = tf.RaggedTensor.from_tensor(ids)
        if ragged.shape.rank != 2:
            raise ValueError(f"detokenize expects rank 2 ragged ids, got shape {ragged.shape}")
        ragged = tf.cast(ragged, tf.int32)
        # Keep the tokens strictly before the first EOS of each row ...
        eos_seen = tf.math.cumsum(tf.cast(tf.equal(ragged, EOS_ID), tf.int32), axis=1)
        keep = tf.equal(eos_seen, 0)
        # ... and never decode padding or BOS.
        keep = tf.logical_and(keep, tf.not_equal(ragged, PAD_ID))
        keep = tf.logical_and(keep, tf.not_equal(ragged, BOS_ID))
        return self._sp.detokenize(tf.ragged.boolean_mask(ragged, keep))

    def id_to_piece(self, ids) -> tf.Tensor:
        """In-graph id -> piece string (same shape as `ids`; dense or ragged)."""
        return self._sp.id_to_string(ids)

    # -- Python helpers -----------------------------------------------------
    def pieces(self, ids) -> list:
        """Piece strings for ids, as Python `str` (e.g. attention-plot labels).

        Args:
            ids: a 1-D sequence of ids (list, NumPy array or tensor) -> `list[str]`;
                2-D input gives a list of lists. Pad ids are kept (as `"<pad>"`)
                so the result lines up with the attention matrix.
        """
        if isinstance(ids, tf.RaggedTensor):
            ids = ids.to_list()
        elif isinstance(ids, (tf.Tensor, np.ndarray)):
            ids = np.asarray(ids).tolist()
        if isinstance(ids, (int, np.integer)):
            return self._processor.id_to_piece(int(ids))
        return [self.pieces(x) for x in ids]

    def encode(self, text: str) -> list[int]:
        """Python convenience: ids of one string (same ids as `tokenize`)."""
        return self._processor.encode(text)

    def save(self, path: str | os.PathLike) -> str:
        """Writes the SentencePiece model (`model_proto`) to `path`; returns it."""
        path = os.fspath(path)
        with tf.io.gfile.GFile(path, "wb") as f:
            f.write(self._proto)
        return path


_SPECIAL_REASON = "keras_transformer.special_ids fixes the special tokens (<pad>=0, <unk>=1, <s>=2, </s>=3)"
# SentencePiece trainer flags that train_tokenizer sets itself, and why a caller may not.
_FIXED_TRAINER_FLAGS = {
    **{f"{token}_{kind}": _SPECIAL_REASON for token in ("pad", "unk", "bos", "eos") for kind in ("id", "piece")},
    **{name: "the sentences are `texts`" for name in ("input", "sentence_iterator")},
}


def train_tokenizer(
    texts: Iterable[str],
    model_prefix: str | os.PathLike,
    vocab_size: int = 8000,
    model_type: str = "bpe",
    *,
    character_coverage: float = 1.0,
    byte_fallback: bool = True,
    normalization_rule_name: str = "identity",
    max_sentence_length: int = 4192,
    num_threads: int = 1,
    seed: int = 0,
    **trainer_kwargs,
) -> Tokenizer:
    """Trains a joint source-target SentencePiece vocabulary (BPE by default, §5.1).

    Pass the source and target training sentences together (e.g.
    `src_lines + tgt_lines`) so both languages share one vocabulary, as in the
    paper; this is also what makes tying the embedding matrices possible (§3.4).

    Training is deterministic: every sentence is used (no sampling), in the
    given order (no shuffling), the random seed is fixed and the thread count is
    fixed, so the same texts and arguments give the same vocabulary (the model
    file also records `model_prefix`, so it is byte-identical only for the
    same prefix: compare vocabularies with `vocabulary_difference`).

    Args:
        texts: iterable of sentences (str); blank lines are skipped.
        model_prefix: writes `{model_prefix}.model` and `{model_prefix}.vocab`;
            parent directories are created.
        vocab_size: total vocabulary size including the 4 special ids.
        model_type: SentencePiece model type: "bpe" (paper), "unigram", "char"
            or "word".
        character_coverage: fraction of characters covered by the base alphabet;
            1.0 keeps every character seen (fine for Latin-script languages).
        byte_fallback: encode characters outside the vocabulary as UTF-8 byte
            pieces instead of UNK, so any text round-trips (costs 256 ids).
        normalization_rule_name: SentencePiece text normalization. The default
            "identity" leaves characters untouched, so decoding gives back the
            input text, e.g. the no-break spaces and soft hyphens found in
            Multi30k/newstest references, except for spaces: leading and
            trailing ones are dropped, runs of them become one, and a literal
            U+2581 (SentencePiece's space mark) comes back as a space.
            "nmt_nfkc" (SentencePiece's default) would map the no-break spaces,
            soft hyphens and other compatibility characters to their NFKC forms.
        max_sentence_length: longer sentences (in bytes) are ignored for training.
        num_threads: trainer threads (recorded in the model, so it is fixed for
            reproducibility).
        seed: SentencePiece random seed.
        **trainer_kwargs: any other `spm.SentencePieceTrainer` flag,
            including `input_sentence_size`, `shuffle_input_sentence` and
            `minloglevel`, which replace the defaults set here (0, False, 2).

    Returns:
        The trained `Tokenizer`.

    Raises:
        ValueError: `texts` has no sentence, or `trainer_kwargs` sets a
            special token's id or piece (`keras_transformer.special_ids`
            fixes them) or the input (`texts` is the input).
    """
    model_prefix = os.fspath(model_prefix)
    refused = sorted(set(trainer_kwargs) & set(_FIXED_TRAINER_FLAGS))
    if refused:
        raise ValueError(
            f"train_tokenizer (tokenizer {model_prefix}): {', '.join(refused)} cannot be set: "
            + "; ".join(dict.fromkeys(_FIXED_TRAINER_FLAGS[name] for name in refused))
            + "."
        )
    parent = os.path.dirname(model_prefix)
    if parent:
        os.makedirs(parent, exist_ok=True)
    sentences = (s for s in (t.strip() for t in texts) if s)
    first = next(sentences, None)
    if first is None:  # SentencePiece would only say "[!sentences_.empty()]"
        raise ValueError(
            f"No text to learn a vocabulary from: every training sentence is empty or blank (tokenizer {model_prefix})."
        )
    flags = dict(
        input_sentence_size=0,  # use every sentence ...
        shuffle_input_sentence=False,  # ... in order: deterministic
        minloglevel=2,  # SentencePiece logs every step to stderr otherwise
    )
    flags.update(trainer_kwargs)  # the caller's flags win
    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        sentence_iterator=itertools.chain([first], sentences),
        model_prefix=model_prefix,
        vocab_size=vocab_size,
        model_type=model_type,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        character_coverage=character_coverage,
        byte_fallback=byte_fallback,
        normalization_rule_name=normalization_rule_name,
        max_sentence_length=max_sentence_length,
        num_threads=num_threads,
        **flags,
    )
    return Tokenizer(model_prefix + ".model")


def _comparable_model(model):
    """The `ModelProto` of a SentencePiece model (path or bytes), without the paths training recorded."""
    from google.protobuf.message import DecodeError
    from sentencepiece import sentencepiece_model_pb2

    where = "the given bytes"
    if not isinstance(model, (bytes, bytearray)):
        where = os.fspath(model)
        with tf.io.gfile.GFile(where, "rb") as f:
            model = f.read()
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(bytes(model))
    except DecodeError as error:
        raise ValueError(f"{where} is not a SentencePiece model: {error}") from None
    proto.trainer_spec.ClearField("model_prefix")  # where the files were written, e.g. a temporary directory
    proto.trainer_spec.ClearField("input")
    return proto


def vocabulary_difference(a, b) -> str | None:
    """None if two SentencePiece models (paths or bytes) are the same vocabulary, else what differs first.

    The same vocabulary: the same pieces (with their scores and types),
    normalization and trainer options. Only the paths training recorded
    (`model_prefix`, `input`) may differ, so the files can differ.
    """
    first, second = _comparable_model(a), _comparable_model(b)
    if first == second:
        return None
    if len(first.pieces) != len(second.pieces):
        return f"{len(first.pieces)} pieces against {len(second.pieces)}"
    for i, (x, y) in enumerate(zip(first.pieces, second.pieces)):
        if x != y:
            return f"piece {i} is {x.piece!r} (score {x.score:g}) against {y.piece!r} (score {y.score:g})"
    for part in ("trainer_spec", "normalizer_spec", "denormalizer_spec"):
        x, y = getattr(first, part), getattr(second, part)
        if x != y:
            names = {f.name for f, _ in x.ListFields()} | {f.name for f, _ in y.ListFields()}
            fields = sorted(name for name in names if getattr(x, name) != getattr(y, name))
            return f"their {part} differs" + (f" ({', '.join(fields)})" if fields else "")
    return "their model protos differ"
