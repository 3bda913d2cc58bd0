"""Ensembles: models of one vocabulary decoded as one, their log-probabilities averaged at every step.

Two untrained tiny models of the same 400-piece vocabulary (`tiny_run_dir`,
and a smaller one with other random weights), and a third of another
vocabulary. An ensemble of a model with itself must decode exactly as the
model; two different models must combine log-linearly (checked against a
hand computation from each model's own logits); the library, the command
line and the exported SavedModel must give the same translations.
"""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TINY_RUN_MAX_LENGTH, TINY_RUN_VOCAB, new_run_dir

from keras_transformer import Ensemble, Transformer, TransformerConfig, cli
from keras_transformer.data.corpora import read_lines
from keras_transformer.decoding import beam_search, greedy_search, sampling_search
from keras_transformer.errors import ParameterError
from keras_transformer.inference.ensembles import ensemble_translator, load_ensemble
from keras_transformer.inference.export_sources import translator_of_export
from keras_transformer.inference.translator import SavedModelTranslator, Translator
from keras_transformer.run_dir import TOKENIZER_FILENAME, load_run
from keras_transformer.special_ids import BOS_ID, PAD_ID

EXTRA = 5  # max_extra_length: untrained models write to the limit, so a short one keeps the tests fast
SENTENCES = read_lines("test2016", "en")[:5] + [""]


def _write_run(path, config, seed):
    """Writes `path` as a run directory (config.json, model.keras) of a random `config` model."""
    keras.utils.set_random_seed(seed)
    model = Transformer(config)
    model.compile()
    model.save(path / "model.keras")
    (path / "config.json").write_text(
        json.dumps({"model": config.to_dict(), "tokenizer": TOKENIZER_FILENAME, "final_model": "model.keras"})
    )
    return str(path)


@pytest.fixture(scope="module")
def second_run_dir(tiny_run_dir, tmp_path_factory):
    """`tiny_run_dir`'s vocabulary (its spm.model copied), a smaller model with other random weights."""
    path = new_run_dir(tmp_path_factory.mktemp("second"), os.path.join(tiny_run_dir, TOKENIZER_FILENAME))
    config = TransformerConfig.tiny(TINY_RUN_VOCAB, max_length=TINY_RUN_MAX_LENGTH, d_model=32, num_heads=2, d_ff=64)
    return _write_run(path, config, seed=1)


@pytest.fixture(scope="module")
def other_vocabulary_run_dir(tmp_path_factory):
    """A run of another vocabulary of the same size (trained on German only)."""
    from keras_transformer.data.tokenizer import train_tokenizer

    path = tmp_path_factory.mktemp("other")
    train_tokenizer(read_lines("train", "de")[:2000], path / "spm", vocab_size=TINY_RUN_VOCAB)
    return _write_run(path, TransformerConfig.tiny(TINY_RUN_VOCAB, max_length=TINY_RUN_MAX_LENGTH), seed=2)


def _source_ids(model, tokenizer):
    """The source ids of the first sentences, as the translator reads them."""
    return Translator(model, tokenizer).source_ids(tf.constant(SENTENCES[:5]))


SEARCHES = {
    "greedy": lambda model, ids: greedy_search(model, ids, max_extra_length=EXTRA),
    "beam": lambda model, ids: beam_search(model, ids, beam_size=4, max_extra_length=EXTRA),
    "n_best": lambda model, ids: beam_search(model, ids, beam_size=3, max_extra_length=EXTRA, return_all=True),
    "sampling": lambda model, ids: sampling_search(model, ids, seed=7, max_extra_length=EXTRA),
}


