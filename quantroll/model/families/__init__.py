"""The model architectures quantroll runs, one module a family, and the registry that
finds a checkpoint's family from its config.json (``registry.family_for``)."""
