"""Text in, text out: tokenizer + Transformer + beam search in one TensorFlow graph.

`Translator` is a `tf.Module` whose `translate_strings` is a `tf.function`
from a batch of sentences to translations and scores. The same function is
what `keras_transformer.inference.saved_model` saves for TensorFlow Serving, so a served
model answers exactly as the in-process one.

Defined answers for awkward input (no crash, no hang):

- sentences are normalized as training files are read (`normalize_in_graph`:
  runs of spaces and tabs inside become one space, whitespace at the ends,
  Unicode's too, is dropped; and a leading byte-order mark), so a served
  model translates a line as `translate --input FILE` does;
- an empty or blank sentence gets an empty translation and score 0;
- invalid UTF-8 bytes are replaced by U+FFFD before tokenization;
- a sentence longer than the model's `max_length` tokens is truncated (its
  output is then bounded by `max_length + max_extra_length`); before that,
  a sentence is cut to `max_input_bytes` bytes (by default 64 per token the
  model reads, more than SentencePiece's longest piece of 16 characters
  takes), so that one huge request costs no more time or memory than the
  longest sentence the model reads;
- an empty batch gives empty outputs;
- and a clear error, not a crash inside the graph, for what is not a batch
  of sentences: more than `max_batch_size` (1024) sentences in one call,
  or an input that is not a vector of strings (a scalar, a matrix, numbers;
  refused by the signature `tf.string [None]` before the graph runs).
"""

import logging

import tensorflow as tf

from keras_transformer import decoding
from keras_transformer.decoding.defaults import (
    DEFAULT_ALPHA,
    DEFAULT_BEAM_SIZE,
    DEFAULT_EARLY_STOPPING,
    DEFAULT_LENGTH_PENALTY,
    DEFAULT_TRANSLATE_BATCH_SIZE,
    DEFAULT_TRANSLATE_WORKERS,
    EXTRA_OUTPUT_LENGTH,
    check_alpha,
    check_early_stopping,
    check_length_penalty,
)
from keras_transformer.decoding.prefixes import prefix_lengths
from keras_transformer.decoding.tokens import output_limits
from keras_transformer.errors import ParameterError
from keras_transformer.inference.alignments import align_ids, alignment_layer_index
from keras_transformer.inference.batching import translate_in_batches
from keras_transformer.inference.saved_model_translator import (  # noqa: F401  (their home before)
    SavedModelTranslator,
    is_saved_model,
    resolve_saved_model_dir,
)
from keras_transformer.inference.sentences import checked_request, count_source_pieces
from keras_transformer.inference.sentences import normalized as normalized_sentences
from keras_transformer.inference.signatures import INPUT_NAME, PREFIX_INPUT_NAME
from keras_transformer.special_ids import EOS_ID, PAD_ID

logger = logging.getLogger(__name__)

# The most sentences one call of `translate_strings` (one serving request) takes; more is an error.
MAX_BATCH_SIZE = 1024

# A sentence is cut to this many bytes per token the model reads (`max_input_length`) before it is
# tokenized: SentencePiece's longest piece is 16 characters of at most 4 bytes.
BYTES_PER_TOKEN = 64


