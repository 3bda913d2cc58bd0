"""The translate, evaluate and attention commands on a run directory (translate on a SavedModel too).

`translate` is also run as a real process, with pipes and with terminals, to check that its
stdout holds the translations and nothing else (the progress bar goes to stderr).
"""

import argparse
import io
import json
import os
import pty
import select
import shutil
import subprocess
import sys
import termios
import time

import matplotlib.pyplot as plt
import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer.data.corpora import newstest2014_path, read_newstest2014
from keras_transformer.inference.evaluation import corpus_scores
from keras_transformer.inference.translator import Translator

CLI = [sys.executable, "-m", "keras_transformer.cli"]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
# An empty line among them: it gets an empty line out.
SENTENCES = ["A dog runs on the beach.", "", "Two men are talking.", "Ein Mädchen läuft über die Straße."]


def run_cli(argv, capsys, stdin=None, monkeypatch=None):
    if stdin is not None:
        set_stdin(monkeypatch, stdin)
    assert cli.main(argv) == 0
    return capsys.readouterr()


def set_stdin(monkeypatch, data):
    """Standard input holding `data` (str: as UTF-8), with the `buffer` of bytes that translate reads."""
    data = data.encode("utf-8") if isinstance(data, str) else data
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_translate_arguments_and_stdin(tiny_run_dir, capsys, monkeypatch):
    expected = Translator.from_run_dir(tiny_run_dir, max_extra_length=3).translate(["A dog runs.", "Two men talk."])
    out = run_cli(
        ["translate", "--model", tiny_run_dir, "--max-extra-length", "3", "A dog runs.", "Two men talk."], capsys
    )
    assert out.out == expected[0] + "\n" + expected[1] + "\n"
    assert out.err == ""  # sentences as arguments: no progress bar
    # One output line per input line; an empty input line gives an empty output line.
    out = run_cli(
        ["translate", "--model", tiny_run_dir, "--max-extra-length", "3", "--quiet"],
        capsys,
        stdin="A dog runs.\n\nTwo men talk.\n",
        monkeypatch=monkeypatch,
    )
    assert out.out == expected[0] + "\n\n" + expected[1] + "\n"
    assert out.err == ""  # --quiet


def test_translate_precision_and_early_stopping_options(tiny_run_dir, capsys):
    """--precision decodes under another dtype policy with the same weights; --early-stopping is accepted."""
    from keras_transformer.run_dir import load_run

    model, _ = load_run(tiny_run_dir, dtype="mixed_bfloat16")
    assert model.dtype_policy.name == "mixed_bfloat16" and model.compute_dtype == "bfloat16"
    reference, _ = load_run(tiny_run_dir, dtype="float32")
    for ours, theirs in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_array_equal(ours, theirs)  # same float32 weights, other compute dtype
    sentences = ["A dog runs.", "Two men talk."]
    outputs = {}
    # None: the tiny run was saved in float32, so --precision float32 must print what the default prints.
    for options, translator_options in (
        ([], {}),
        (["--precision", "float32"], None),
        (["--precision", "mixed_bfloat16"], dict(dtype="mixed_bfloat16")),
        (["--early-stopping", "k_finished"], dict(early_stopping="k_finished")),
    ):
        out = run_cli(["translate", "--model", tiny_run_dir, "--max-extra-length", "3", *options, *sentences], capsys)
        outputs[tuple(options)] = out.out.splitlines()
        if translator_options is not None:
            expected = Translator.from_run_dir(tiny_run_dir, max_extra_length=3, **translator_options).translate(
                sentences
            )
            assert out.out == "\n".join(expected) + "\n", options
    assert outputs[("--precision", "float32")] == outputs[()]


def test_a_parameter_the_library_refuses_is_named_by_its_flag(tiny_run_dir, capsys):
    """The library names `n_best`; the command line says `--n-best`, on one line of stderr, exit status 2."""
    argv = ["translate", "--model", tiny_run_dir, "--beam", "3", "--n-best", "4", "A dog."]
    with pytest.raises(SystemExit) as raised:
        cli.main(argv)
    assert raised.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "keras-transformer translate: --n-best 4: must be between 1 and the beam size 3 (and no sampling), got 4.\n"
    )


