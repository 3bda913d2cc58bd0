"""Scoring sentence pairs (forced decoding): how probable the model finds a given translation.

`score_pairs(translator, sources, targets)` tokenizes both sides in the
graph, as translation does (both normalized as `Translator.normalized`
does; the source truncated to `max_input_length` and ended by the end token;
the target ended by the end token), and returns log P(target | source) per
pair from one teacher-forced pass (`keras_transformer.decoding.score_outputs`),
batched by length. With `normalize=True` each score is divided by its number
of target tokens, the end token included. These are the scores beam search
reports for its own outputs when the length penalty is off (alpha = 0),
whenever the target's pieces are the ones the tokenizer gives for its text.

A target is not truncated: with learned positions (a table of `max_length`
rows) one longer than `max_length - 1` pieces is a `TargetTooLongError`
(a ValueError naming the pair), raised before any pair is scored.
"""

import weakref

import numpy as np
import tensorflow as tf

from keras_transformer.decoding import score_outputs
from keras_transformer.special_ids import EOS_ID, PAD_ID


class TargetTooLongError(ValueError):
    """A target has more pieces than the model's learned position table allows; `index` is its pair's."""

    def __init__(self, index, pieces, max_pieces):
        self.index, self.pieces, self.max_pieces = index, pieces, max_pieces
        super().__init__(
            f"the target of pair {index} (0-based) has {pieces} pieces, more than the "
            f"{max_pieces} the model's learned positions allow (max_length {max_pieces + 1}, "
            "the end token included)."
        )


class PairScorer(tf.Module):
    """The scoring graph of a `Translator`: strings in, log-probabilities and token counts out."""

    def __init__(self, translator):
        super().__init__(name="pair_scorer")
        self.translator = translator

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def target_ids(self, targets):
        """Targets `[N]` -> output ids `[N, T]`: normalized as the sources are, subwords, then the end
        token, 0-padded."""
        pieces = self.translator.tokenizer.tokenize(self.translator.normalized(targets))
        eos = tf.fill([tf.shape(targets)[0], 1], tf.constant(EOS_ID, pieces.dtype))
        return tf.concat([pieces, eos], axis=1).to_tensor(default_value=PAD_ID)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([None, None], tf.int32)])
    def score_ids(self, sources, output_ids):
        """`(log_probs [N] float32, lengths [N] int32)` of output ids `[N, T]` (`target_ids`) given sources."""
        return score_outputs(self.translator.model, self.translator.source_ids(sources), output_ids)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.string)])
    def score_strings(self, sources, targets):
        """`(log_probs [N] float32, lengths [N] int32)` of each target given its source (lengths unchecked)."""
        return self.score_ids(sources, tf.cast(self.target_ids(targets), tf.int32))


def _max_target_pieces(model):
    """The most pieces a target may have (None: no limit): the decoder sees the start token, then them."""
    config = model.config
    return config.max_length - 1 if config.positional_encoding == "learned" else None


# One scoring graph per translator, kept as long as the translator lives.
_SCORERS = weakref.WeakKeyDictionary()


def score_pairs(translator, sources, targets, batch_size=64, normalize=False):
    """log P(target | source) of each pair (a list of float), or per token with `normalize`.

    Raises:
        ValueError: if `sources` and `targets` differ in length, or
            `batch_size` is not a positive integer.
        TargetTooLongError (a ValueError): a target is longer than the
            model's learned positions allow; nothing is scored.
    """
    sources, targets = list(sources), list(targets)
    if len(sources) != len(targets):
        raise ValueError(f"score_pairs: {len(sources)} sources but {len(targets)} targets.")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size!r}.")
    scorer = _SCORERS.get(translator)
    if scorer is None:
        scorer = _SCORERS[translator] = PairScorer(translator)
    lengths = [len(s.encode("utf-8", "replace")) + len(t.encode("utf-8", "replace")) for s, t in zip(sources, targets)]
    order = np.argsort(lengths, kind="stable")
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    # Every target is tokenized and checked before any pair is scored (tokenizing is cheap).
    output_ids = [scorer.target_ids(tf.constant([targets[i] for i in rows], tf.string)).numpy() for rows in batches]
    max_pieces = _max_target_pieces(translator.model)
    if max_pieces is not None:
        pieces = np.zeros(len(targets), np.int64)
        for rows, ids in zip(batches, output_ids):
            pieces[rows] = np.count_nonzero(ids != PAD_ID, axis=1) - 1  # the end token is not a piece
        too_long = np.flatnonzero(pieces > max_pieces)
        if too_long.size:
            raise TargetTooLongError(int(too_long[0]), int(pieces[too_long[0]]), max_pieces)
    scores = [0.0] * len(sources)
    for rows, ids in zip(batches, output_ids):
        log_probs, counts = scorer.score_ids(
            tf.constant([sources[i] for i in rows], tf.string), tf.constant(ids, tf.int32)
        )
        for row, log_prob, count in zip(rows, log_probs.numpy(), counts.numpy()):
            scores[row] = float(log_prob / count) if normalize else float(log_prob)
    return scores
