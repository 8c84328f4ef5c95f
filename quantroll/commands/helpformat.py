"""One ``--help`` style for every subcommand: each default shown once.

argparse's ArgumentDefaultsHelpFormatter appends "(default: X)" to every option, so an
option whose help already names its default (often the clearer way: "default: cuda if
available, else cpu") printed it twice. This formatter appends the default only where
the help does not already say it, and leaves out defaults that carry no information
(None, False of a switch).
"""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.HelpFormatter):
    """Each default appears once (help texts and descriptions are reflowed as argparse does)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, False, argparse.SUPPRESS):
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return f"{text} (default: %(default)s)"
        return text
