"""The library's one error type for a bad argument, named by its parameter.

Library calls name their own parameters (`beam_size`, `batch_tokens`), never
the command line's flags: the command line maps a `ParameterError`'s
`parameter` to the flag the user typed (`keras_transformer.cli`).
"""


class ParameterError(ValueError):
    """A bad value for one named parameter of a library call.

    Args:
        parameter: the parameter's name, as the call spells it (`"beam_size"`).
        message: what is wrong and what is allowed, without the name.

    Example:
        >>> error = ParameterError("beam_size", "must be at least 1, got 0")
        >>> str(error)
        'beam_size must be at least 1, got 0'
        >>> error.parameter
        'beam_size'
    """

    def __init__(self, parameter, message):
        super().__init__(f"{parameter} {message}")
        self.parameter = parameter
        self.message = message
