"""One exception type for every input the user can get wrong.

The CLI turns a ``QuantrollError`` into a one-line message and a non-zero exit; any
other exception is a bug in quantroll and keeps its traceback.
"""


class QuantrollError(ValueError):
    """A problem with the user's input (files, tensors, flags), stated in one line."""


class NonFiniteError(QuantrollError):
    """A tensor holds NaN or Inf where finite numbers are required; ``tensor`` names it
    where the raiser knows the name."""

    def __init__(self, message: str, tensor: str | None = None):
        super().__init__(message)
        self.tensor = tensor


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what the interrupted command wants said after 'interrupted' (e.g. the
    saved step of a train run and how to go on); the CLI prints it in its one line."""

    def __init__(self, hint: str = ""):
        super().__init__(hint)
        self.hint = hint