def test_every_parameter_flag_is_a_flag_of_its_command():
    """`cli.PARAMETER_FLAGS` names only flags its commands have (a renamed flag would leave it stale)."""
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(cli.PARAMETER_FLAGS) == set(commands)
    for command, flags in cli.PARAMETER_FLAGS.items():
        options = {option for action in commands[command]._actions for option in action.option_strings}
        assert set(flags.values()) <= options, (command, set(flags.values()) - options)


def test_missing_model_is_a_clear_error(tmp_path):
    nope = str(tmp_path / "nope")
    src = tmp_path / "src.en"
    src.write_text("A dog runs.\n", encoding="utf-8")
    for argv in (
        ["translate", "x"],
        ["evaluate", "--src", str(src), "--ref", str(src)],
        ["score", "--src", str(src), "--tgt", str(src)],
        ["attention", "x"],
    ):
        with pytest.raises(SystemExit, match=f"^{argv[0]}: --model {nope}: no such directory"):
            cli.main([*argv, "--model", nope])
    # A directory that is not a run: the file it misses is named.
    with pytest.raises(SystemExit, match=f"^score: --model {tmp_path}: .*spm.model"):
        cli.main(["score", "--model", str(tmp_path), "--src", str(src), "--tgt", str(src)])


def test_average_checkpoints_errors_are_one_line(tiny_run_dir, tmp_path):
    """--last 0 (checked before anything is read: a missing run would be the error otherwise) and a run
    without checkpoints were tracebacks. The averaging itself: tests/test_training.py."""
    for last in ("0", "-2"):
        with pytest.raises(SystemExit, match=f"^average-checkpoints: --last must be at least 1, got {last}.$"):
            cli.main(["average-checkpoints", str(tmp_path / "nope"), "--last", last])
    checkpoints = os.path.join(tiny_run_dir, "checkpoints")
    assert not os.path.exists(checkpoints)  # model.keras only
    with pytest.raises(SystemExit, match=f"^average-checkpoints: no checkpoints in {checkpoints}.$"):
        cli.main(["average-checkpoints", tiny_run_dir, "--last", "2", "--output", str(tmp_path / "avg.keras")])
    assert not (tmp_path / "avg.keras").exists()


def test_evaluate_refuses_empty_files_before_loading_the_model(tmp_path):
    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    src.write_text("", encoding="utf-8")
    ref.write_text("", encoding="utf-8")
    # A missing model would be the error if the model were loaded first.
    with pytest.raises(SystemExit, match="^evaluate: .*src.en and .*ref.de have no sentences"):
        cli.main(["evaluate", "--model", str(tmp_path / "nope"), "--src", str(src), "--ref", str(ref)])


def test_evaluate_prints_json_with_signatures(tiny_run_dir, capsys, tmp_path):
    sources, references = ["A dog runs.", "Two men talk."], ["Ein Hund rennt.", "Zwei Männer reden."]
    src, ref, output = tmp_path / "src.en", tmp_path / "ref.de", tmp_path / "hyp.de"
    src.write_text("\n".join(sources) + "\n", encoding="utf-8")
    ref.write_text("\n".join(references) + "\n", encoding="utf-8")
    out = run_cli(
        [
            "evaluate",
            "--model",
            tiny_run_dir,
            "--src",
            str(src),
            "--ref",
            str(ref),
            "--max-extra-length",
            "3",
            "--output",
            str(output),
            "--tgt-lang",
            "de",
        ],
        capsys,
    )
    expected = Translator.from_run_dir(tiny_run_dir, max_extra_length=3).translate(sources)
    assert output.read_text(encoding="utf-8") == "\n".join(expected) + "\n"
    result = json.loads(out.out)
    scores = json.loads(json.dumps(corpus_scores(expected, references, lang="de")))
    assert result == {**scores, "model": tiny_run_dir, "sentences": 2}
    assert 0 <= result["bleu"] <= 100 and 0 <= result["chrf"] <= 100
    assert result["bleu_signature"].startswith("nrefs:1") and "chrf_signature" in result


