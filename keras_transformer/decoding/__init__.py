"""Greedy and beam search decoding (Vaswani et al., 2017, §6.1).

    "we used beam search with a beam size of 4 and length penalty alpha = 0.6
    [...] We set the maximum output length during inference to input length
    + 50, but terminate early when possible."  (§6.1)

The length penalty is GNMT's (Wu et al., 2016, "Google's Neural Machine
Translation System", §7, eq. 14):

    score(Y) = log P(Y | X) / lp(Y),    lp(Y) = ((5 + |Y|) / 6) ** alpha

where |Y| counts the generated tokens, the end token included. (GNMT's
coverage penalty is not used, as in the paper's tensor2tensor setup.)
`beam_search(..., length_penalty="average")` divides by |Y| ** alpha instead,
as fairseq and CTranslate2 do (not the paper's; for their recipes).

Public API:

- `greedy_search(model, source_ids, ...)` -> `(token_ids [B, L], scores [B])`
- `beam_search(model, source_ids, ...)` -> `(token_ids [B, L], scores [B])`,
  or `([B, K, L], [B, K])` best first with `return_all=True`
- `make_decode_fn(model, method, jit_compile, **options)`: a `tf.function`
  over int32 `source_ids [None, None]`, ready for a SavedModel.
- `sampling_search(model, source_ids, temperature, top_k, seed)`: random
  sampling (back-translation), reproducible with a seed.
- `score_outputs(model, source_ids, output_ids)`: forced decoding, the
  log-probability of given outputs.
- `target_prefix=` (each search, and `make_decode_fn(..., with_target_prefix=True)`):
  outputs that start with given tokens, the search continuing them
  (`keras_transformer.decoding.prefixes`; not in the paper).
- `length_penalty(length, alpha, kind)`: "gnmt" (the default) or "average".

Everything runs as one TensorFlow graph: a `tf.while_loop` (whose loop
variables keep a fixed shape under XLA), so the search can be exported in a
SavedModel and compiled with XLA (`jit_compile=True`). Called eagerly, the functions
build (once per model and options) and run such a graph.

Shape letters: B batch, K beam size, S source length, L output buffer length
(`max_length`, or S + 50), V vocabulary, N heads, H per-head width.

Incremental decoding (the default, `use_cache=True`): the source is encoded
once (in a plain graph, in length-sorted chunks of sentences, each cut to its
longest sentence: `keras_transformer.decoding.encoding`) and the
cross-attention keys/values are projected once per sentence
(`model.init_cache`), never copied per hypothesis. Each step feeds the K
hypotheses' last tokens to `model.decode_step` side by side, as K "positions"
of their sentence (`[B, K]`, all at output position i): the K queries attend
to the sentence's one copy of the source, and their self-attention
keys/values fill K new slots of the cache (slot `i*K + k` holds step i of
the hypothesis that was k-th at step i). Under XLA the cache is preallocated
(`[B, N, L*K, H]`, static shapes) and written in place; in a plain graph
(eager calls, SavedModel, TF Serving) it starts empty and grows by K slots
per step, so a step copies and attends over the slots in use only, not the
whole buffer. The cache is never reordered when beams change: each
hypothesis keeps its ancestry (`[B, K, L]`, the slot of each of its earlier
steps), and a mask lets it see only those slots. At step 0 the K hypotheses
of a sentence are all the start token: in a plain graph that step computes
one row per sentence and copies it K times; with exact stopping, alive
hypotheses that can no longer change the result are not projected to the
vocabulary (see `beam_search`). `use_cache=False` is the
slow reference that reruns `model.decode` over the whole prefix at every
step.

The model only needs `encode`, `decode`, `init_cache` and `decode_step` (see
`keras_transformer.model.Transformer`), so tests can pass a stand-in; one
without `compute_dtype` and `config.d_model` has its batch encoded whole.
"""

from keras_transformer.lazy import lazy_exports

# Public names and the module that defines each. They are loaded on first use, so that
# `keras_transformer.decoding.defaults` (whose values the command line's flags show) does not
# load TensorFlow: `keras-transformer COMMAND --help` answers without it.
_EXPORTS = {
    "DEFAULT_ALPHA": "keras_transformer.decoding.defaults",
    "DEFAULT_BEAM_SIZE": "keras_transformer.decoding.defaults",
    "DEFAULT_EARLY_STOPPING": "keras_transformer.decoding.defaults",
    "DEFAULT_LENGTH_PENALTY": "keras_transformer.decoding.defaults",
    "EARLY_STOPPING": "keras_transformer.decoding.defaults",
    "LENGTH_PENALTIES": "keras_transformer.decoding.defaults",
    "EXTRA_OUTPUT_LENGTH": "keras_transformer.decoding.defaults",
    "NEG_INF": "keras_transformer.decoding.defaults",
    "beam_search": "keras_transformer.decoding.search",
    "greedy_search": "keras_transformer.decoding.search",
    "length_penalty": "keras_transformer.decoding.loops",
    "make_decode_fn": "keras_transformer.decoding.search",
    "sampling_search": "keras_transformer.decoding.search",
    "score_outputs": "keras_transformer.decoding.scoring",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
