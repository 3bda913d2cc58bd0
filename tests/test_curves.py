"""`plot_curves`: the training and validation curves of a run directory, in the output's format."""

import os

import pytest

from keras_transformer.training.curves import plot_curves


@pytest.fixture
def run_dir(tmp_path):
    (tmp_path / "steps.csv").write_text("step,loss,accuracy\n10,5.0,0.1\n20,4.0,0.2\n30,3.5,0.3\n")
    (tmp_path / "history.csv").write_text("epoch,step,loss,accuracy,val_loss,val_accuracy\n0,30,4.2,0.2,4.0,0.25\n")
    return tmp_path


@pytest.mark.parametrize(
    "name, starts",
    [
        ("curves.png", b"\x89PNG"),
        ("curves.pdf", b"%PDF"),
        ("curves.svg", b"<?xml"),
        ("CURVES.SVG", b"<?xml"),
    ],
)
def test_the_output_extension_is_the_format(run_dir, tmp_path, name, starts):
    output = str(tmp_path / "out" / name)
    os.makedirs(os.path.dirname(output))
    assert plot_curves(str(run_dir), output) == output
    with open(output, "rb") as f:
        content = f.read()
    assert content.startswith(starts), content[:20]
    if starts == b"<?xml":
        assert b"<svg" in content
    assert os.listdir(os.path.dirname(output)) == [name]  # no temporary file left


def test_the_default_is_the_runs_curves_png_and_an_unknown_format_is_refused(run_dir):
    assert plot_curves(str(run_dir)) == os.path.join(str(run_dir), "curves.png")
    assert (run_dir / "curves.png").read_bytes().startswith(b"\x89PNG")
    with pytest.raises(
        ValueError,
        match=r"^plot_curves: cannot write .*curves\.txt: \.txt is not an image format "
        r"matplotlib writes \(.*\.pdf, .*\.svg.*\)\.$",
    ):
        plot_curves(str(run_dir), str(run_dir / "curves.txt"))
    assert not (run_dir / "curves.txt").exists()