def test_evaluate_on_a_shipped_multi30k_split(tiny_run_dir, capsys, tmp_path, monkeypatch):
    from keras_transformer.data import corpora

    # The first 3 pairs of val stand for the split, to keep the tiny model's decoding short.
    real = corpora.read_lines
    monkeypatch.setattr(corpora, "read_lines", lambda split, lang: real(split, lang)[:3])
    output = tmp_path / "hyp.de"
    result = json.loads(
        run_cli(
            [
                "evaluate",
                "--model",
                tiny_run_dir,
                "--multi30k",
                "val",
                "--max-extra-length",
                "3",
                "--output",
                str(output),
            ],
            capsys,
        ).out
    )
    sources, references = real("val", "en")[:3], real("val", "de")[:3]
    expected = Translator.from_run_dir(tiny_run_dir, max_extra_length=3).translate(sources)
    assert output.read_text(encoding="utf-8") == "\n".join(expected) + "\n"
    assert result["bleu"] == pytest.approx(corpus_scores(expected, references)["bleu"])
    assert result["data"] == "multi30k:val en->de" and result["sentences"] == 3
    for argv, message in [
        ([], "give --src and --ref"),
        (["--multi30k", "val", "--src", "x"], "not both"),
        (["--multi30k", "val", "--src-lang", "xx"], "--multi30k val: .*xx"),
    ]:
        with pytest.raises(SystemExit, match=message):
            cli.main(["evaluate", "--model", tiny_run_dir, *argv])


def test_evaluate_refuses_misaligned_files(tiny_run_dir, tmp_path):
    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    src.write_text("a\nb\n", encoding="utf-8")
    ref.write_text("a\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="has 2 lines but .* has 1"):
        cli.main(["evaluate", "--model", tiny_run_dir, "--src", str(src), "--ref", str(ref)])


def test_input_files_with_bad_bytes_or_missing_are_clear_errors(tiny_run_dir, tmp_path):
    good, bad = tmp_path / "good.en", tmp_path / "bad.de"
    good.write_text("a\nb\n", encoding="utf-8")
    bad.write_bytes(b"ein Hund\nzwei \xff Hunde\n")
    with pytest.raises(SystemExit, match=r"evaluate: .*bad.de: line 2: invalid UTF-8"):
        cli.main(["evaluate", "--model", tiny_run_dir, "--src", str(good), "--ref", str(bad)])
    with pytest.raises(SystemExit, match=r"translate: .*bad.de: line 2: invalid UTF-8"):
        cli.main(["translate", "--model", tiny_run_dir, "--input", str(bad)])
    with pytest.raises(SystemExit, match=r"^score: --tgt .*nope.de: no such file.$"):
        cli.main(["score", "--model", tiny_run_dir, "--src", str(good), "--tgt", str(tmp_path / "nope.de")])


def test_stdin_is_read_as_input_files_are(tiny_run_dir, tmp_path, capsys, monkeypatch):
    # A byte-order mark, tabs and runs of spaces: stdin gets the normalization of --input FILE.
    data = "\ufeffA dog\truns.\n  Two   men talk. \n".encode("utf-8")
    path = tmp_path / "input.en"
    path.write_bytes(data)
    from_file = run_cli(
        ["translate", "--model", tiny_run_dir, "--max-extra-length", "3", "--quiet", "--input", str(path)], capsys
    ).out
    for flags in ([], ["--input", "-"]):
        out = run_cli(
            ["translate", "--model", tiny_run_dir, "--max-extra-length", "3", "--quiet", *flags],
            capsys,
            stdin=data,
            monkeypatch=monkeypatch,
        )
        assert out.out == from_file
    expected = Translator.from_run_dir(tiny_run_dir, max_extra_length=3).translate(["A dog runs.", "Two men talk."])
    assert from_file == "\n".join(expected) + "\n"
    set_stdin(monkeypatch, b"A dog runs.\nzwei \xff Hunde\n")
    with pytest.raises(SystemExit, match=r"^translate: <stdin>: line 2: invalid UTF-8"):
        cli.main(["translate", "--model", tiny_run_dir])


def test_translate_refuses_sentences_and_input_file_together(tmp_path):
    with pytest.raises(SystemExit, match="^translate: give sentences as arguments or --input, not both"):
        cli.main(["translate", "--model", str(tmp_path), "--input", str(tmp_path / "input.en"), "A dog runs."])


def test_input_lines_split_on_line_feeds_only(tiny_run_dir, tmp_path, capsys):
    # A carriage return inside a line (or a CRLF ending) does not start a new sentence.
    src = tmp_path / "src.en"
    src.write_bytes(b"A dog\rruns.\r\nTwo men talk.\n")
    out = run_cli(["translate", "--model", tiny_run_dir, "--max-extra-length", "3", "--input", str(src)], capsys)
    expected = Translator.from_run_dir(tiny_run_dir, max_extra_length=3).translate(["A dog runs.", "Two men talk."])
    assert out.out == "\n".join(expected) + "\n"


def test_scores_of_reference_against_itself_and_of_the_source():
    references = read_newstest2014("de")
    assert corpus_scores(references, references)["bleu"] == pytest.approx(100.0)
    # The English source scored against the German reference: low, and the same every time.
    first = corpus_scores(read_newstest2014("en"), references)
    again = corpus_scores(read_newstest2014("en"), references)
    assert first["bleu"] == again["bleu"] and 0 < first["bleu"] < 10
    assert newstest2014_path("de").endswith(".gz")


def test_attention_command_draws_the_sentence_tokens(tiny_run_dir, capsys, tmp_path, monkeypatch):
    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda figure=None: figures.append(figure))
    output = tmp_path / "attention.png"
    sentence = "A dog runs on the beach."
    run_cli(
        ["attention", "--model", tiny_run_dir, "--output", str(output), "--layer", "0", "--beam", "1", sentence], capsys
    )
    assert output.stat().st_size > 10_000
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (figure,) = figures
    encoder_axis = figure.axes[0]
    labels = [label.get_text() for label in encoder_axis.get_xticklabels()]
    from keras_transformer.inference.translator import Translator

    tokenizer = Translator.from_run_dir(tiny_run_dir).tokenizer
    assert labels == tokenizer.pieces(tokenizer.encode(sentence)) + ["</s>"]
    assert len(figure.axes) == 3 * 4  # encoder, decoder, cross x 4 heads
    close(figure)


