"""The command line: --set before or after positionals, --version, help for every argument."""

import argparse

import pytest

from gpattn_ppl.run.cli import _default_out, _gather_set, build_parser, main


def test_set_takes_only_key_value_words():
    argv = ["train", "--set", "train.lr=1", "model.attention.kind=kernel", "cfg.yaml", "--out", "o"]
    assert _gather_set(argv) == ["train", "--set", "train.lr=1", "--set",
                                 "model.attention.kind=kernel", "cfg.yaml", "--out", "o"]
    args = build_parser().parse_args(_gather_set(argv))
    assert args.config == "cfg.yaml" and args.set == ["train.lr=1", "model.attention.kind=kernel"]
    after = build_parser().parse_args(_gather_set(["train", "cfg.yaml", "--set", "a.b=1", "c=2"]))
    assert after.config == "cfg.yaml" and after.set == ["a.b=1", "c=2"]


def test_set_without_a_pair_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as err:
        main(["train", "cfg.yaml", "--set"])
    assert err.value.code == 2
    assert "--set" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as err:
        main(["--version"])
    assert err.value.code == 0
    assert capsys.readouterr().out.startswith("gpattn-ppl 0.")


def _subparsers(parser):
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_every_subcommand_and_argument_has_help_and_every_subcommand_an_example():
    parser = build_parser()
    for action in parser._actions:
        assert action.help, action
    sub = _subparsers(parser)
    assert set(sub.choices) == {"train", "evaluate", "predict", "export", "plot", "explain",
                                "compare", "bench", "demo"}
    for name, p in sub.choices.items():
        assert p.description and "example:" in (p.epilog or ""), name
        for action in p._actions:
            assert action.help and action.help != argparse.SUPPRESS or action.dest == "help", \
                (name, action.dest)


def test_default_out_keeps_the_dataset_folder():
    assert str(_default_out("experiments/configs/cola/softmax.yaml")) == "runs/cola/softmax"
    assert str(_default_out("softmax.yaml")) == "runs/softmax"


def test_import_of_a_missing_module_is_a_named_error(capsys):
    assert main(["--import", "no_such_module_xyz", "plot", "x", "--out", "y"]) == 2
    assert "--import no_such_module_xyz: cannot import it" in capsys.readouterr().err
