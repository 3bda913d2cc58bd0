"""translate's and evaluate's decoding flags change what they print, as the library's options do.

Each of --beam, --alpha, --early-stopping, --length-penalty, --precision and --checkpoint is run with two values on
a model where the two give different results, and each output is compared with the library's
`Translator` given the same option: a command line that ignored a flag, or passed it on wrongly,
would print the other value's output.

The model is conftest.py's `end_token_run_dir`, where hypotheses of different lengths compete: the
length penalty, the stopping rule and bfloat16 rounding change which hypothesis wins.
"""

import shutil

import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer.data.corpora import read_lines
from keras_transformer.inference.translator import Translator
from keras_transformer.special_ids import EOS_ID

SENTENCES = read_lines("val", "en")[:4]
COMMON = ["--max-extra-length", "10"]
# Each decoding: its flags and the `Translator.from_run_dir` options that mean the same
# ("{checkpoint}": the path of the run's checkpoint, whose weights differ from model.keras).
DECODINGS = {
    "default": ([], {}),
    "beam 1": (["--beam", "1"], dict(beam_size=1)),
    "alpha 2": (["--alpha", "2"], dict(alpha=2.0)),
    "alpha 2, k_finished": (
        ["--alpha", "2", "--early-stopping", "k_finished"],
        dict(alpha=2.0, early_stopping="k_finished"),
    ),
    "alpha 1": (["--alpha", "1"], dict(alpha=1.0)),
    "alpha 1, average": (["--alpha", "1", "--length-penalty", "average"], dict(alpha=1.0, length_penalty="average")),
    "bfloat16": (["--precision", "bfloat16"], dict(dtype="bfloat16")),
    "checkpoint": (["--checkpoint", "{checkpoint}"], dict(checkpoint="{checkpoint}")),
}
# Each flag, with the two decodings that differ by its value alone.
FLAGS = {
    "--beam": ("default", "beam 1"),
    "--alpha": ("default", "alpha 2"),
    "--early-stopping": ("alpha 2", "alpha 2, k_finished"),
    "--length-penalty": ("alpha 1", "alpha 1, average"),
    "--precision": ("default", "bfloat16"),
    "--checkpoint": ("default", "checkpoint"),
}


@pytest.fixture(scope="module")
def run_dir(end_token_run_dir, tmp_path_factory):
    """The end-token run of conftest.py, and a checkpoint whose end row is half as long."""
    from keras_transformer.run_dir import load_run

    path = tmp_path_factory.mktemp("decoding_flags") / "run"
    shutil.copytree(end_token_run_dir, path)
    model, _ = load_run(str(path))
    weights = model.output_projection.embeddings.numpy()
    weights[EOS_ID] *= 0.5
    model.output_projection.embeddings.assign(weights)
    (path / "checkpoints").mkdir()
    model.save_weights(path / "checkpoints" / "ckpt-00000010.weights.h5")
    return str(path)


def _filled(value, run_dir):
    return value.replace("{checkpoint}", f"{run_dir}/checkpoints/ckpt-00000010.weights.h5")


@pytest.fixture(scope="module")
def library(run_dir):
    """The best translation and score of each sentence by `Translator`, per decoding (computed once)."""
    cache = {}

    def best(decoding):
        if decoding not in cache:
            options = {k: _filled(v, run_dir) if isinstance(v, str) else v for k, v in DECODINGS[decoding][1].items()}
            translator = Translator.from_run_dir(run_dir, max_extra_length=10, **options)
            cache[decoding] = [n_best[0] for n_best in translator.translate(SENTENCES, n_best=1)]
        return cache[decoding]

    return best


@pytest.fixture(scope="module")
def translate_outputs():
    return {}


def _translate(run_dir, decoding, capsys, outputs):
    """translate --n-best 1 with the decoding's flags: `(translation, score)` per sentence (computed once)."""
    if decoding not in outputs:
        flags = [_filled(flag, run_dir) for flag in DECODINGS[decoding][0]]
        assert cli.main(["translate", "--model", run_dir, *COMMON, "--n-best", "1", *flags, *SENTENCES]) == 0
        lines = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
        assert [int(index) for index, _, _ in lines] == list(range(len(SENTENCES)))
        outputs[decoding] = [(text, float(score)) for _, score, text in lines]
    return outputs[decoding]


def _assert_same(printed, expected, what):
    assert [text for text, _ in printed] == [text for text, _ in expected], what
    np.testing.assert_allclose([s for _, s in printed], [s for _, s in expected], rtol=1e-5, err_msg=what)


@pytest.mark.parametrize("flag", FLAGS)
def test_translate_prints_what_the_library_gives_with_each_value_of_the_flag(
    run_dir, library, translate_outputs, capsys, flag
):
    printed = {}
    for decoding in FLAGS[flag]:
        printed[decoding] = _translate(run_dir, decoding, capsys, translate_outputs)
        _assert_same(printed[decoding], library(decoding), decoding)
    first, second = (printed[decoding] for decoding in FLAGS[flag])
    assert [text for text, _ in first] != [text for text, _ in second], flag  # the flag changes translations
    assert not np.allclose([s for _, s in first], [s for _, s in second], rtol=1e-5), flag  # and scores


@pytest.mark.parametrize("flag", FLAGS)
def test_evaluate_translates_as_the_library_does_with_the_flag(run_dir, library, tmp_path, capsys, flag):
    """evaluate --output writes the library's translations with the flag's second value, which differ from
    those with its first: an evaluate that ignored the flag would write the first value's."""
    source = tmp_path / "src.txt"
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    output = tmp_path / "hypotheses.txt"
    first, second = FLAGS[flag]
    flags = [_filled(value, run_dir) for value in DECODINGS[second][0]]
    argv = ["evaluate", "--model", run_dir, *COMMON, "--src", str(source), "--ref", str(source), "--no-progress"]
    assert cli.main([*argv, "--output", str(output), *flags]) == 0
    capsys.readouterr()
    written = output.read_text(encoding="utf-8").splitlines()
    assert written == [text for text, _ in library(second)]
    assert written != [text for text, _ in library(first)]
