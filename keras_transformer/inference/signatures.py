"""The names an exported SavedModel's clients use: its signatures, their inputs and outputs.

    signature "serving_default"        inputs tf.string [None] -> translations tf.string [None], scores float32 [None]
    signature "translate_with_prefix"  inputs, target_prefixes tf.string [None] each -> as "serving_default";
                                       each translation starts with its prefix ("" for none)
    signature "translate_n_best"       (with `export --n-best N`) -> [None, N] each, best first
    signature "translate_with_alignments"  inputs -> as "serving_default", and alignments tf.string [None]
                                       (Pharaoh "i-j ...", `inference.alignments`)

Defined here once for the export (`saved_model`) and for the warm-up requests
written beside it (`serving_warmup`).
"""

SIGNATURE_NAME = "serving_default"
N_BEST_SIGNATURE_NAME = "translate_n_best"  # with n_best: the N best translations of each input
PREFIX_SIGNATURE_NAME = "translate_with_prefix"  # sentences and their target prefixes
ALIGNMENT_SIGNATURE_NAME = "translate_with_alignments"  # the translations and their word alignments
INPUT_NAME = "inputs"
PREFIX_INPUT_NAME = "target_prefixes"
OUTPUT_NAMES = ("translations", "scores")
ALIGNMENT_OUTPUT_NAME = "alignments"
