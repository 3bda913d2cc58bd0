"""benchmarks/novel_requests.py: a served request's first time against its replay."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import novel_requests  # noqa: E402


def test_each_request_holds_new_sentences():
    rows = novel_requests.request_rows(pool_size=10, size=3, requests=2)
    assert rows == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]  # the warm-up, then two requests of sentences not yet served
    with pytest.raises(SystemExit, match="3 requests of 3 sentences and a warm-up need 12 sentences; .* hold 10"):
        novel_requests.request_rows(pool_size=10, size=3, requests=3)


def test_summary_compares_each_request_with_its_own_replay():
    # Two workers of ours, three requests of different lengths: novel / replayed is 1.2, 1.0 and 1.1.
    ours = [[dict(novel=(1.2, 1.2), replayed=(1.0, 1.0)), dict(novel=(2.0, 2.0), replayed=(2.0, 2.0))],
            [dict(novel=(3.3, 3.3), replayed=(3.0, 3.0))]]  # fmt: skip
    ct2 = [[dict(novel=(1.0, 0.9), replayed=(1.0, 0.9))]]
    out = novel_requests.summary({"ours": ours, "ctranslate2 int8": ct2}, size=10)
    assert out["ours"]["requests_timed"] == 3
    assert out["ours"]["novel_over_replayed_cpu"] == 1.1  # per request: the ratio of the medians would be 1.0
    assert out["ours"]["median_wall_seconds"] == {"novel": 2.0, "replayed": 2.0}
    assert out["ours"]["sentences_per_second"] == {"novel": 5.0, "replayed": 5.0}
    assert out["ctranslate2 int8"]["novel_over_replayed_cpu"] == 1.0
    assert out["ours"]["wall_over_first"] == {"novel": 1.0, "replayed": 1.0}


def test_systems_are_compared_request_by_request():
    """The ratio to the first system is the median of each request's ratio (1.1, 0.8, 0.9): 0.9, where the ratio of
    the medians (4.0 / 5.0) would be 0.8."""

    def worker(times):
        return [dict(novel=(t, t), replayed=(t, t)) for t in times]

    out = novel_requests.summary({"a": [worker([1.0, 5.0, 9.0])], "b": [worker([1.1, 4.0, 8.1])]}, size=1)
    assert out["b"]["wall_over_first"] == {"novel": 0.9, "replayed": 0.9}


@pytest.mark.parametrize("flag", ["--sentences", "--requests", "--rounds"])
def test_counts_below_one_are_refused(flag, capsys):
    with pytest.raises(SystemExit):
        novel_requests.main(["a=some/export/1", flag, "0"])
    assert f"{flag} must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("item", ["some/export/1", "=some/export/1", "a=", "ctranslate2 int8=some/export/1"])
def test_each_export_is_named(item, capsys):
    with pytest.raises(SystemExit):
        novel_requests.main([item])
    assert f"give each export once as NAME=EXPORT_DIR, NAME not 'ctranslate2 int8': got {item!r}" in (
        capsys.readouterr().err
    )


def test_a_name_given_twice_is_refused(capsys):
    with pytest.raises(SystemExit):
        novel_requests.main(["a=x/1", "a=y/1"])
    assert "got 'a=y/1'" in capsys.readouterr().err


def test_an_export_without_its_record_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setattr(novel_requests, "run_rounds", lambda *a: pytest.fail("timed an export it cannot describe"))
    with pytest.raises(SystemExit, match=f"{tmp_path} is not an exported version: no .*export.json"):
        novel_requests.main([f"a={tmp_path}"])


def test_ctranslate2_takes_the_export_s_beam_and_alpha():
    settings = novel_requests.ctranslate2_settings(dict(beam_size=5, alpha=1.0, length_penalty="average"))
    assert (settings["beam_size"], settings["length_penalty"], settings["compute_type"]) == (5, 1.0, "int8")


def test_each_round_starts_with_another_system(monkeypatch):
    order = []

    def fake(command, label, env=None):
        order.append(command[command.index("--worker") + 1])
        return dict(times=[], onednn_kernels=None)

    monkeypatch.setattr(novel_requests.common, "json_from_process", fake)
    args = novel_requests.argparse.Namespace(rounds=3, sentences=1, requests=1)
    novel_requests.run_rounds({"a": "x", "b": "y", "ctranslate2 int8": "z"}, args, {"beam_size": 4})
    assert order == ["a", "b", "ctranslate2 int8", "b", "ctranslate2 int8", "a", "ctranslate2 int8", "a", "b"]


def test_our_server_answers_each_sentence_as_text_on_one_thread(upper_saved_model, monkeypatch):
    """`ours_server` calls the export's `serving_default` signature as a model server does, texts out."""
    import tensorflow as tf

    pools = {}  # this process's pools are made already: record what the worker would set
    monkeypatch.setattr(tf.config.threading, "set_intra_op_parallelism_threads", lambda n: pools.update(intra=n))
    monkeypatch.setattr(tf.config.threading, "set_inter_op_parallelism_threads", lambda n: pools.update(inter=n))
    assert novel_requests.ours_server(upper_saved_model)(["ein hund", "zwei"]) == ["EIN HUND", "ZWEI"]
    assert pools == dict(intra=1, inter=1)
