"""The wheel holds what a user installs: the code, the shipped data, the licenses, and metadata that reads well."""

import email
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    build_dir_existed = (ROOT / "build").exists()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(out),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    if not build_dir_existed:  # setuptools builds in the source tree; leave it as it was
        shutil.rmtree(ROOT / "build", ignore_errors=True)
    (path,) = out.glob("keras_transformer-*.whl")
    return zipfile.ZipFile(path)


def _metadata(wheel):
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return email.message_from_bytes(wheel.read(name))


def test_wheel_ships_the_licenses_the_data_and_no_tests(wheel):
    names = wheel.namelist()
    # dist-info/licenses/ (PEP 639, newer setuptools) or dist-info/ itself (older ones).
    licenses = {Path(n).name for n in names if ".dist-info/" in n}
    assert {"LICENSE", "NOTICE"} <= licenses
    assert "keras_transformer/data/multi30k/test2016.lc.norm.tok.de.gz" in names
    assert any(n.startswith("keras_transformer/data/newstest2014/") and n.endswith(".gz") for n in names)
    assert "keras_transformer/data/multi30k/README.md" in names
    assert not any(n.startswith(("tests/", "benchmarks/", "runs/", "saved_models/")) for n in names)


def test_metadata_reads_well_on_a_package_index(wheel):
    metadata = _metadata(wheel)
    assert metadata["Requires-Python"] == ">=3.10"
    classifiers = metadata.get_all("Classifier")
    assert "License :: OSI Approved :: Apache Software License" in classifiers
    assert f"Programming Language :: Python :: {sys.version_info.major}.{sys.version_info.minor}" in classifiers
    assert metadata["Description-Content-Type"] == "text/markdown"
    # The long description is the README.
    description = metadata.get_payload(decode=True).decode("utf-8")
    assert description.strip() == (ROOT / "README.md").read_text(encoding="utf-8").strip()
    assert "Paper, https://arxiv.org/abs/1706.03762" in metadata.get_all("Project-URL")
    assert any(req.startswith("tensorflow~=2.21") for req in metadata.get_all("Requires-Dist"))
