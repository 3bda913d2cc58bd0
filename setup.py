"""Packaging for keras-transformer."""

from setuptools import find_packages, setup

setup(
    name="keras-transformer",
    version="0.3.0",
    description=(
        "A paper-faithful TensorFlow/Keras 3 implementation of the Transformer "
        "(Vaswani et al., 2017): layers, training, beam search and TF Serving export."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE", "NOTICE"],
    python_requires=">=3.10",
    classifiers=[
        "Development Status :: 4 - Beta",
        "Intended Audience :: Science/Research",
        "Intended Audience :: Developers",
        "License :: OSI Approved :: Apache Software License",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: Text Processing :: Linguistic",
    ],
    project_urls={
        "Paper": "https://arxiv.org/abs/1706.03762",
    },
    packages=find_packages(include=["keras_transformer", "keras_transformer.*"]),
    package_data={"keras_transformer": ["data/*/*.gz", "data/*/README.md"]},
    install_requires=[
        # tensorflow-text ships compiled ops for one TensorFlow minor version only.
        "tensorflow~=2.21.0",
        "tensorflow-text~=2.21.0",
        "keras>=3.10",
        "tensorflow-datasets>=4.9",
        "sentencepiece>=0.2",
        "sacrebleu>=2.4",
        "sacremoses>=0.1",
        "matplotlib>=3.8",
        "tensorboard~=2.21.0",
    ],
    extras_require={
        # CTranslate2 (42 MB) runs the export_ctranslate2 tests, ai-edge-litert the LiteRT files outside TensorFlow;
        # keras-hub and torch stay in "bench".
        "test": [
            "pytest>=8",
            "pytest-xdist>=3.5",
            "ruff==0.17.6",
            "tensorflow-serving-api~=2.21.0",
            "ctranslate2==4.8.5",
            "ai-edge-litert==2.3.0",
        ],
        "bench": ["keras-hub==0.32.0", "ctranslate2==4.8.5", "torch==2.13.0"],
    },
    entry_points={"console_scripts": ["keras-transformer=keras_transformer.cli:main"]},
)