def test_attention_refuses_a_bad_layer(tiny_run_dir):
    with pytest.raises(SystemExit, match="out of range"):
        cli.main(["attention", "--model", tiny_run_dir, "--layer", "7", "x"])


def test_attention_figure_is_bounded_for_long_inputs(tmp_path, monkeypatch):
    """0.28 inches a token and head made 16 heads x 220 tokens a 98,560 x 18,580-pixel figure (7 GB;
    older matplotlib refuses more than 2^16 pixels a side): the figure is capped, cells shrink, and only
    every k-th token is labelled once labels would be unreadable."""
    import struct

    from keras_transformer.inference import attention_maps

    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda figure=None: figures.append(figure))
    heads, source, target = 16, 220, 230
    rng = np.random.default_rng(0)
    weights = {
        "source_tokens": [f"s{i}" for i in range(source)],
        "target_tokens": [f"t{i}" for i in range(target)],
        "output_tokens": [f"t{i}" for i in range(1, target)] + ["</s>"],
        "encoder": rng.random((heads, source, source)),
        "decoder": rng.random((heads, target, target)),
        "cross": rng.random((heads, target, source)),
    }
    output = tmp_path / "long.png"
    attention_maps.plot_attention(weights, str(output))
    png = output.read_bytes()
    width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk
    limit = attention_maps.MAX_FIGURE_INCHES * attention_maps.DPI
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and 0 < width <= limit and 0 < height <= limit
    (figure,) = figures
    assert len(figure.axes) == 3 * heads
    labels = [label.get_text() for label in figure.axes[0].get_xticklabels()]
    step = int(labels[1][1:])  # "s{k}"
    assert step > 1 and labels == weights["source_tokens"][::step]
    close(figure)


def test_attention_on_a_blank_sentence_is_refused(tiny_run_dir):
    """The translator translates a blank line to "" without the model (blank in, blank out); its
    attention maps were those of a made-up translation of the end token alone."""
    from keras_transformer.inference import attention_maps

    translator = Translator.from_run_dir(tiny_run_dir, beam_size=1)
    for blank in ("", "   ", "\t\u3000", "\ufeff "):
        assert translator.translate([blank]) == [""]
        with pytest.raises(ValueError, match="nothing to show: the sentence is blank"):
            attention_maps.attention_weights(translator, blank)
    assert attention_maps.attention_weights(translator, " A dog. ")["source_tokens"][-1] == "</s>"
    with pytest.raises(SystemExit, match="^attention: nothing to show: the sentence is blank"):
        cli.main(["attention", "--model", tiny_run_dir, " "])


