"""Inference and serving: from a trained model to translations, scores and exported models (§6.1).

- `translator`: `Translator` (tokenizer + model + beam search in one graph),
  `SavedModelTranslator`, `load_translator`.
- `saved_model`: `export_saved_model`: a SavedModel for TensorFlow Serving,
  strings in, translations out.
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

Models come from a training run directory (`keras_transformer.run_dir`).
"""

from keras_transformer.inference.evaluation import corpus_scores, format_scores
from keras_transformer.inference.saved_model import export_saved_model
from keras_transformer.inference.translator import SavedModelTranslator, Translator, load_translator

__all__ = [
    "SavedModelTranslator",
    "Translator",
    "corpus_scores",
    "export_saved_model",
    "format_scores",
    "load_translator",
]
