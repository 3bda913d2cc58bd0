"""The package's layout: the paper's model stands alone, the pipeline sits beside it.

- Importing the model (and building one) loads nothing of the pipeline
  (`data`, `training`, `inference`, `cli`, `run_dir`)
  and none of its libraries (tensorflow-text, SentencePiece, TFDS, sacreBLEU).
- `keras-transformer --help` and every `keras-transformer COMMAND --help`
  answer without those libraries, and `--help` loads none of the modules
  that run a command.
- The modules import each other without cycles, counting imports inside functions, and so do the
  package's direct children (`training` may use `inference`, not the reverse); modules stay under 500 lines.
- Each special id and decoding default is defined in exactly one module.

Import checks run in fresh interpreters (`sys.modules` of this one holds
whatever the other tests loaded), compared with one that imports only Keras.
"""

import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

import keras_transformer

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE_DIR = pathlib.Path(keras_transformer.__file__).resolve().parent
PACKAGE = "keras_transformer"
TIMEOUT = 900  # a ceiling that only catches hangs, not a speed requirement
MAX_MODULE_LINES = 500

PIPELINE_PACKAGES = (
    "keras_transformer.data",
    "keras_transformer.training",
    "keras_transformer.inference",
    "keras_transformer.cli",
)
PIPELINE_MODULES = ("keras_transformer.run_dir",)
PIPELINE_LIBRARIES = ("tensorflow_text", "sentencepiece", "tensorflow_datasets", "sacrebleu")
CLI_FORBIDDEN_LIBRARIES = (*PIPELINE_LIBRARIES, "ctranslate2", "sacremoses")

COMMANDS = ("train", "average-checkpoints", "translate", "evaluate", "attention", "export")

MARKER = "@@MODULES@@"