def _assert_same_results(expected, got, searches):
    for name in searches:
        (ids, scores), (other_ids, other_scores) = expected[name], got[name]
        np.testing.assert_array_equal(other_ids.numpy(), ids.numpy(), err_msg=name)
        np.testing.assert_allclose(other_scores.numpy(), scores.numpy(), rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_ensemble_of_a_model_with_itself_decodes_as_the_model(tiny_run_dir, dtype):
    model, tokenizer = load_run(tiny_run_dir, dtype=dtype)
    twin, _ = load_run(tiny_run_dir, dtype=dtype)  # loaded twice, as `--model A --model A` does
    ids = _source_ids(model, tokenizer)
    searches = SEARCHES if dtype == "float32" else ("greedy", "beam")
    alone = {name: SEARCHES[name](model, ids) for name in searches}
    together = {name: SEARCHES[name](Ensemble([model, twin]), ids) for name in searches}
    _assert_same_results(alone, together, searches)
    assert alone["greedy"][0].shape[1] > 1  # tokens were generated


def test_weights_one_and_zero_decode_as_the_first_model(tiny_run_dir, second_run_dir):
    (a, tokenizer), (b, _) = load_run(tiny_run_dir), load_run(second_run_dir)
    ids = _source_ids(a, tokenizer)
    searches = ("greedy", "beam")
    for model, weights in ((a, [1, 0]), (b, [0, 3])):
        alone = {name: SEARCHES[name](model, ids) for name in searches}
        _assert_same_results(
            alone, {name: SEARCHES[name](Ensemble([a, b], weights), ids) for name in searches}, searches
        )


def _log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def test_two_models_combine_their_log_probabilities_log_linearly(tiny_run_dir, second_run_dir):
    """Greedy search of the ensemble takes, at every step, the best token of the weighted mean of the members'
    log-probabilities, renormalized; its score sums those log-probabilities."""
    (a, tokenizer), (b, _) = load_run(tiny_run_dir), load_run(second_run_dir)
    ids = _source_ids(a, tokenizer)
    weights = (2 / 3, 1 / 3)
    tokens, scores = greedy_search(Ensemble([a, b], weights=[2, 1]), ids, max_extra_length=EXTRA)
    for model in (a, b):  # not either model's translation
        assert not np.array_equal(greedy_search(model, ids, max_extra_length=EXTRA)[0].numpy(), tokens.numpy())
    # By hand: each member's log-probabilities of the ensemble's output, teacher-forced.
    inputs = tf.concat([tf.fill([tokens.shape[0], 1], BOS_ID), tokens[:, :-1]], axis=1)
    members = [_log_softmax(m.decode(inputs, m.encode(ids), ids).numpy().astype(np.float64)) for m in (a, b)]
    combined = _log_softmax(weights[0] * members[0] + weights[1] * members[1])  # [B, T, V]
    combined[..., PAD_ID] = -np.inf  # never generated
    real = tokens.numpy() != PAD_ID
    chosen = np.take_along_axis(combined, tokens.numpy()[..., None], axis=-1)[..., 0]  # [B, T]
    best = combined.max(axis=-1)
    assert np.all(chosen[real] >= best[real] - 1e-5)  # the best token at every step (up to rounding)
    assert np.all(chosen[:, 0] >= best[:, 0] - 1e-5)  # the first token: the argmax of the combined log-probs
    np.testing.assert_allclose(scores.numpy(), np.where(real, chosen, 0.0).sum(axis=1), rtol=0, atol=1e-4)
    # Probabilities averaged instead (fairseq's combination) would give other scores.
    linear = np.log(weights[0] * np.exp(members[0]) + weights[1] * np.exp(members[1]))
    linear_scores = np.where(real, np.take_along_axis(linear, tokens.numpy()[..., None], axis=-1)[..., 0], 0).sum(1)
    assert np.abs(linear_scores - scores.numpy()).max() > 1e-3


def test_library_command_line_and_saved_model_agree(tiny_run_dir, second_run_dir, tmp_path, capsys):
    models, weights = [tiny_run_dir, second_run_dir], ["2", "1"]
    translator = ensemble_translator(models, weights=[2, 1], max_extra_length=EXTRA)
    assert isinstance(translator.model, Ensemble) and translator.model.weights == (2 / 3, 1 / 3)
    translations, scores = translator.translate(SENTENCES, return_scores=True)
    assert translations[-1] == "" and len(set(translations[:-1])) > 1
    alone = Translator.from_run_dir(tiny_run_dir, max_extra_length=EXTRA).translate(SENTENCES, return_scores=True)
    assert np.abs(np.subtract(alone[1], scores)).max() > 1e-3  # not the first model's translations

    flags = ["--model", tiny_run_dir, "--model", second_run_dir, "--weights", *weights, "--max-extra-length", "5"]
    capsys.readouterr()
    assert cli.main(["translate", *flags, "--no-progress", "--n-best", "1", *SENTENCES]) == 0
    lines = [line.split("\t") for line in capsys.readouterr().out.split("\n")[:-1]]
    assert [text for _, _, text in lines] == translations
    np.testing.assert_allclose([float(score) for _, score, _ in lines], scores, rtol=0, atol=1e-5)

    output = str(tmp_path / "exported")
    assert cli.main(["export", *flags, "--output", output, "--no-warmup"]) == 0
    version = capsys.readouterr().out.strip()
    info = json.loads(open(os.path.join(version, "assets", "export.json")).read())
    members = info["model"]["ensemble"]["members"]
    assert [m["name"] for m in members] == models and [m["weight"] for m in members] == [2 / 3, 1 / 3]
    assert [m["model"]["d_model"] for m in members] == [64, 32] and info["model"]["ensemble"]["combination"]
    served = SavedModelTranslator(version).translate(SENTENCES, return_scores=True)
    assert served[0] == translations
    np.testing.assert_allclose(served[1], scores, rtol=0, atol=1e-5)
    # An ensemble's export is rebuilt as an ensemble (to be exported again, or used as a member).
    rebuilt = translator_of_export(version)
    assert isinstance(rebuilt.model, Ensemble) and rebuilt.model.names == tuple(models)
    assert rebuilt.translate(SENTENCES) == translations


def test_an_ensemble_decodes_in_bfloat16(tiny_run_dir, second_run_dir):
    translator = ensemble_translator([tiny_run_dir, second_run_dir], dtype="bfloat16", max_extra_length=EXTRA)
    assert [m.dtype_policy.name for m in translator.model.members] == ["bfloat16", "bfloat16"]
    translations = translator.translate(SENTENCES)
    assert translations[-1] == "" and all(translations[:-1])


def test_the_models_load_in_the_first_ones_precision(tiny_run_dir, second_run_dir, tmp_path):
    bf16_run = new_run_dir(tmp_path / "bf16", os.path.join(tiny_run_dir, TOKENIZER_FILENAME))
    model, _ = load_run(second_run_dir, dtype="mixed_bfloat16")
    model.save(bf16_run / "model.keras")
    (bf16_run / "config.json").write_text(open(os.path.join(second_run_dir, "config.json")).read())
    ensemble, _ = load_ensemble([str(bf16_run), tiny_run_dir])
    assert [m.dtype_policy.name for m in ensemble.members] == ["mixed_bfloat16", "mixed_bfloat16"]
    with pytest.raises(ParameterError, match="in one precision"):
        Ensemble([model, load_run(tiny_run_dir)[0]])


def test_different_vocabularies_are_refused_naming_both_files(tiny_run_dir, other_vocabulary_run_dir, capsys):
    first = os.path.join(tiny_run_dir, TOKENIZER_FILENAME)
    other = os.path.join(other_vocabulary_run_dir, TOKENIZER_FILENAME)
    with pytest.raises(ParameterError, match="different vocabularies") as raised:
        load_ensemble([tiny_run_dir, other_vocabulary_run_dir])
    assert first in str(raised.value) and other in str(raised.value)
    for argv in (
        ["translate", "--model", tiny_run_dir, "--model", other_vocabulary_run_dir, "A dog."],
        ["export", "--model", tiny_run_dir, "--model", other_vocabulary_run_dir, "--output", "unused"],
    ):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and first in lines[0] and other in lines[0] and "--model" in lines[0], lines


@pytest.mark.parametrize(
    "weights, models, message",
    [
        (["1"], 2, "--weights 1: has 1 values for 2 models"),
        (["1", "2"], 1, "--weights 1 2: has 2 values for 1 models"),
        (["1", "-1"], 2, "--weights 1 -1: must be non-negative"),
        (["0", "0"], 2, "--weights 0 0: are all 0"),
    ],
)
def test_weights_that_do_not_fit_the_models_are_refused(tiny_run_dir, capsys, weights, models, message):
    model_flags = ["--model", tiny_run_dir] * models
    for command in ("translate", "export"):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            extra = ["--output", "unused"] if command == "export" else ["A dog."]
            cli.main([command, *extra, *model_flags, "--weights", *weights])
        assert exit_.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], lines
    with pytest.raises(ParameterError, match="weights"):
        Ensemble([Transformer(TransformerConfig.tiny(10))] * models, [float(w) for w in weights])


def test_a_checkpoint_is_refused_for_an_ensemble(tiny_run_dir, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["translate", "--model", tiny_run_dir, "--model", tiny_run_dir, "--checkpoint", "latest", "x"])
    assert exit_.value.code == 2
    assert "--checkpoint latest: applies to one --model" in capsys.readouterr().err


def test_one_model_is_decoded_alone_and_export_takes_several_positionally(tiny_run_dir):
    from keras_transformer.cli.decoding_options import translator_from_args
    from keras_transformer.cli.model_flag import model_paths

    args = cli.build_parser().parse_args(["translate", "--model", tiny_run_dir, "A dog."])
    assert args.model == tiny_run_dir and args.models == [tiny_run_dir]
    assert type(translator_from_args(args).model) is Transformer  # the model itself: no ensemble around it
    args = cli.build_parser().parse_args(["export", "runs/a", "runs/b", "--output", "out"])
    assert model_paths(args) == ["runs/a", "runs/b"]
    args = cli.build_parser().parse_args(["export", "--model", "runs/a", "--model", "runs/b", "--output", "out"])
    assert model_paths(args) == ["runs/a", "runs/b"]
