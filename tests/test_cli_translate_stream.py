"""Streaming `translate`: translations in input order as their windows finish; truncated inputs reported."""

import signal
import subprocess
import sys

import pytest

from keras_transformer import cli
from keras_transformer.data.corpora import read_lines
from keras_transformer.inference.batching import stream_windows, translate_in_batches, translate_stream
from keras_transformer.inference.translator import Translator

CLI = [sys.executable, "-m", "keras_transformer.cli"]


@pytest.fixture(scope="module")
def translator(tiny_run_dir):
    return Translator.from_run_dir(tiny_run_dir, beam_size=2, max_extra_length=3)


def default_sigint():
    """In the child: SIGINT's default action, which Python turns into KeyboardInterrupt (a shell's background
    job, such as a test run started with `&`, inherits SIGINT ignored, and Python then leaves it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_stream_windows_cover_the_input_in_order():
    for count in (0, 1, 7, 100, 1000):
        windows = stream_windows(count, batch_size=16, workers=2, first=4)
        assert [i for start, stop in windows for i in range(start, stop)] == list(range(count))
        assert all(stop - start <= 32 for start, stop in windows)


def test_stream_yields_in_input_order_what_translate_gives(translator):
    sentences = read_lines("val", "en")[:70]
    translations, scores = translate_in_batches(translator, sentences, batch_size=8, return_scores=True)
    streamed = list(translate_stream(translator, sentences, batch_size=8))
    assert [t for t, _ in streamed] == translations
    assert [s for _, s in streamed] == pytest.approx(scores, abs=1e-5)
    n_best = list(translate_stream(translator, sentences[:5], batch_size=8, n_best=2))
    assert n_best == translate_in_batches(translator, sentences[:5], batch_size=8, n_best=2)


def test_stream_decodes_only_the_first_window_before_the_first_answer(translator, monkeypatch):
    sentences = read_lines("val", "en")[:200]
    calls = []
    decode = translator.translate_strings
    monkeypatch.setattr(translator, "translate_strings", lambda inputs: calls.append(len(inputs)) or decode(inputs))
    stream = translate_stream(translator, sentences, batch_size=64, workers=2)
    first = next(stream)
    first_window = stream_windows(len(sentences), 64, 2)[0]
    assert sum(calls) == first_window[1] - first_window[0] < len(sentences)
    assert first[0] == translate_in_batches(translator, sentences[:1])[0]
    stream.close()


def test_translate_writes_lines_before_the_end_and_ctrl_c_keeps_them(tiny_run_dir, tmp_path):
    sentences = (read_lines("train", "en") * 2)[:3000]
    source = tmp_path / "input.en"
    source.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    argv = ["translate", "--model", tiny_run_dir, "--beam", "1", "--max-extra-length", "4", "--input", str(source)]
    proc = subprocess.Popen(CLI + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_sigint)
    first = proc.stdout.readline()
    running = proc.poll() is None  # a line came while the command was still translating
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=300)
    assert running, err.decode(errors="replace")[-3000:]
    assert proc.returncode == 130, err.decode(errors="replace")[-3000:]
    assert err.decode().splitlines()[-1] == "keras-transformer translate: interrupted."
    written = (first + rest).decode("utf-8")
    lines = written.splitlines()
    assert 0 < len(lines) < len(sentences)
    assert written.endswith("\n")  # what was written before Ctrl-C is whole lines: none cut in two
    # Not compared with the library's translations: this untrained model's near-ties flip from run to run of the
    # command (its two batches in flight), so a line's content is not reproducible; its wholeness is.


def test_truncated_inputs_are_reported_with_their_line_numbers(tiny_run_dir, tmp_path, capsys):
    long = " ".join(["A dog runs on the beach."] * 20)
    source = tmp_path / "input.en"
    source.write_text(f"A dog.\n{long}\nTwo men.\n{long}\n", encoding="utf-8")
    assert cli.main(["translate", "--model", tiny_run_dir, "--max-extra-length", "2", "--input", str(source)]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 4
    warnings = [line for line in captured.err.splitlines() if "warning" in line]
    assert len(warnings) == 2
    for warning, number in zip(warnings, (2, 4)):
        assert warning.startswith(f"keras-transformer translate: warning: {source} line {number}: ")
        assert "subwords, translated from its first 31 (the model reads at most 32 tokens, 2048 bytes, of a " in warning
    assert cli.main(["translate", "--model", tiny_run_dir, "--max-extra-length", "2", "A dog.", long]) == 0
    assert "warning: sentence 2: " in capsys.readouterr().err


def test_a_saved_model_reports_truncation_too(tiny_run_dir, tmp_path):
    from keras_transformer.inference.batching import truncated_sentences
    from keras_transformer.inference.saved_model import export_saved_model
    from keras_transformer.inference.translator import SavedModelTranslator

    path = export_saved_model(
        tiny_run_dir, str(tmp_path / "export"), beam_size=1, max_extra_length=2, dtype="float32", warmup_sentences=None
    )
    saved = SavedModelTranslator(path)
    long = " ".join(["A dog runs on the beach."] * 20)
    assert saved.max_input_length == 32
    assert (saved.max_input_length, saved.max_input_bytes) == (32, 2048)
    huge = "A dog. " * 1000  # 7,000 bytes: cut to 2,048 before its subwords are counted
    assert [(i, size) for i, _, size in truncated_sentences(saved, ["A dog.", long, huge])] == [(1, None), (2, 7000)]
    assert [t for t, _ in translate_stream(saved, ["A dog.", long])] == saved.translate(["A dog.", long])
