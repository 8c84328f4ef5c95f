"""`compare --groups`: named groups instead of the matrix; a correction's flags reach only
the groups that name it; bad names are one line listing the known ones."""

import pytest

from quantroll.cli import main
from quantroll.commands.compare import train_config
from quantroll.compare.groupspec import EXAMPLE, GROUP_CORRECTIONS, build_groups_matrix
from quantroll.compare.matrix import LEVELED, RunSpec
from quantroll.compare.runner import CompareSetup, command_for
from quantroll.errors import QuantrollError

STUDY = "bf16,fp8,fp8+tis@1,fp8+tis-seq@1,fp8+mask@1,fp8-m2@1,fp8+kvfp8@1"


def _config(tmp_path, spec: RunSpec):
    setup = CompareSetup(tmp_path, tmp_path / "src", "m", False, "cpu", 3, 1, (), (), {})
    return train_config(command_for(setup, spec, {spec.checkpoint_key: tmp_path / "src"}, tmp_path / spec.run_id)[3:])


def test_the_long_response_study_groups_and_their_train_configs(tmp_path):
    specs = build_groups_matrix(STUDY, "1,2", 4096, moe=False)
    assert [s.run_id for s in specs] == [
        "bf16-baseline-none-seed1", "bf16-baseline-none-seed2", "fp8-rollout-none-seed1", "fp8-rollout-none-seed2",
        "fp8-rollout-tis-seed1", "fp8-rollout-tis-seq-seed1", "fp8-rollout-mask-seed1", "fp8-unified-none-seed1",
        "fp8-kvfp8-rollout-none-seed1"]
    assert all(s.response_len == 4096 for s in specs)
    want = {"bf16-baseline-none-seed1": (False, "truncate", "token"), "fp8-rollout-none-seed1": (False, "truncate", "token"),
            "fp8-rollout-tis-seed1": (True, "truncate", "token"), "fp8-rollout-tis-seq-seed1": (True, "truncate", "sequence"),
            "fp8-rollout-mask-seed1": (True, "mask", "token"), "fp8-unified-none-seed1": (False, "truncate", "token"),
            "fp8-kvfp8-rollout-none-seed1": (False, "truncate", "token")}
    for spec in specs:
        cfg = _config(tmp_path, spec)
        if spec.run_id in want:
            c = cfg.correction
            assert (c.enabled, c.mode, c.level) == want[spec.run_id], spec.run_id
        assert (cfg.precision.train_recipe is not None) == spec.unified, spec.run_id
        assert (cfg.engine.kv_cache_dtype != "bf16") == (spec.kv_cache_dtype == "fp8"), spec.run_id


@pytest.mark.parametrize("name,level,mode", [("tis-geo", "geometric", "truncate"), ("mask-seq", "sequence", "mask"),
                                             ("mask-geo", "geometric", "mask")])
def test_every_level_and_mode_reaches_train(tmp_path, name, level, mode):
    (spec,) = build_groups_matrix(f"fp8+{name}", "3", 8, moe=False)
    c = _config(tmp_path, spec).correction
    assert (c.enabled, c.mode, c.level) == (True, mode, level)
    assert spec.run_id == f"fp8-rollout-{name}-seed3"


def test_the_corrections_known_to_groups_are_those_train_args_know():
    assert set(GROUP_CORRECTIONS) == {"tis", "mask", "r3"} | set(LEVELED)


def test_kv_top_r3_bf16_exceptions_and_sweep(tmp_path):
    specs = build_groups_matrix("bf16+kvfp8+tis,bf16+top,fp8-m2+top,fp8+r3", "1", 8, moe=True, sweep_lens="16",
                                bf16_exceptions=True)
    ids = [s.run_id for s in specs]
    assert ids[:4] == ["bf16-kvfp8-baseline-tis-seed1", "bf16-baseline-top-none-seed1", "fp8-unified-top-none-seed1",
                       "fp8-rollout-r3-seed1"]
    # the exceptions checkpoint repeats each low-precision group (not bf16 weights)
    assert [s.run_id for s in specs if s.bf16_exceptions] == ["fp8-bf16x-unified-top-none-seed1",
                                                              "fp8-bf16x-rollout-r3-seed1"]
    # one sweep run per distinct rollout that is not true on-policy, correction none
    assert [s.run_id for s in specs if s.sweep] == ["bf16-kvfp8-baseline-none-seed1-len16", "fp8-rollout-none-seed1-len16"]
    assert _config(tmp_path, specs[3]).correction.rollout_routing_replay


@pytest.mark.parametrize("groups,match", [
    ("bf16,fp9", "unknown base 'fp9'; known: bases bf16, fp8"),
    ("fp8+tls", "unknown modifier 'tls'; known: bases bf16"),
    ("bf16+tis", "is the baseline"),
    ("fp8+tis+mask", "one correction per group"),
    ("fp8+r3", "needs an MoE model"),
    ("fp8+top", r"\+top"),
    ("fp8+kvfp8-m2", "unknown modifier"),
    ("fp8@3", "between 1 and the 2 seeds"),
    ("fp8@x", "give the number of seeds"),
    (" , ", "--groups is empty"),
])
def test_bad_groups_are_one_line(groups, match):
    with pytest.raises(QuantrollError, match=match) as err:
        build_groups_matrix(groups, "1,2", 8, moe=False)
    assert "\n" not in str(err.value)


def test_cli_refusals_leave_nothing_behind(tmp_path, capsys):
    out = tmp_path / "o"
    for extra in (["--groups", "bf16,fp8+bogus"], ["--groups", "fp8", "--precisions", "fp8"],
                  ["--groups", "fp8", "--kv-cache-dtypes", "fp8"], ["--groups", "fp8", "--true-on-policy"],
                  ["--groups", "fp8+tis", "--train-args", "--tis-level sequence"]):
        assert main(["compare", "--output-dir", str(out), *extra]) == 2, extra
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--" in err, err
    assert not out.exists()


def test_help_documents_groups(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--groups" in text and "tis-seq" in text and "mask-geo" in text and "kvfp8" in text
    assert EXAMPLE.split(",")[0] == "bf16"