def test_attention_default_output_is_the_last_layer_in_the_run_dir(tiny_run_dir, capsys, tmp_path, monkeypatch):
    """--layer -1 without --output: RUN_DIR/attention_layerN.png, N the number of layers, of the last layer."""
    from keras_transformer.inference import attention_maps

    run_dir = str(tmp_path / "run")
    shutil.copytree(tiny_run_dir, run_dir)
    plotted = []
    plot = attention_maps.plot_attention

    def recording_plot(weights, output, **kwargs):
        plotted.append((weights, output, kwargs))
        return plot(weights, output, **kwargs)

    monkeypatch.setattr(attention_maps, "plot_attention", recording_plot)
    sentence = "A dog runs on the beach."
    out = run_cli(["attention", "--model", run_dir, "--layer", "-1", "--beam", "1", sentence], capsys)
    translator = Translator.from_run_dir(run_dir, beam_size=1)
    num_layers = translator.model.config.num_layers
    assert num_layers == 2
    path = os.path.join(run_dir, f"attention_layer{num_layers}.png")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert sorted(os.listdir(run_dir)) == sorted(os.listdir(tiny_run_dir) + [f"attention_layer{num_layers}.png"])
    ((weights, output, kwargs),) = plotted
    assert output == path and kwargs == {"layer_label": f"layer {num_layers} of {num_layers}"}
    last = attention_maps.attention_weights(translator, sentence, layer=num_layers - 1)
    first = attention_maps.attention_weights(translator, sentence, layer=0)
    for name in ("encoder", "decoder", "cross"):
        np.testing.assert_allclose(weights[name], last[name], rtol=1e-5, atol=1e-6)
        assert not np.allclose(weights[name], first[name], atol=1e-4)
    assert out.out == f"translation: {last['translation']}\nwrote {path}\n"


# translate: stdout holds the translations and nothing else, byte for byte.


@pytest.fixture(scope="module")
def expected_translations(tiny_run_dir):
    translations = Translator.from_run_dir(tiny_run_dir).translate(SENTENCES)
    assert translations[1] == "" and all(translations[i] for i in (0, 2, 3))
    assert not any("\n" in t for t in translations)
    return translations


def _stdout_bytes(translations):
    return ("\n".join(translations) + "\n").encode("utf-8")


def _assert_progress_bar(stderr, n):
    assert f"{n}/{n}".encode() in stderr and b"/sentence" in stderr, stderr[-2000:]


