"""User-facing errors.

A :class:`VarpackError` is a user mistake or bad input: the CLI prints its message on one line
to stderr and exits 2, without a traceback. Anything else is a bug and keeps its traceback.
Messages say what is wrong, where (file, row, sample id, option) and what to do.
"""


class VarpackError(Exception):
    """Bad input, bad option or an existing output: reported in one line, exit code 2."""


class InputError(VarpackError):
    """The input data (metadata, sorted output, plan, dataset) is missing, malformed or invalid."""


class ConfigError(VarpackError):
    """An option or a combination of options is invalid."""


class OutputExistsError(VarpackError):
    """The output path exists and ``--overwrite`` was not given."""
