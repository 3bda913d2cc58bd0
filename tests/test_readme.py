"""The README files say what is true: their Python runs, and each figure they link is in the file it links to."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ["README.md", "benchmarks/README.md", "saved_models/README.md"] + sorted(
    str(path.relative_to(ROOT)) for path in (ROOT / "docs").glob("*.md")
)

# [text with a figure](path/to/results.json) or (...json#anchor)
LINKED_JSON = re.compile(r"\[([^\]]+)\]\(([^)\s]+?\.json)(?:#[^)]*)?\)")
NUMBER = re.compile(r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\w.])-?\d+(?:\.\d+)?")


def python_blocks(document):
    return re.findall(r"```python\n(.*?)```", (ROOT / document).read_text(encoding="utf-8"), re.DOTALL)


def linked_figures(document):
    """(figure text, JSON path) for every number shown as the text of a link to a JSON file."""
    text = (ROOT / document).read_text(encoding="utf-8")
    found = []
    for label, target in LINKED_JSON.findall(text):
        path = (ROOT / document).parent / target
        for figure in NUMBER.findall(label):
            found.append((figure, path))
    return found


def numbers_in(value):
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield float(value)
    elif isinstance(value, dict):
        for item in value.values():
            yield from numbers_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from numbers_in(item)


def matches(figure, value):
    """`figure` (as printed: "1,234", "37.1", "-0.31") is `value` rounded to the figure's decimals.

    Also matches a fraction printed as a percentage or a ratio printed as "1.5x" (the caller strips the x).
    """
    text = figure.replace(",", "")
    decimals = len(text.split(".")[1]) if "." in text else 0
    shown = float(text)
    return any(abs(round(candidate, decimals) - shown) < 10 ** -(decimals + 3) for candidate in (value, value * 100))


def test_readme_python_runs_as_written(tmp_path):
    """The library example of README.md runs in a fresh process, in an empty directory."""
    blocks = python_blocks("README.md")
    assert blocks, "README.md has no Python example"
    script = tmp_path / "readme_example.py"
    script.write_text("\n\n".join(blocks), encoding="utf-8")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip(), "the example prints its translation and BLEU"


def test_saved_models_readme_python_runs_against_the_committed_model(tmp_path):
    blocks = python_blocks("saved_models/README.md")
    assert blocks
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    for block in blocks:
        proc = subprocess.run(
            [sys.executable, "-c", block], cwd=ROOT, capture_output=True, text=True, env=env, timeout=900
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert proc.stdout.strip()


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_linked_figure_is_in_its_results_file(document):
    figures = linked_figures(document)
    if document == "README.md":
        assert len(figures) >= 3, "README.md's results link their figures to the files that hold them"
    missing = []
    for figure, path in figures:
        assert path.exists(), f"{document} links {path.relative_to(ROOT)}, which does not exist"
        values = list(numbers_in(json.loads(path.read_text(encoding="utf-8"))))
        if not any(matches(figure, value) for value in values):
            missing.append(f"{figure} (linked to {path.relative_to(ROOT)})")
    assert not missing, f"{document} quotes figures its linked files do not hold: {missing}"


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_relative_link_leads_to_a_file(document):
    """Moving text between README.md and docs/ keeps its links: each relative link names an existing path."""
    text = (ROOT / document).read_text(encoding="utf-8")
    broken = []
    for target in LINK.findall(text):
        path, _, anchor = target.partition("#")
        if "://" in path or path.startswith("mailto:"):
            continue
        linked = (ROOT / document).parent / path if path else ROOT / document
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked):
            broken.append(target)
    assert not broken, f"{document} links paths or headings that do not exist: {broken}"


def heading_anchors(path):
    """The anchors GitHub gives a Markdown file's headings: lower-cased, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    headings = re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_results_files_linked_from_the_readme_say_how_they_were_made():
    """Each results file the README links records its command, versions, machine (CPU flags, load) and date."""
    paths = sorted({path for _, path in linked_figures("README.md")})
    assert paths, "README.md links no results file"
    for path in paths:
        payload = json.loads(path.read_text(encoding="utf-8"))
        text = json.dumps(payload)
        for key in ("command", "versions", "date"):
            assert key in payload, f"{path.relative_to(ROOT)} has no {key!r}"
        assert "avx2" in text or "avx512" in text, f"{path.relative_to(ROOT)} does not record the CPU flags"
        assert "load_average" in text, f"{path.relative_to(ROOT)} does not record the load average"


def test_figure_matching_rounds_like_the_document():
    assert matches("37.1", 37.06) and matches("1,436", 1436.29) and matches("61.06", 61.0612)
    assert not matches("37.2", 37.06) and not matches("1,437", 1436.29)
    assert matches("95", 0.951)  # a share printed as a percentage
    assert [f for f, _ in linked_figures_from("[37.06 / 37.47](x.json) and [2,773](y.json#ours)")] == [
        "37.06",
        "37.47",
        "2,773",
    ]


def linked_figures_from(text):
    return [(figure, target) for label, target in LINKED_JSON.findall(text) for figure in NUMBER.findall(label)]


def test_saved_models_readme_gives_the_committed_model_s_sizes():
    """The sizes saved_models/README.md quotes are those of the committed files."""
    text = (ROOT / "saved_models" / "README.md").read_text(encoding="utf-8")
    match = re.search(
        r"one version is ([\d.]+) MB: ([\d.]+) MB of float32 weights, ([\d.]+) MB of graph, "
        r"([\d.]+) MB of `spm.model`, ([\d.]+) MB of warm-up requests",
        text,
    )
    assert match, "saved_models/README.md no longer states the model's size"
    version = ROOT / "saved_models" / "multi30k_en_de" / "1"
    sizes = [
        sum(f.stat().st_size for f in version.rglob("*") if f.is_file()),
        (version / "variables" / "variables.data-00000-of-00001").stat().st_size,
        (version / "saved_model.pb").stat().st_size,
        (version / "assets" / "spm.model").stat().st_size,
        (version / "assets.extra" / "tf_serving_warmup_requests").stat().st_size,
    ]
    for figure, size in zip(match.groups(), sizes):
        assert matches(figure, size / 1e6), (figure, size)
