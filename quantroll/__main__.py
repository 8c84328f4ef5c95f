"""``python -m quantroll``: the command line (quantroll/cli.py), Ctrl-C quiet from the start."""

try:
    from quantroll.cli import entry
except KeyboardInterrupt:  # during the first imports
    raise SystemExit(130) from None

entry()