def test_translate_stdout_is_only_translations_through_pipes(tiny_run_dir, expected_translations):
    proc = subprocess.run(
        CLI + ["translate", "--model", tiny_run_dir],
        input=("\n".join(SENTENCES) + "\n").encode("utf-8"),
        capture_output=True,
        env=ENV,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    assert proc.stdout == _stdout_bytes(expected_translations)
    _assert_progress_bar(proc.stderr, len(SENTENCES))


def _raw_pty():
    """A pseudo-terminal whose output is passed through as written (no "\\n" -> "\\r\\n")."""
    master, slave = pty.openpty()
    attributes = termios.tcgetattr(slave)
    attributes[1] &= ~termios.OPOST
    termios.tcsetattr(slave, termios.TCSANOW, attributes)
    return master, slave


def _read_until_closed(proc, fds, timeout):
    """Everything written to the ptys `fds` until the child closes them."""
    data = {fd: b"" for fd in fds}
    open_fds = set(fds)
    deadline = time.monotonic() + timeout
    while open_fds:
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no end after {timeout} s: {data}")
        ready, _, _ = select.select(sorted(open_fds), [], [], 1.0)
        for fd in ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: every slave side is closed
                chunk = b""
            if chunk:
                data[fd] += chunk
            else:
                open_fds.discard(fd)
    return data


def test_translate_stdout_is_only_translations_on_a_terminal(tiny_run_dir, expected_translations):
    """stdout and stderr on two terminals (Keras' progress bar writes to stdout's tty otherwise)."""
    out_master, out_slave = _raw_pty()
    err_master, err_slave = _raw_pty()
    try:
        proc = subprocess.Popen(
            CLI + ["translate", "--model", tiny_run_dir],
            stdin=subprocess.PIPE,
            stdout=out_slave,
            stderr=err_slave,
            env=ENV,
        )
        os.close(out_slave)
        os.close(err_slave)
        proc.stdin.write(("\n".join(SENTENCES) + "\n").encode("utf-8"))
        proc.stdin.close()
        data = _read_until_closed(proc, [out_master, err_master], timeout=300)
        assert proc.wait(timeout=60) == 0, data[err_master].decode(errors="replace")[-4000:]
    finally:
        os.close(out_master)
        os.close(err_master)
    assert data[out_master] == _stdout_bytes(expected_translations)
    _assert_progress_bar(data[err_master], len(SENTENCES))


def test_translate_input_file(tiny_run_dir, expected_translations, capsys, tmp_path):
    path = tmp_path / "input.en"
    path.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    out = run_cli(["translate", "--model", tiny_run_dir, "--input", str(path)], capsys)
    assert out.out.encode("utf-8") == _stdout_bytes(expected_translations)
    _assert_progress_bar(out.err.encode("utf-8"), len(SENTENCES))


# translate --model SAVED_MODEL: the base directory serves its highest version.


@pytest.fixture(scope="module")
def saved_model_versions(tiny_run_dir, tmp_path_factory):
    """Versions 2 and 10 of one export base, with other decoding options (10 > 2, though "10" < "2")."""
    from keras_transformer.inference.saved_model import export_saved_model

    base = str(tmp_path_factory.mktemp("saved_models") / "tiny")
    options = {2: dict(beam_size=1, max_extra_length=2), 10: dict(beam_size=2, max_extra_length=6)}
    paths = {v: export_saved_model(tiny_run_dir, base, version=v, dtype="float32", **o) for v, o in options.items()}
    sentences = [s for s in SENTENCES if s]
    expected = {v: Translator.from_run_dir(tiny_run_dir, **o).translate(sentences) for v, o in options.items()}
    assert expected[2] != expected[10]  # the outputs tell the versions apart
    return base, paths, sentences, expected


def test_translate_saved_model_base_directory_uses_the_highest_version(saved_model_versions, capsys):
    base, _, sentences, expected = saved_model_versions
    out = run_cli(["translate", "--model", base, *sentences], capsys)
    assert out.out == "\n".join(expected[10]) + "\n"


def test_translate_saved_model_in_a_fresh_process(saved_model_versions):
    # Nothing but the command imports anything: the export's tensorflow-text ops must get registered.
    base, _, sentences, expected = saved_model_versions
    proc = subprocess.run(CLI + ["translate", "--model", base, *sentences], capture_output=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    assert proc.stdout == _stdout_bytes(expected[10])


def test_translate_saved_model_version_directory(saved_model_versions, capsys):
    _, paths, sentences, expected = saved_model_versions
    out = run_cli(["translate", "--model", paths[2], *sentences], capsys)
    assert out.out == "\n".join(expected[2]) + "\n"


def test_saved_model_refuses_what_it_cannot_do_with_clear_errors(saved_model_versions, capsys):
    base, _, sentences, _ = saved_model_versions
    with pytest.raises(SystemExit) as raised:
        cli.main(["translate", "--model", base, "--n-best", "2", *sentences])
    assert raised.value.code == 2
    assert capsys.readouterr().err == (
        f"keras-transformer translate: --n-best 2: cannot be given: {base}/10 was exported without a "
        "translate_n_best signature.\n"
    )
    for flags, message in (
        (["--sampling-temperature", "0.5"], "is a SavedModel, .*sampling needs"),
        (["--batch-size", "0"], "--batch-size 0: must be between 1 and 1024, got 0"),
        (["--batch-size", "2000"], "--batch-size 2000: must be between 1 and 1024, got 2000"),
    ):
        with pytest.raises(SystemExit, match=f"^translate: .*{message}"):
            cli.main(["translate", "--model", base, *flags, *sentences])
