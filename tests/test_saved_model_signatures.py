"""SavedModelTranslator: an export that lacks a signature is refused with the option and the export named."""

import types

import pytest

from keras_transformer.errors import ParameterError
from keras_transformer.inference.saved_model_translator import SavedModelTranslator

AGAIN = " (export it again with this version of keras-transformer)."


@pytest.mark.parametrize(
    "call, parameter, message",
    [
        (
            lambda t: t.translate_with_prefix(["a"], ["b"]),
            "target_prefixes",
            "a translate_with_prefix signature" + AGAIN,
        ),
        (lambda t: t.n_best_strings(["a"], 2), "n_best", "a translate_n_best signature."),
        (lambda t: t.aligned_strings(["a"]), "alignments", "a translate_with_alignments signature" + AGAIN),
    ],
)
def test_a_missing_signature_names_the_option_and_the_export(call, parameter, message):
    translator = object.__new__(SavedModelTranslator)
    translator.path, translator._loaded = "/models/m/1", types.SimpleNamespace(signatures={})
    with pytest.raises(ParameterError) as raised:
        call(translator)
    assert raised.value.parameter == parameter
    assert str(raised.value).endswith(f"cannot be given: /models/m/1 was exported without {message}")
