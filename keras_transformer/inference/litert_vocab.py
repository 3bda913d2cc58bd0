"""The tables a LiteRT translator tokenizes and detokenizes with, read from the run's SentencePiece model.

LiteRT runs tensorflow-text's `FastSentencepieceTokenizer`, but that
tokenizer segments as a unigram model does (the best-scoring path through the
pieces): given the BPE model of `keras_transformer.data.tokenizer` (§5.1's
byte-pair encoding), it finds other pieces than SentencePiece's BPE merges
for almost every sentence of Multi30k, and it has no byte fallback. So the
LiteRT translator encodes with SentencePiece's own BPE algorithm, written as
TensorFlow ops that LiteRT has (`litert_text`), from these tables:

- `chars`, `char_ids`: the single-character pieces, by code point;
- `merge_keys`, `merge_ranks`, `merge_ids`: every pair of pieces whose
  concatenation is a piece, as `left * V + right`, with the rank of that
  piece (0 = highest score, merged first) and its id;
- `starts_word`: whether a piece begins with the whitespace mark "▁"
  (no piece has it anywhere else, so merges never cross words);
- `byte_ids`: the pieces `<0x00>`..`<0xFF>` of byte fallback (or none).

`atom_texts` are the texts SentencePiece's decoder writes for an output
token, by "atom" (`litert_text.detokenize` picks the atom of each token).

Only models as `train_tokenizer` writes them are taken: BPE, identity
normalization, the whitespace options on; anything else raises ValueError
naming what differs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

SPACE_MARK = "\u2581"  # SentencePiece's "▁": a space, and the start of a word
REPLACEMENT_CHAR = "\ufffd"

# SentencePiece piece types (sentencepiece_model.proto).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


@dataclasses.dataclass(frozen=True)
class SubwordTables:
    """What `litert_text` needs of a SentencePiece BPE model, as NumPy arrays (see the module docstring).

    Attributes:
        vocab_size: V, the number of pieces.
        chars, char_ids: int32 `[C]` code points of the one-character pieces, sorted, and their ids.
        merge_keys, merge_ranks, merge_ids: int64 `[M]` sorted `left * V + right`; int32 `[M]` rank and id of the
            piece the pair makes.
        starts_word: bool `[V]`.
        byte_ids: int32 `[256]` the id of each byte's piece, or None without byte fallback.
        space_id: the id of the piece "▁".
        unk_surface: the text SentencePiece decodes the unknown piece to.
        pieces: the piece strings, by id (for the decoder's texts).
        piece_types: int32 `[V]` the SentencePiece type of each piece.
    """

    vocab_size: int
    chars: np.ndarray
    char_ids: np.ndarray
    merge_keys: np.ndarray
    merge_ranks: np.ndarray
    merge_ids: np.ndarray
    starts_word: np.ndarray
    byte_ids: np.ndarray | None
    space_id: int
    unk_surface: str
    pieces: tuple
    piece_types: np.ndarray

    @classmethod
    def from_proto(cls, model_proto):
        """The tables of a serialized SentencePiece `ModelProto` (`Tokenizer.model_proto`)."""
        from sentencepiece import sentencepiece_model_pb2

        model = sentencepiece_model_pb2.ModelProto()
        model.ParseFromString(model_proto)
        _check_supported(model)
        pieces = tuple(p.piece for p in model.pieces)
        types = np.array([p.type for p in model.pieces], np.int32)
        normal = {p.piece: i for i, p in enumerate(model.pieces) if p.type == NORMAL}
        # SentencePiece merges the pair whose piece scores highest first: rank 0.
        by_score = sorted(normal.values(), key=lambda i: -model.pieces[i].score)
        rank = {piece_id: r for r, piece_id in enumerate(by_score)}
        vocab_size = len(pieces)
        keys, ranks, ids = [], [], []
        for piece, piece_id in normal.items():
            for split in range(1, len(piece)):
                left, right = normal.get(piece[:split]), normal.get(piece[split:])
                if left is not None and right is not None:
                    keys.append(left * vocab_size + right)
                    ranks.append(rank[piece_id])
                    ids.append(piece_id)
        order = np.argsort(np.array(keys, np.int64), kind="stable")
        chars = sorted((ord(piece), piece_id) for piece, piece_id in normal.items() if len(piece) == 1)
        byte_ids = None
        if model.trainer_spec.byte_fallback:
            lookup = {p: i for i, p in enumerate(pieces) if types[i] == BYTE}
            byte_ids = np.array([lookup[f"<0x{b:02X}>"] for b in range(256)], np.int32)
        return cls(
            vocab_size=vocab_size,
            chars=np.array([c for c, _ in chars], np.int32),
            char_ids=np.array([i for _, i in chars], np.int32),
            merge_keys=np.array(keys, np.int64)[order],
            merge_ranks=np.array(ranks, np.int32)[order],
            merge_ids=np.array(ids, np.int32)[order],
            starts_word=np.array([t == NORMAL and p.startswith(SPACE_MARK) for p, t in zip(pieces, types)]),
            byte_ids=byte_ids,
            space_id=normal[SPACE_MARK],
            unk_surface=model.trainer_spec.unk_surface,
            pieces=pieces,
            piece_types=types,
        )

    # Detokenization -------------------------------------------------------------------

    @property
    def stripped_offset(self):
        """Decoder atom `stripped_offset + id`: piece `id` without its leading "▁" (the text's first word)."""
        return self.vocab_size

    @property
    def replacement_atom(self):
        """The decoder atom of U+FFFD, for a byte that starts no valid UTF-8 character."""
        return 2 * self.vocab_size

    @property
    def raw_byte_offset(self):
        """Decoder atom `raw_byte_offset + b`: the raw byte b."""
        return 2 * self.vocab_size + 1

    def atom_texts(self):
        """The text of each decoder atom, UTF-8 bytes (a raw byte atom's one byte).

        Atoms: each piece's text as SentencePiece decodes it inside a text
        ("▁" a space; byte and control pieces empty, the unknown piece its
        surface), then each piece without its leading "▁", then U+FFFD, then
        the 256 single bytes.
        """
        texts = [
            self.unk_surface if piece_type == UNKNOWN else piece if piece_type == NORMAL else ""
            for piece, piece_type in zip(self.pieces, self.piece_types)
        ]
        texts += [text[1:] if text.startswith(SPACE_MARK) else text for text in texts]
        encoded = [text.replace(SPACE_MARK, " ").encode("utf-8") for text in texts + [REPLACEMENT_CHAR]]
        return encoded + [bytes([b]) for b in range(256)]


def _check_supported(model):
    """Raises ValueError if the model is not one `litert_text` tokenizes exactly as SentencePiece does."""
    from sentencepiece import sentencepiece_model_pb2

    spec, normalizer = model.trainer_spec, model.normalizer_spec
    problems = []
    if spec.model_type != sentencepiece_model_pb2.TrainerSpec.BPE:
        problems.append(f"model_type {sentencepiece_model_pb2.TrainerSpec.ModelType.Name(spec.model_type)}, not BPE")
    if normalizer.precompiled_charsmap or normalizer.name not in ("identity", ""):
        problems.append(f"normalization {normalizer.name!r}, not 'identity'")
    if model.denormalizer_spec.precompiled_charsmap:
        problems.append("a denormalizer")
    for option in ("add_dummy_prefix", "remove_extra_whitespaces", "escape_whitespaces"):
        if not getattr(normalizer, option):
            problems.append(f"{option} off")
    if spec.treat_whitespace_as_suffix:
        problems.append("treat_whitespace_as_suffix on")
    odd = sorted({p.type for p in model.pieces} & {USER_DEFINED, UNUSED})
    if odd:
        problems.append("user-defined or unused pieces")
    normal = [p.piece for p in model.pieces if p.type == NORMAL]
    if any(SPACE_MARK in piece[1:] for piece in normal):
        problems.append(f"pieces with {SPACE_MARK!r} inside (merges across words)")
    singles = {piece for piece in normal if len(piece) == 1}
    if SPACE_MARK not in singles or any(c not in singles for piece in normal for c in piece):
        problems.append("characters of pieces that are no piece of their own")
    if problems:
        raise ValueError(
            "The LiteRT translator tokenizes SentencePiece BPE models as train_tokenizer writes them; this one has "
            + "; ".join(problems)
            + "."
        )