def loaded_modules(code):
    """Runs `code` in a fresh interpreter; returns the JSON it prints after MARKER."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=TIMEOUT
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for line in done.stdout.splitlines():
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER) :])
    raise AssertionError(f"no module list in the output:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def print_modules(extra="None"):
    return f"import json, sys; print({MARKER!r} + json.dumps({{'modules': sorted(sys.modules), 'extra': {extra}}}))"


def matching(modules, names):
    """The modules that are one of `names` or inside one of them."""
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


@pytest.fixture(scope="module")
def keras_modules():
    """What `import keras` alone loads (Keras itself imports matplotlib.pyplot, for one)."""
    return set(loaded_modules("import keras\n" + print_modules())["modules"])


def test_the_model_loads_nothing_of_the_pipeline(keras_modules):
    result = loaded_modules(
        "import numpy as np\n"
        "import keras_transformer\n"
        "from keras_transformer import layers, Transformer, TransformerConfig\n"
        "from keras_transformer.decoding import beam_search, score_outputs\n"
        "model = Transformer(TransformerConfig.tiny(100, max_length=16))\n"
        "out = model((np.ones((1, 5), 'int32'), np.ones((1, 4), 'int32')))\n" + print_modules("list(out.shape)")
    )
    modules = set(result["modules"])
    assert result["extra"] == [1, 4, 100]  # the model was built and run
    assert "keras_transformer.model" in modules and "keras_transformer.decoding.search" in modules
    assert matching(modules, PIPELINE_PACKAGES + PIPELINE_MODULES) == []
    assert matching(modules, PIPELINE_LIBRARIES) == []
    assert matching(modules, ["matplotlib"]) == matching(keras_modules, ["matplotlib"])
    # More generally: no top-level package that Keras alone does not load, but ours.
    top_level = {m.split(".")[0] for m in modules} - {m.split(".")[0] for m in keras_modules}
    assert top_level == {PACKAGE}


# What running a command needs and `--help` does not.
COMMAND_MODULES = (
    "keras_transformer.data",
    "keras_transformer.run_dir",
    "keras_transformer.inference.translator",
    "keras_transformer.inference.saved_model",
    "keras_transformer.inference.ctranslate2",
    "keras_transformer.training.loop",
)


def test_cli_help_loads_no_library_the_package_does_not():
    """`keras-transformer --help` loads the package (the model, Keras, TensorFlow) and the flags' modules: no
    other library, and none of the modules that run a command."""
    package = loaded_modules("from keras_transformer import Transformer\n" + print_modules())["modules"]
    result = loaded_modules(
        "from keras_transformer import cli\n"
        "try:\n"
        "    cli.main(['translate', '--help'])\n"
        "    code = 'returned'\n"
        "except SystemExit as e:\n"
        "    code = e.code\n" + print_modules("code")
    )
    assert result["extra"] in (0, None)
    modules = set(result["modules"])
    assert "keras_transformer.cli.translate" in modules and "keras_transformer.inference.precision" in modules
    assert matching(modules, CLI_FORBIDDEN_LIBRARIES) == []
    assert matching(modules, COMMAND_MODULES) == []
    # No top-level package that `import keras_transformer` does not load (matplotlib only as Keras loads it).
    assert {m.split(".")[0] for m in modules} - {m.split(".")[0] for m in package} == set()


def test_every_command_help_exits_0():
    """`keras-transformer COMMAND --help`, as the console script runs it (one process per command)."""
    script = pathlib.Path(sys.executable).with_name("keras-transformer")
    if script.exists():
        prefix = [str(script)]
    else:  # not installed as a console script: the same entry point
        prefix = [sys.executable, "-c", "import sys; from keras_transformer.cli import main; sys.exit(main())"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(prefix + ["--help"], capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    for command in COMMANDS:
        assert command in done.stdout
    # The commands' own --help, in one interpreter through the same `main`.
    result = loaded_modules(
        "import contextlib, io\n"
        "from keras_transformer import cli\n"
        "codes = {}\n"
        f"for command in {list(COMMANDS)!r}:\n"
        "    out = io.StringIO()\n"
        "    try:\n"
        "        with contextlib.redirect_stdout(out):\n"
        "            cli.main([command, '--help'])\n"
        "        codes[command] = ['returned', out.getvalue()]\n"
        "    except SystemExit as e:\n"
        "        codes[command] = [e.code, out.getvalue()]\n" + print_modules("codes")
    )
    for command in COMMANDS:
        code, text = result["extra"][command]
        assert code in (0, None), (command, code, text)
        assert text.startswith(f"usage: keras-transformer {command}"), (command, text[:200])
    assert matching(result["modules"], CLI_FORBIDDEN_LIBRARIES) == []


# The module graph, from the sources.


def module_files(package_dir=PACKAGE_DIR):
    """{module name: path} of every module of the package in `package_dir`."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def all_imports(tree):
    """Every import statement of the module, those inside functions and classes included: a lazy import is
    still a dependency."""
    return (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


def import_graph(package_dir=PACKAGE_DIR):
    """{module: set of the package's modules it imports, at module level or inside a function}."""
    modules = module_files(package_dir)
    graph = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in all_imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module
                # `from pkg import name`: the module pkg.name if there is one, else pkg.
                targets = [
                    f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source for alias in node.names
                ]
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def package_graph(graph):
    """The module graph folded onto the package's direct children (`keras_transformer.inference`,
    `keras_transformer.training`, `keras_transformer.run_dir`...): who depends on whom.

    A package importing its own modules is no edge, and the root `__init__` (which re-exports) is left out.
    """

    def child(module):
        parts = module.split(".")
        return ".".join(parts[:2]) if len(parts) > 1 else None

    folded = {child(name): set() for name in graph if child(name)}
    for name, targets in graph.items():
        if child(name):
            folded[child(name)].update(child(t) for t in targets if child(t) not in (None, child(name)))
    return folded


def find_cycle(graph):
    """One import cycle as a list of modules (first == last), or None."""
    state = {}  # 1: on the current path, 2: done
    path = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_import_graph_sees_the_package():
    graph = import_graph()
    assert "keras_transformer.special_ids" in graph["keras_transformer.data.tokenizer"]
    assert "keras_transformer.layers" in graph["keras_transformer"]  # `from keras_transformer import layers`
    assert "keras_transformer.config" in graph["keras_transformer"]
    # Imports inside functions count: `ValidationBleu.__call__` imports the evaluation lazily.
    assert "keras_transformer.inference.evaluation" in graph["keras_transformer.training.validation_bleu"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"b"}}) is None


