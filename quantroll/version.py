"""quantroll's version, in a module of its own: the checkpoint writers and the CLI stamp it,
and importing it from the package's facade (``quantroll/__init__.py``, which hands out the
engine) would make the lowest layers import the highest."""

__version__ = "0.1.0"
