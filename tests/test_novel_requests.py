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


def test_a_system_not_timed_is_left_out():
    out = novel_requests.summary({"ours": [[dict(novel=(1.0, 1.0), replayed=(1.0, 1.0))]], "ctranslate2 int8": []}, 1)
    assert list(out) == ["ours"]


def test_counts_below_one_are_refused(capsys):
    with pytest.raises(SystemExit):
        novel_requests.main(["a=some/export/1", "--requests", "0"])
    assert "--requests must be at least 1, got 0" in capsys.readouterr().err


def test_each_export_is_named(capsys):
    for argv in (["some/export/1"], ["ctranslate2 int8=some/export/1"]):
        with pytest.raises(SystemExit):
            novel_requests.main(argv)
        assert "give each export as NAME=EXPORT_DIR, NAME not 'ctranslate2 int8'" in capsys.readouterr().err
