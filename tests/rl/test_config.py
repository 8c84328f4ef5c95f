"""TrainConfig by stage: the command line checked against the dataclasses (every default
written once), the flat flag names mapped to their stages, and the JSON form `quantroll
compare` hands each run (strict: a wrong key or type is one line)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from quantroll.cli import build_parser, main
from quantroll.commands.train import CLI_ONLY, DEFAULT_DEVICE, NOT_FLAGS, config_from_args
from quantroll.errors import QuantrollError
from quantroll.rl.config import FLAGS, TrainConfig, flag_defaults


def _train_actions():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")  # the subcommands
    train = sub.choices["train"]
    return train, {a.dest: a for a in train._actions if a.option_strings and a.dest != "help"}


def test_every_field_has_one_flag_and_every_flag_one_field():
    _, actions = _train_actions()
    fields = set(FLAGS) - set(NOT_FLAGS)
    assert set(actions) - {"config", *CLI_ONLY} == fields
    for dest in fields:  # Miles' spelling: the flag is the dest with dashes
        assert f"--{dest.replace('_', '-')}" in actions[dest].option_strings


def test_command_line_defaults_are_the_dataclasses():
    train, actions = _train_actions()
    defaults = flag_defaults()
    for dest, action in actions.items():
        if dest in ("config", *CLI_ONLY):
            continue
        expected = DEFAULT_DEVICE if dest == "device" else defaults[dest]
        got = train.get_default(dest)
        assert (tuple(got) if dest == "skip" else got) == expected, dest
    assert config_from_args(train.parse_args([])) == dataclasses.replace(
        TrainConfig(), models=dataclasses.replace(TrainConfig().models, device=DEFAULT_DEVICE))


def test_flat_names_reach_their_stage_and_back():
    cfg = TrainConfig.of(lr=1e-3, use_tis=True, tis_clip=3.0, use_rollout_routing_replay=True, skip=["a.*"],
                         rollout_batch_size=4, kv_cache_dtype="fp8", save="s", save_interval=2)
    assert (cfg.optimizer.lr, cfg.correction.enabled, cfg.correction.clip, cfg.correction.rollout_routing_replay) \
        == (1e-3, True, 3.0, True)
    assert (cfg.models.skip, cfg.rollout.rollout_batch_size, cfg.engine.kv_cache_dtype) == (("a.*",), 4, "fp8_e4m3")
    assert (cfg.output.save, cfg.output.save_interval) == ("s", 2)
    assert TrainConfig.of(**cfg.flat()) == cfg
    with pytest.raises(TypeError, match="no flag lrate"):
        TrainConfig.of(lrate=1.0)


def test_json_round_trip():
    cfg = TrainConfig.of(lr=1e-3, use_tis=True, tis_mode="mask", skip=("model.layers.0.*",), kv_cache_memory_gb=2.0,
                         num_rollout=3, rollout_precision="fp8", train_recipe="fp8", eps_clip_high=0.3)
    text = cfg.to_json()
    assert json.loads(text)["correction"]["mode"] == "mask"
    assert TrainConfig.from_json(text, "c.json") == cfg
    assert TrainConfig.from_json("{}", "c.json") == TrainConfig()  # absent keys keep their defaults
    assert TrainConfig.from_json('{"optimizer": {"lr": 1}}', "c.json").optimizer.lr == 1.0  # an int is a number


@pytest.mark.parametrize("text,message", [
    ("[]", "c.json: holds list, not an object of stages"),
    ("{", "c.json: not JSON"),
    ('{"optimiser": {}}', "unknown stage(s) optimiser"),
    ('{"optimizer": {"learning_rate": 1}}', "unknown key(s) optimizer.learning_rate"),
    ('{"optimizer": {"lr": "1e-3"}}', "'optimizer.lr' must be a number, got '1e-3'"),
    ('{"rollout": {"seed": true}}', "'rollout.seed' must be an integer, got True"),
    ('{"rollout": {"num_rollout": null}}', "'rollout.num_rollout' is null; it needs an integer"),
    ('{"output": {"force": 1}}', "'output.force' must be true or false, got 1"),
    ('{"models": {"skip": "a.*"}}', "'models.skip' must be a list of strings"),
    ('{"rollout": {"num_rollout": 0}}', "--num-rollout must be >= 1, got 0"),  # the stage's own checks run
])
def test_json_refusals_name_the_key(text, message):
    with pytest.raises(QuantrollError) as err:
        TrainConfig.from_json(text, "c.json")
    assert message in str(err.value)


def test_train_config_file_refuses_a_setting_beside_it(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(TrainConfig.of(num_rollout=1).to_json())
    assert main(["train", "--config", str(path), "--lr", "0.5"]) == 2
    assert "holds the whole configuration; drop --lr" in capsys.readouterr().err
    path.write_text('{"rollout": {"seed": -1}}')
    assert main(["train", "--config", str(path)]) == 2
    assert "--seed must be >= 0" in capsys.readouterr().err


def test_an_lr_beyond_float32_is_refused_in_one_line():
    """torch's AdamW converts lr to float32 and crashed with a traceback at the first step."""
    with pytest.raises(QuantrollError, match=r"--lr must be at most 3\.403e\+38 .*got 1e\+39"):
        TrainConfig.of(lr=1e39)
    assert TrainConfig.of(lr=1e38).optimizer.lr == 1e38
