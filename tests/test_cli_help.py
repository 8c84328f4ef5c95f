"""Every subcommand explains itself: a description, and each default printed once."""

import argparse

import pytest

from quantroll.cli import build_parser


def _parsers():
    out, todo = [], [("quantroll", build_parser())]
    while todo:
        name, parser = todo.pop()
        out.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [(f"{name} {n}", p) for n, p in action.choices.items()]
    return out


PARSERS = _parsers()


def test_every_subcommand_is_reached():
    names = {n for n, _ in PARSERS}
    assert {"quantroll compare", "quantroll train", "quantroll generate", "quantroll bench rollout"} <= names


@pytest.mark.parametrize("name, parser", PARSERS, ids=[n for n, _ in PARSERS])
def test_description_and_each_default_once(name, parser):
    assert parser.description and parser.description.strip(), f"`{name} --help` has no description"
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.help in (None, argparse.SUPPRESS):
            continue
        text = formatter._expand_help(action)
        assert text.lower().count("default") <= 1, (name, action.option_strings, text)
    parser.format_help()  # renders without error


@pytest.mark.parametrize("command", ["generate", "demo", "sft", "train", "compare"])
def test_every_command_that_runs_a_model_takes_the_same_compute_dtype_default(command):
    parser = dict(PARSERS)[f"quantroll {command}"]
    (action,) = [a for a in parser._actions if "--compute-dtype" in a.option_strings]
    assert action.default == "auto" and action.choices == ("auto", "bfloat16", "float32")