class Translator(tf.Module):
    """Translates sentences with a trained `Transformer` and its `Tokenizer` (§6.1 decoding).

    Args:
        model: the `Transformer`.
        tokenizer: the `Tokenizer` the model was trained with.
        beam_size: K; 4 in the paper. 1 decodes greedily.
        alpha: length penalty; 0.6 in the paper.
        max_extra_length: output may be this many tokens longer than the
            source (50 in the paper).
        max_input_length: longest source in tokens (EOS included); longer
            ones are truncated. Default: the model's `config.max_length`, also
            its upper bound for a model with learned positions.
        jit_compile: compile the search with XLA.
        early_stopping: "exact" (default) or "k_finished", see
            `keras_transformer.decoding.beam_search`.
        length_penalty: "gnmt" (default: divide log P by ((5 + |Y|) / 6) ** alpha, §6.1)
            or "average" (by |Y| ** alpha, as fairseq and CTranslate2 do).
        sampling: `dict(top_k=..., temperature=..., seed=...)` to sample
            (`decoding.sampling_search`) instead of searching.
        max_batch_size: the most sentences one `translate_strings` call (one
            serving request) takes: more is an InvalidArgumentError naming
            the limit, not an out-of-memory crash (default 1024).
        no_repeat_ngram_size: N > 0: no translation repeats an N-gram of
            subwords (n-gram blocking, in every search: see
            `keras_transformer.decoding.beam_search`); 0 (default): off.
        max_input_bytes: a sentence is cut to its first this many bytes (a
            character cut in two dropped) before it is normalized and
            tokenized, so the work per sentence is bounded whatever its
            size. Default: `BYTES_PER_TOKEN` (64) times `max_input_length`.
        alignment_layer: the decoder layer whose encoder-decoder attention
            gives the word alignments (`translate(..., alignments=True)`,
            `translate_with_alignments`; `inference.alignments`): -1 (default)
            the last, as fairseq's; negative counts from the last.

    Attributes:
        search: the search as a `tf.function`, source ids `[B, S]` ->
            `(token_ids, scores)` (`keras_transformer.decoding.make_decode_fn`);
            its scores are raw from the search (log P for greedy).
        search_with_prefix: the same search of `(source_ids, target_prefix)`
            (`translate_with_prefix`).
        output_length_cap: the model's position table size with learned
            positions, which no output exceeds; None with sinusoidal ones.

    Example:
        An untrained tiny model, so its words are random; for a trained one,
        `Translator.from_run_dir("runs/multi30k")` loads the final model and
        vocabulary of a training run directory.

    >>> import tempfile
    >>> from keras_transformer import Transformer, TransformerConfig
    >>> from keras_transformer.data.corpora import read_lines
    >>> from keras_transformer.data.tokenizer import train_tokenizer
    >>> texts = read_lines("train", "en")[:500]  # the vendored Multi30k
    >>> tokenizer = train_tokenizer(texts, tempfile.mkdtemp() + "/spm", vocab_size=400)
    >>> model = Transformer(TransformerConfig.tiny(vocab_size=400))
    >>> translator = Translator(model, tokenizer, beam_size=4, alpha=0.6, max_extra_length=5)
    >>> translations, scores = translator.translate(["A dog runs on the beach.", "  "], return_scores=True)
    >>> len(translations), type(translations[0]).__name__, translations[1], scores[1]  # a blank input: "" and 0
    (2, 'str', '', 0.0)
    """

    def __init__(
        self,
        model,
        tokenizer,
        beam_size=DEFAULT_BEAM_SIZE,
        alpha=DEFAULT_ALPHA,
        max_extra_length=EXTRA_OUTPUT_LENGTH,
        max_input_length=None,
        jit_compile=False,
        early_stopping=DEFAULT_EARLY_STOPPING,
        length_penalty=DEFAULT_LENGTH_PENALTY,
        sampling=None,
        max_batch_size=MAX_BATCH_SIZE,
        no_repeat_ngram_size=0,
        max_input_bytes=None,
        alignment_layer=-1,
        name="translator",
    ):
        super().__init__(name=name)
        self.max_batch_size = int(max_batch_size)
        self.model = model
        self.tokenizer = tokenizer
        self.beam_size = int(beam_size)
        # Checked whatever the search: greedy search and sampling divide their scores by the length penalty too.
        self.alpha = check_alpha(alpha)
        self.max_extra_length = int(max_extra_length)
        self.early_stopping = check_early_stopping(early_stopping)
        self.length_penalty = check_length_penalty(length_penalty)
        self.no_repeat_ngram_size = no_repeat_ngram_size
        alignment_layer_index(model, alignment_layer)  # refused now, not at the first alignment
        self.alignment_layer = alignment_layer
        self.max_input_length = int(max_input_length or model.config.max_length)
        if self.max_input_length < 2:
            raise ValueError(f"max_input_length must be at least 2, got {self.max_input_length}.")
        if model.config.positional_encoding == "learned" and self.max_input_length > model.config.max_length:
            # Learned positions have no embedding past the table: a longer source would fail in the graph.
            raise ValueError(
                f"max_input_length {self.max_input_length} exceeds the model's max_length "
                f"{model.config.max_length}, the size of its learned position table."
            )
        self.max_input_bytes = int(max_input_bytes or BYTES_PER_TOKEN * self.max_input_length)
        if isinstance(max_input_bytes, bool) or self.max_input_bytes < 1:
            raise ParameterError("max_input_bytes", f"must be a positive integer, got {max_input_bytes!r}.")
        self.output_length_cap = model.config.max_length if model.config.positional_encoding == "learned" else None
        self.sampling = dict(sampling) if sampling else None
        options = dict(max_extra_length=self.max_extra_length, no_repeat_ngram_size=no_repeat_ngram_size)
        if self.sampling:
            method, options = "sampling", dict(**self.sampling, **options)
        elif self.beam_size == 1:
            method = "greedy"
        else:
            method = "beam"
            options.update(
                beam_size=self.beam_size, alpha=self.alpha, early_stopping=early_stopping, length_penalty=length_penalty
            )
        self.search = decoding.make_decode_fn(model, method, jit_compile=jit_compile, **options)
        self.search_with_prefix = decoding.make_decode_fn(
            model, method, jit_compile=jit_compile, with_target_prefix=True, **options
        )
        self._search_all = {}  # every beam, for n-best lists, without and with prefixes: built on first use
        self._aligned = {}  # with alignments, for n-best lists or prefixes: built on first use
        self._jit_compile = jit_compile

    # In-graph -------------------------------------------------------------------

    # Sentences `[N]` as the training data was read (`sentences.normalized`).
    normalized = staticmethod(normalized_sentences)

    def bounded(self, inputs):
        """Sentences `[N]` cut to their first `max_input_bytes` bytes, a character cut in two dropped.

        Before anything else reads them (normalization, tokenization), so that
        their cost does not grow with what a request sends.
        """
        head = tf.strings.unicode_transcode(
            tf.strings.substr(inputs, 0, self.max_input_bytes), "UTF-8", "UTF-8", errors="replace"
        )
        cut = tf.strings.length(inputs) > self.max_input_bytes
        return tf.where(cut, tf.strings.regex_replace(head, "\ufffd+$", ""), inputs)

    def source_pieces(self, sentences):
        """The subword count of each sentence (a list of str) as `source_ids` reads it, before truncation."""
        return count_source_pieces(self.tokenizer, sentences)

    def source_ids(self, sentences):
        """Sentences `[N]` -> 0-padded source ids `[N, S]`: `normalized`, subwords, truncated, then EOS."""
        return self._ids_of_normalized(self.normalized(sentences))

    def _ids_of_normalized(self, sentences):
        """`source_ids` of sentences `normalized` already."""
        pieces = self.tokenizer.tokenize(sentences)[:, : self.max_input_length - 1]
        eos = tf.fill([tf.shape(sentences)[0], 1], tf.constant(EOS_ID, pieces.dtype))
        return tf.concat([pieces, eos], axis=1).to_tensor(default_value=PAD_ID)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=INPUT_NAME)])
    def translate_strings(self, inputs):
        """`inputs` tf.string `[N]` -> `{"translations": tf.string [N], "scores": float32 [N]}`.

        A score is `log P(Y | X) / lp(|Y|)`, `lp` the translator's length
        penalty (`decoding.length_penalty`: GNMT's `((5 + |Y|) / 6) ** alpha`
        by default, §6.1, or `|Y| ** alpha` for "average"), |Y| counting the
        generated tokens with the end token, for every beam size (greedy
        too); 0 for a blank input.
        """
        return self._translations(inputs)

    @tf.function(
        input_signature=[
            tf.TensorSpec([None], tf.string, name=INPUT_NAME),
            tf.TensorSpec([None], tf.string, name=PREFIX_INPUT_NAME),
        ]
    )
    def translate_with_prefix(self, inputs, target_prefixes):
        """`translate_strings` where each translation starts with its target prefix (tf.string `[N]`, "": none).

        A prefix is read as a source sentence is (`bounded`, `normalized`,
        SentencePiece's subwords), without an end token, and its subwords are
        forced (`decoding.beam_search`'s `target_prefix`; not in the paper);
        the search continues them. A score is the whole translation's,
        prefix included. A blank input still gets "" and 0. A prefix longer
        than its translation may be (source subwords + end token +
        `max_extra_length`), or a count of prefixes other than of inputs, is
        an InvalidArgumentError.
        """
        return self._translations(inputs, target_prefixes)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=INPUT_NAME)])
    def translate_with_alignments(self, inputs):
        """`translate_strings`, and the word alignment of each translation with its input.

        Returns `{"translations", "scores", "alignments"}`, the last tf.string
        `[N]` in Pharaoh format ("0-0 1-2 2-1": source word i, target word j,
        0-based, sorted by j; `inference.alignments`), from the
        encoder-decoder attention of decoder layer `alignment_layer`, averaged
        over the heads; "" for a blank input. The translations and scores
        are `translate_strings`'.
        """
        return self._translations(inputs, alignments=True)

    def _translations(self, inputs, target_prefixes=None, alignments=False):
        """`translate_strings` (`target_prefixes` None) or `translate_with_prefix`, with `alignments` or without, in
        the graph."""
        inputs = checked_request(inputs, self.max_batch_size, target_prefixes)
        sentences = self.normalized(self.bounded(inputs))
        blank = tf.equal(tf.strings.length(sentences), 0)
        search = self.search if target_prefixes is None else self.search_with_prefix

        def run():
            source_ids, token_ids, scores = self._searched(search, sentences, blank, target_prefixes)
            if self.beam_size == 1 or self.sampling:
                # Greedy search and sampling give log P; every score is log P / lp(|Y|), as beam search's.
                lengths = tf.reduce_sum(tf.cast(tf.not_equal(token_ids, PAD_ID), tf.int32), axis=-1)
                scores = scores / decoding.length_penalty(lengths, self.alpha, self.length_penalty)
            outputs = (self.tokenizer.detokenize(token_ids), scores)
            return (*outputs, self._alignments(source_ids, token_ids)) if alignments else outputs

        def nothing():
            outputs = (tf.zeros([0], tf.string), tf.zeros([0], tf.float32))
            return (*outputs, tf.zeros([0], tf.string)) if alignments else outputs

        results = tf.cond(tf.size(inputs) > 0, run, nothing)
        answer = {"translations": tf.where(blank, "", results[0]), "scores": tf.where(blank, 0.0, results[1])}
        if alignments:
            answer["alignments"] = tf.where(blank, "", results[2])
        return answer

    def _alignments(self, source_ids, token_ids):
        """The Pharaoh alignments `[B]` of the sources and their translations (`alignments.align_ids`)."""
        return align_ids(self.model, self.tokenizer, source_ids, token_ids, self.alignment_layer)

    def _searched(self, search, sentences, blank, target_prefixes):
        """`(source_ids, token_ids, scores)`: the `search` of `sentences` (`normalized`), of them and their
        `target_prefixes` (tf.string `[N]`) unless None."""
        source_ids = self._ids_of_normalized(sentences)
        if target_prefixes is None:
            return (source_ids, *search(source_ids))
        prefixes = self.normalized(self.bounded(target_prefixes))
        prefix_ids = tf.cast(self.tokenizer.tokenize(prefixes).to_tensor(default_value=PAD_ID), tf.int32)  # [N, P]
        prefix_ids = tf.where(blank[:, None], PAD_ID, prefix_ids)  # a blank input's translation stays ""
        # Checked here, not only in the search, which skips its checks under XLA.
        _, limits = output_limits(self.model, source_ids, None, self.max_extra_length)
        fits = tf.debugging.assert_less_equal(
            prefix_lengths(prefix_ids),
            limits,
            message="keras_transformer: a target prefix has more subwords than its input's translation may have "
            f"(the input's subwords and end token + max_extra_length {self.max_extra_length})",
        )
        with tf.control_dependencies([fits]):
            return (source_ids, *search(source_ids, tf.identity(prefix_ids)))

    def n_best_strings(self, inputs, n_best, target_prefixes=None):
        """`inputs` tf.string `[N]` -> the `n_best` best translations of each, best first.

        Returns `{"translations": tf.string [N, n_best], "scores": float32 [N, n_best]}`
        (scores as `translate_strings`'); a blank input gets `n_best` empty
        translations scored 0, and an entry no hypothesis fills (a prefix as
        long as the output leaves one) is "" scored -1e9. Beam search with
        `return_all=True`: a sentence
        stops only when no alive hypothesis can beat its `beam_size`-th
        finished one (with `early_stopping="exact"`, the default, each of the
        n is then exact). At beam size 1 the one best is `translate_strings`'
        greedy translation. `target_prefixes`: as `translate_with_prefix`'s;
        each of the n starts with its prefix.
        """
        self._n_best_search(n_best, target_prefixes is not None)
        return self._n_best_graph(inputs, n_best, target_prefixes)

    def _n_best_search(self, n_best, prefixed):
        """The beam search of every hypothesis (`return_all`), built on first use, once `n_best` is one it gives."""
        if not 1 <= n_best <= self.beam_size or self.sampling:
            raise ParameterError(
                "n_best", f"must be between 1 and the beam size {self.beam_size} (and no sampling), got {n_best}."
            )
        if self.beam_size == 1:
            return None  # `_n_best_graph` gives the translation's greedy search
        if prefixed not in self._search_all:
            self._search_all[prefixed] = decoding.make_decode_fn(
                self.model,
                "beam",
                jit_compile=self._jit_compile,
                with_target_prefix=prefixed,
                beam_size=self.beam_size,
                alpha=self.alpha,
                early_stopping=self.early_stopping,
                length_penalty=self.length_penalty,
                max_extra_length=self.max_extra_length,
                no_repeat_ngram_size=self.no_repeat_ngram_size,
                return_all=True,
            )
        return self._search_all[prefixed]

    def _n_best_graph(self, inputs, n_best, target_prefixes=None, alignments=False):
        if self.beam_size == 1:
            # The translation itself, as greedy search gives it: a beam of one that searched on past its
            # first end token (`return_all`) could find another.
            answer = self._translations(inputs, target_prefixes, alignments)
            return {key: value[:, None] for key, value in answer.items()}
        inputs = checked_request(inputs, self.max_batch_size, target_prefixes)
        sentences = self.normalized(self.bounded(inputs))
        blank = tf.equal(tf.strings.length(sentences), 0)
        search = self._search_all[target_prefixes is not None]

        def run():
            source_ids, token_ids, scores = self._searched(search, sentences, blank, target_prefixes)  # [N, K, L]
            token_ids, scores = token_ids[:, :n_best], scores[:, :n_best]
            shape = tf.shape(token_ids)
            rows = tf.reshape(token_ids, [shape[0] * shape[1], shape[2]])
            # Beam search (for every beam size, 1 too) already gives log P / lp(|Y|).
            outputs = (tf.reshape(self.tokenizer.detokenize(rows), [shape[0], shape[1]]), scores)
            if not alignments:
                return outputs
            aligned = self._alignments(tf.repeat(source_ids, shape[1], axis=0), rows)
            return (*outputs, tf.reshape(aligned, [shape[0], shape[1]]))

        def nothing():
            outputs = (tf.zeros([0, n_best], tf.string), tf.zeros([0, n_best], tf.float32))
            return (*outputs, tf.zeros([0, n_best], tf.string)) if alignments else outputs

        results = tf.cond(tf.size(inputs) > 0, run, nothing)
        blank = blank[:, None]  # [N, 1]
        answer = {"translations": tf.where(blank, "", results[0]), "scores": tf.where(blank, 0.0, results[1])}
        if alignments:
            answer["alignments"] = tf.where(blank, "", results[2])
        return answer

    def aligned_strings(self, inputs, n_best=None, target_prefixes=None):
        """`translate_with_alignments`, also for the `n_best` best translations or with `target_prefixes`.

        Returns the outputs of `translate_with_alignments` (of
        `n_best_strings`, `[N, n_best]` each, with `n_best`); `n_best` and
        `target_prefixes` as `n_best_strings`' and `translate_with_prefix`'s.
        Each combination is one `tf.function`, built on first use.
        """
        prefixed = target_prefixes is not None
        if n_best is not None:
            self._n_best_search(n_best, prefixed)
        elif not prefixed:
            return self.translate_with_alignments(inputs)
        if (n_best, prefixed) not in self._aligned:
            if n_best is None:
                function = lambda inputs, prefixes: self._translations(inputs, prefixes, alignments=True)  # noqa: E731
            else:
                function = lambda inputs, prefixes=None: self._n_best_graph(  # noqa: E731
                    inputs, n_best, prefixes, alignments=True
                )
            specs = [tf.TensorSpec([None], tf.string)] * (2 if prefixed else 1)
            self._aligned[n_best, prefixed] = tf.function(function, input_signature=specs)
        return self._aligned[n_best, prefixed](inputs, *([target_prefixes] if prefixed else []))

    # Python convenience ---------------------------------------------------------------

    def translate(
        self,
        sentences,
        batch_size=DEFAULT_TRANSLATE_BATCH_SIZE,
        progress=False,
        return_scores=False,
        workers=DEFAULT_TRANSLATE_WORKERS,
        n_best=None,
        target_prefixes=None,
        alignments=False,
    ):
        """Translates a list of `str`, batching sentences of similar length (`inference.batching`).

        Args:
            sentences: list of str.
            batch_size: the most sentences per decoding call (default
                `DEFAULT_TRANSLATE_BATCH_SIZE`); the sentences are cut into
                batches as even as that allows, their number a multiple of
                `workers`, each round of `workers` batches dealt sentences
                of the same lengths (`batching.even_batches`).
            progress: show a progress bar on stderr.
            return_scores: also return the list of scores.
            workers: batches decoded at the same time (threads): a decoding
                step is a chain of small ops that leaves cores idle. Results
                do not depend on it, nor on `batch_size`, except samples
                (`sampling`): a seeded sample depends on its batch.
            n_best: None for one translation per sentence; N (at most the
                beam size) for the N best of each, best first, as lists of
                `(translation, score)` (`return_scores` is then implied).
            target_prefixes: None, or one str per sentence ("" or None: none):
                each translation starts with its prefix and the search
                continues it (`translate_with_prefix`; the caveat of a prefix
                that ends inside a word: `inference.prefixes`).
            alignments: also return the word alignment of each translation
                with its sentence, a Pharaoh str ("0-0 1-2 2-1";
                `translate_with_alignments`), last; with `n_best`, triples
                `(translation, score, alignment)`.

        Returns:
            The translations (a list of str, or of N-lists with `n_best`),
            with `return_scores` the list of scores, with `alignments` the
            list of alignments.

        Raises:
            ParameterError: as `batching.translate_in_batches`; for
                `target_prefixes`, a count other than of the sentences or a
                prefix longer than its translation may be.
        """
        return translate_in_batches(
            self, sentences, batch_size, progress, return_scores, workers, n_best, target_prefixes, alignments
        )

    @classmethod
    def from_run_dir(cls, run_dir, dtype=None, checkpoint=None, **options):
        """A translator for the final model of a training run directory.

        `dtype`: decode under this dtype policy ("float32", "bfloat16",
        "mixed_bfloat16", "mixed_float16", or "auto":
        `inference.precision.auto_decoding_precision`);
        default the final model's own (float32: training saves it so). `checkpoint`: a
        checkpoint (or averaged weights) path, or "latest", instead of the
        final `model.keras`.
        """
        from keras_transformer.inference.precision import resolve_decoding_precision
        from keras_transformer.run_dir import load_run

        model, tokenizer = load_run(run_dir, checkpoint=checkpoint, dtype=resolve_decoding_precision(dtype)[0])
        return cls(model, tokenizer, **options)