def test_package_graph_finds_a_cycle_through_a_lazy_import(tmp_path):
    """Two subpackages that need each other, one of them only inside a function, are a cycle."""
    package = tmp_path / "pkg"
    for sub, source in (("a", "from pkg.b.y import g\n"), ("b", "def g():\n    from pkg.a.x import f\n")):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
        (package / sub / ("x.py" if sub == "a" else "y.py")).write_text(source + "def f():\n    pass\n")
    (package / "__init__.py").write_text("")
    graph = import_graph(package)
    assert graph["pkg.b.y"] == {"pkg.a.x"}
    assert package_graph(graph) == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}}
    assert find_cycle(package_graph(graph)) == ["pkg.a", "pkg.b", "pkg.a"]


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_cycle_between_packages():
    """`training` may use `inference` (validation BLEU translates), never the reverse; both read the machine
    from `hardware`, which imports nothing of the package."""
    graph = import_graph()
    packages = package_graph(graph)
    cycle = find_cycle(packages)
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle)
    assert "keras_transformer.inference" in packages["keras_transformer.training"]
    assert packages["keras_transformer.hardware"] == set()


def test_the_model_imports_nothing_of_the_pipeline_in_its_sources():
    """Statically as well: no module of the paper's model imports a pipeline module, even lazily (inside a
    function). (`compat` may import tensorflow-text in its functions: the tokenizer calls them.)"""
    model_modules = [
        name for name in module_files() if not name.startswith(PIPELINE_PACKAGES) and name not in PIPELINE_MODULES
    ]
    offenders = []
    for name in model_modules:
        tree = ast.parse(module_files()[name].read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                imported = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            bad = matching(imported, PIPELINE_PACKAGES + PIPELINE_MODULES)
            if bad:
                offenders.append((name, node.lineno, bad))
    assert "keras_transformer.model" in model_modules and "keras_transformer.compat" in model_modules
    assert offenders == []


def test_modules_have_at_most_500_lines():
    lengths = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in module_files().items()}
    assert len(lengths) > 30
    assert {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES} == {}


SINGLE_DEFINITIONS = {
    "PAD_ID": "keras_transformer.special_ids",
    "BOS_ID": "keras_transformer.special_ids",
    "EOS_ID": "keras_transformer.special_ids",
    "UNK_ID": "keras_transformer.special_ids",
    "DEFAULT_BEAM_SIZE": "keras_transformer.decoding.defaults",
    "DEFAULT_ALPHA": "keras_transformer.decoding.defaults",
    "EXTRA_OUTPUT_LENGTH": "keras_transformer.decoding.defaults",
}


def assigned_names(tree):
    """Every name bound by an assignment anywhere in the module (attributes by their last name)."""

    def names(target):
        if isinstance(target, ast.Name):
            yield target.id
        elif isinstance(target, ast.Attribute):
            yield target.attr
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                yield from names(element)
        elif isinstance(target, ast.Starred):
            yield from names(target.value)

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                yield from names(target)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
            yield from names(node.target)


def test_special_ids_and_decoding_defaults_are_defined_once():
    sources = dict(module_files())
    for directory in ("benchmarks", "examples"):  # they take the defaults from the package too
        for path in sorted((ROOT / directory).rglob("*.py")):
            sources[str(path.relative_to(ROOT))] = path
    definitions = {name: [] for name in SINGLE_DEFINITIONS}
    for module, path in sources.items():
        for name in assigned_names(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if name in definitions:
                definitions[name].append(module)
    assert definitions == {name: [module] for name, module in SINGLE_DEFINITIONS.items()}
