"""Inference and serving: from a trained model to translations, scores and exported models (§6.1).

- `translator`: `Translator` (tokenizer + model + beam search in one graph).
- `saved_model_translator`: `SavedModelTranslator`, an export loaded as
  `translate --model` loads it.
- `loading`: `load_translator`, the translator for a path (a run directory, a
  SavedModel or a LiteRT file).
- `sentences`: normalizing and counting the subwords of source sentences, as
  both translators read them.
- `prefixes`: target prefixes (forced starts of translations) as subword ids.
- `batching`: the one batching routine both translators' `translate` use.
- `saved_model`: a SavedModel for TensorFlow Serving, strings in,
  translations out: `export_run`, `reexport`, `export_translator`, and
  `export_saved_model`, which picks one by its source.
- `export_info`: what an export records in `assets/export.json`.
- `export_sources`: the `Translator` each kind of source exports, and
  `DecodingOptions`.
- `export_dirs`: exported versions on disk: listing, reading, and refusing
  unsafe graphs.
- `litert`, `litert_graph`, `litert_text`, `litert_vocab`: one LiteRT
  (`.tflite`) file of the translator (`export_litert`, `LiteRTTranslator`).
- `ensembles`: several models of one vocabulary as one `Ensemble`:
  `load_ensemble`, `ensemble_translator`, `export_ensemble`.
- `signatures`: the exported signatures' names, input and outputs.
- `serving_warmup`: the requests TensorFlow Serving replays when it loads an
  export (`assets.extra/tf_serving_warmup_requests`).
- `ctranslate2`: `export_ctranslate2`: the same weights for CTranslate2.
- `precision`: the dtype policy a model decodes in; `auto_decoding_precision`
  (bfloat16 where the CPU computes it natively, else float32).
- `evaluation`: `corpus_scores`: sacreBLEU, chrF and the lower-cased
  tokenized BLEU of Multi30k papers.
- `attention_maps`: `attention_weights`, `plot_attention` (the paper's
  Figures 3-5).
- `alignments`: word alignments (Pharaoh "i-j") from the encoder-decoder
  attention, in the graph (`align_ids`).

Models come from a training run directory (`keras_transformer.run_dir`).
"""

from keras_transformer.lazy import lazy_exports

# Public names and the module that defines each. They are loaded on first use, so that
# `keras_transformer.inference.precision` (whose choices the command line offers) does
# not pull in the translator, the export and their libraries.
_EXPORTS = {
    "DecodingOptions": "keras_transformer.inference.export_sources",
    "SavedModelTranslator": "keras_transformer.inference.translator",
    "Translator": "keras_transformer.inference.translator",
    "corpus_scores": "keras_transformer.inference.evaluation",
    "ensemble_translator": "keras_transformer.inference.ensembles",
    "export_ensemble": "keras_transformer.inference.ensembles",
    "export_run": "keras_transformer.inference.saved_model",
    "export_saved_model": "keras_transformer.inference.saved_model",
    "export_translator": "keras_transformer.inference.saved_model",
    "format_scores": "keras_transformer.inference.evaluation",
    "load_ensemble": "keras_transformer.inference.ensembles",
    "load_translator": "keras_transformer.inference.loading",
    "reexport": "keras_transformer.inference.saved_model",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
