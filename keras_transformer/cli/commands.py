"""The commands: each one's module and line of help, which is all `keras-transformer --help` shows.

Kept apart from the command modules, whose flags' defaults load Keras and
TensorFlow: the bare command and `--help` answer from this table alone.
"""

# Command name: (module, one line of help), in the order of --help.
COMMANDS = {
    "train": ("keras_transformer.cli.train", "train (or continue) a run with model.fit under tf.distribute"),
    "average-checkpoints": (
        "keras_transformer.cli.average",
        "average the last K checkpoints of a run into one model (§6.1)",
    ),
    "translate": ("keras_transformer.cli.translate", "translate sentences (arguments, a file, or stdin; one per line)"),
    "evaluate": ("keras_transformer.cli.evaluate", "corpus sacreBLEU and chrF of a model on a test set, as JSON"),
    "score": (
        "keras_transformer.cli.score",
        "score sentence pairs: the model's log-probability of each target given its source",
    ),
    "attention": ("keras_transformer.cli.attention", "plot the attention heads of one layer for a sentence (PNG)"),
    "export": (
        "keras_transformer.cli.export",
        "export a run (or re-export an export) as a SavedModel for TensorFlow Serving (strings in, translations out)",
    ),
}
COMMAND_HELP = {name: help for name, (_, help) in COMMANDS.items()}
