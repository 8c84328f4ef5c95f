"""One exception type for every input the user can get wrong.

The CLI turns a ``QuantrollError`` into a one-line message and a non-zero exit; any
other exception is a bug in quantroll and keeps its traceback.
"""


class QuantrollError(ValueError):
    """A problem with the user's input (files, tensors, flags), stated in one line."""


class NonFiniteError(QuantrollError):
    """A tensor holds NaN or Inf where finite numbers are required."""
