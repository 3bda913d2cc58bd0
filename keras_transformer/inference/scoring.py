"""Scoring sentence pairs (forced decoding): how probable the model finds a given translation.

`score_pairs(translator, sources, targets)` tokenizes both sides in the
graph, as translation does (the source truncated to `max_input_length` and
ended by the end token; the target ended by the end token), and returns
log P(target | source) per pair from one teacher-forced pass
(`keras_transformer.decoding.score_outputs`), batched by length. With
`normalize=True` each score is divided by its number of target tokens, the
end token included. These are the scores beam search reports for its own
outputs when the length penalty is off (alpha = 0), whenever the target's
pieces are the ones the tokenizer gives for its text.
"""

import weakref

import numpy as np
import tensorflow as tf

from keras_transformer.decoding import score_outputs
from keras_transformer.special_ids import EOS_ID, PAD_ID


class PairScorer(tf.Module):
    """The scoring graph of a `Translator`: strings in, log-probabilities and token counts out."""

    def __init__(self, translator):
        super().__init__(name="pair_scorer")
        self.translator = translator

    def target_ids(self, targets):
        """Targets `[N]` -> output ids `[N, T]`: subwords, then the end token, 0-padded."""
        tokenizer = self.translator.tokenizer
        targets = tf.strings.unicode_transcode(targets, "UTF-8", "UTF-8", errors="replace",
                                               replacement_char=0xFFFD)
        pieces = tokenizer.tokenize(tf.strings.strip(targets))
        eos = tf.fill([tf.shape(targets)[0], 1], tf.constant(EOS_ID, pieces.dtype))
        return tf.concat([pieces, eos], axis=1).to_tensor(default_value=PAD_ID)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.string)])
    def score_strings(self, sources, targets):
        """`(log_probs [N] float32, lengths [N] int32)` of each target given its source."""
        return score_outputs(self.translator.model, self.translator.source_ids(sources), self.target_ids(targets))


# One scoring graph per translator, kept as long as the translator lives.
_SCORERS = weakref.WeakKeyDictionary()


def score_pairs(translator, sources, targets, batch_size=64, normalize=False):
    """log P(target | source) of each pair (a list of float), or per token with `normalize`.

    Raises:
        ValueError: if `sources` and `targets` differ in length, or
            `batch_size` is not a positive integer.
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
    scores = [0.0] * len(sources)
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        log_probs, counts = scorer.score_strings(tf.constant([sources[i] for i in rows], tf.string),
                                                 tf.constant([targets[i] for i in rows], tf.string))
        for row, log_prob, count in zip(rows, log_probs.numpy(), counts.numpy()):
            scores[row] = float(log_prob / count) if normalize else float(log_prob)
    return scores
