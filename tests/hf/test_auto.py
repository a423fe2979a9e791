"""A swapped folder loads correctly or not at all (issue 46): plain ``transformers`` refuses it;
with gpattn_ppl imported, the Auto classes, ``AutoTokenizer`` and ``pipeline`` load it exactly
as :func:`gpattn_ppl.hf.from_pretrained` does, strictly; a repo id loads from the local Hugging
Face cache; the old format loads with a warning; one swap function."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import gpattn_ppl.hf
import gpattn_ppl.models
from gpattn_ppl import settings
from gpattn_ppl.data import HFFolderError
from gpattn_ppl.data.hf_folder import check_model_folder
from gpattn_ppl.hf import SWAP_KEY, SwapRecordError, from_pretrained, swap
from gpattn_ppl.models.swapped_types import DEFAULT_HOSTS

from ..conftest import word_piece_tokenizer
from .hosts import HOSTS, SMALL, batch, tiny_classifier, transformers

C, H, V, K = 16, 4, 60, 3


@pytest.fixture(autouse=True)
def _quiet(quiet_transformers):
    """No progress bars of ``save_pretrained`` / ``from_pretrained`` in the test output."""


def _config(host: str):
    """A tiny config of the host model type ``host`` (K = 3 labels)."""
    if host == "distilbert":
        return transformers.DistilBertConfig(vocab_size=V, dim=C, n_layers=2, n_heads=H,
                                             hidden_dim=32, max_position_embeddings=40,
                                             num_labels=K)
    if host == "vit":
        return transformers.ViTConfig(image_size=8, patch_size=4, hidden_size=C,
                                      num_hidden_layers=2, num_attention_heads=H,
                                      intermediate_size=32, num_labels=K)
    extra = {"embedding_size": 8} if host in ("albert", "electra") else {}
    if host == "modernbert":          # every layer global (a local layer is refused)
        extra = {"global_attn_every_n_layers": 1, "pad_token_id": 0}
    return transformers.AutoConfig.for_model(
        host, vocab_size=V, hidden_size=C, num_hidden_layers=2, num_attention_heads=H,
        intermediate_size=32, max_position_embeddings=40, num_labels=K, **extra)


def _inputs(host: str) -> dict:
    if host == "vit":
        return {"pixel_values": torch.randn(3, 3, 8, 8, generator=torch.Generator().manual_seed(1))}
    return batch()


def _outputs(model, inputs) -> dict:
    """Every tensor the model returns, at the units' posterior mean."""
    with torch.no_grad(), settings.posterior_mean():
        out = model(**inputs)
    return {k: v for k, v in out.items() if torch.is_tensor(v)}


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _assert_same_state(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def _swapped(auto_name: str, host: str, kind: str = "sgpa"):
    auto = getattr(transformers, auto_name)
    torch.manual_seed(0)
    model = auto.from_config(_config(host)).eval()
    swap(model, kind, layers=[-1], init="random", **SMALL.get(kind, {}))
    return model


#: (Auto class, host): the task classes of every registered host family, and the other encoder
#: heads of the families of tests/hf/hosts.py
CASES = ([("AutoModelForImageClassification" if h == "vit" else
           "AutoModelForSequenceClassification", h) for h in DEFAULT_HOSTS]
         + [("AutoModel", h) for h in ("bert", "distilbert", "vit")]
         + [(a, h) for a in ("AutoModelForTokenClassification", "AutoModelForMaskedLM")
            for h in ("bert", "distilbert")]
         + [("AutoModelForMaskedImageModeling", "vit")])


@pytest.mark.parametrize("auto_name, host", CASES, ids=[f"{h}-{a}" for a, h in CASES])
@pytest.mark.filterwarnings("ignore:swap_attention.*replaces the attention without:UserWarning")
def test_auto_classes_load_what_the_library_loads(auto_name, host, tmp_path):
    """Saved, then loaded by the Auto class and by gpattn_ppl.hf.from_pretrained: the swapped
    class, the same outputs bit for bit (a stochastic unit at its posterior mean) and the same
    state dict; the folder is the protected format. (MPNet's relative-position bias is dropped,
    with a warning at every swap and load.)"""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if "gpattn_" + host not in CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {host}")
    if host == "modernbert" and int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("ModernBERT swaps from transformers 5 on")
    model, inputs = _swapped(auto_name, host), _inputs(host)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "gpattn_" + host and "auto_map" not in config
    assert config["architectures"] == [type(model).__name__]
    assert type(model).__name__ == "Gpattn" + type(model)._gpattn_host.__name__
    auto = getattr(transformers, auto_name).from_pretrained(tmp_path)
    library = from_pretrained(tmp_path)
    assert type(auto) is type(model) is type(library) and not auto.training
    expected = _outputs(model, inputs)
    _assert_same(_outputs(auto, inputs), expected)
    _assert_same(_outputs(library, inputs), expected)
    _assert_same_state(auto, model)
    _assert_same_state(library, model)
    assert type(transformers.AutoConfig.from_pretrained(tmp_path)) is type(model.config)


def test_a_swapped_model_copies_and_pickles():
    """The swapped classes live in gpattn_ppl.models.swapped_types under their names."""
    import copy
    import pickle

    model, enc = _swapped("AutoModelForSequenceClassification", "bert"), batch()
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):  # noqa: S301
        assert type(other) is type(model) and type(other.config) is type(model.config)
        _assert_same(_outputs(other, enc), _outputs(model, enc))


def test_a_deterministic_unit_round_trips_outside_the_posterior_mean(tmp_path):
    model, enc = _swapped("AutoModelForSequenceClassification", "bert", "kernel"), batch()
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(**enc).logits, model(**enc).logits)


def test_the_base_model_of_a_task_folder_loads_with_automodel(tmp_path):
    """AutoModel on a classifier's folder: the encoder (units included) as the classifier's
    (the head's weights are left out, as transformers does)."""
    model, enc = _swapped("AutoModelForSequenceClassification", "bert"), batch()
    model.save_pretrained(tmp_path)
    base = transformers.AutoModel.from_pretrained(tmp_path)
    assert type(base).__name__ == "GpattnBertModel"
    _assert_same(_outputs(base, enc), _outputs(model.bert, enc))


def _text_folder(tmp_path: Path, kind: str = "sgpa") -> tuple:
    """A swapped tiny BERT classifier saved with a word-piece tokenizer whose
    ``tokenizer_config.json`` names no class (AutoTokenizer goes by the config's type)."""
    folder = tmp_path / "clf"
    folder.mkdir()
    size = word_piece_tokenizer(folder)
    cfg_path = folder / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg.pop("tokenizer_class", None)
    cfg_path.write_text(json.dumps(tok_cfg))
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=size, hidden_size=C, num_hidden_layers=2,
                                  num_attention_heads=H, intermediate_size=32,
                                  max_position_embeddings=40, num_labels=K,
                                  id2label={0: "a", 1: "b", 2: "c"},
                                  label2id={"a": 0, "b": 1, "c": 2})
    model = transformers.BertForSequenceClassification(cfg).eval()
    swap(model, kind, layers=[-1], init="random", **SMALL.get(kind, {}))
    model.save_pretrained(folder)
    return folder, model


TEXTS = ["the cat sat on the mat", "what did you say", "mary seems to be happy"]


def test_autotokenizer_and_the_text_classification_pipeline_load_the_folder(tmp_path):
    """``transformers.pipeline("text-classification", model=folder)``: the swapped model and the
    host's tokenizer (found by the swapped type); its scores are the library's predictions
    (from_pretrained, the same tokenizer, softmax at the posterior mean)."""
    folder, _ = _text_folder(tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    host = transformers.AutoTokenizer.from_pretrained(folder, config=transformers.BertConfig())
    assert type(tokenizer) is type(host)
    assert tokenizer(TEXTS)["input_ids"] == host(TEXTS)["input_ids"]
    pipe = transformers.pipeline("text-classification", model=str(folder), top_k=None)
    assert type(pipe.model).__name__ == "GpattnBertForSequenceClassification"
    with settings.posterior_mean():
        got = pipe(TEXTS)
    library = from_pretrained(folder)
    enc = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad(), settings.posterior_mean():
        probs = library(**enc).logits.softmax(-1)
    for row, p in zip(got, probs):
        scores = {r["label"]: r["score"] for r in row}
        assert scores == pytest.approx({"a": float(p[0]), "b": float(p[1]), "c": float(p[2])},
                                       rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.filterwarnings("ignore:swap_attention.*replaces the attention without:UserWarning")
def test_every_tiny_classifier_family_loads_with_auto_and_the_pipeline(host, tmp_path):
    """The families of tests/hf/hosts.py, saved with a tokenizer: AutoModelForSequenceClassification
    and ``pipeline("text-classification", model=folder)`` give the library's predictions
    (from_pretrained, softmax at the posterior mean), bit for bit for the logits."""
    model = tiny_classifier(host)
    model.config.id2label, model.config.label2id = {0: "a", 1: "b", 2: "c"}, {"a": 0, "b": 1,
                                                                              "c": 2}
    swap(model, "sgpa", layers=[-1], init="random", **SMALL["sgpa"])
    word_piece_tokenizer(tmp_path)
    model.save_pretrained(tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    enc = dict(tokenizer(TEXTS, padding=True, return_tensors="pt"))
    enc.pop("token_type_ids", None)
    library = from_pretrained(tmp_path)
    auto = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path)
    expected = _outputs(library, enc)
    _assert_same(_outputs(auto, enc), expected)
    _assert_same(_outputs(model, enc), expected)
    pipe = transformers.pipeline("text-classification", model=str(tmp_path), top_k=None)
    assert type(pipe.model) is type(model)
    with settings.posterior_mean():
        got = pipe(TEXTS)
    probs = expected["logits"].softmax(-1)
    for row, p in zip(got, probs):
        assert {r["label"]: r["score"] for r in row} == pytest.approx(
            dict(zip("abc", p.tolist())), rel=1e-5, abs=1e-7)


# -- strict loading -------------------------------------------------------------------------------

def _edit_weights(folder: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    edit(state)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


UNIT = "bert.encoder.layer.1.attention.unit"


@pytest.mark.parametrize("edit, match", [
    (lambda s: s.pop(next(k for k in sorted(s) if k.startswith(UNIT))), r"missing \['bert"),
    (lambda s: s.update({f"{UNIT}.extra": torch.zeros(2)}), r"unexpected \['bert"),
    (lambda s: s.update({k: torch.zeros(7) for k in sorted(s) if k.startswith(UNIT)
                         and s[k].dim() == 2}), r"shape mismatch \['bert")],
    ids=["missing", "unexpected", "misshapen"])
def test_a_folder_with_a_wrong_unit_weight_is_refused_not_initialised(edit, match, tmp_path):
    """transformers would report the weight and initialise it at random; the swapped classes
    refuse the folder (the Auto classes, the pipeline, from_pretrained)."""
    folder, _ = _text_folder(tmp_path)
    _edit_weights(folder, edit)
    with pytest.raises(SwapRecordError, match=match):
        transformers.AutoModelForSequenceClassification.from_pretrained(folder)
    with pytest.raises(Exception, match=match):  # noqa: B017 -- the pipeline may re-wrap it
        transformers.pipeline("text-classification", model=str(folder))
    with pytest.raises(SwapRecordError):
        from_pretrained(folder)


# -- plain transformers ----------------------------------------------------------------------------

_PLAIN = textwrap.dedent("""
    import json, sys, warnings
    import transformers
    transformers.utils.logging.disable_progress_bar()
    folder = sys.argv[1]
    out = {}
    calls = {
        "AutoConfig": lambda: transformers.AutoConfig.from_pretrained(folder),
        "AutoModel": lambda: transformers.AutoModel.from_pretrained(folder),
        "AutoModelForSequenceClassification":
            lambda: transformers.AutoModelForSequenceClassification.from_pretrained(folder),
        "pipeline": lambda: transformers.pipeline("text-classification", model=folder),
    }
    for name, call in calls.items():
        try:
            call()
            out[name] = "LOADED"
        except Exception as err:
            out[name] = f"{type(err).__name__}: {err}"
    out["gpattn_ppl imported"] = any(m.startswith("gpattn_ppl") for m in sys.modules)
    print(json.dumps(out))
""")


def test_plain_transformers_refuses_a_swapped_folder(tmp_path):
    """In a process that never imports gpattn_ppl, every Auto class and the pipeline refuse the
    folder with the unknown model type, also when the folder's name holds a host's name (no
    fallback by name) -- none loads the host with random weights where the units were."""
    folder, _ = _text_folder(tmp_path)
    named = folder.rename(tmp_path / "my-bert-base-uncased")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    run = subprocess.run([sys.executable, "-c", _PLAIN, str(named)], capture_output=True,
                         text=True, env=env, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out.pop("gpattn_ppl imported") is False
    for name, result in out.items():
        assert result.startswith("ValueError: The checkpoint you are trying to load has model "
                                 "type `gpattn_bert` but Transformers does not recognize this "
                                 "architecture"), (name, result)


# -- the local Hugging Face cache -----------------------------------------------------------------

REPO = "someone/tiny-swapped"


def _cache_snapshot(cache: Path, commit: str, folder: Path, ref: str | None = None) -> None:
    """``folder``'s files as the snapshot ``commit`` of :data:`REPO` in the cache layout of
    huggingface_hub: ``models--someone--tiny-swapped/{blobs/<sha256>,
    snapshots/<commit>/<file> -> ../../blobs/<sha256>, refs/<ref>}``."""
    repo = cache / ("models--" + REPO.replace("/", "--"))
    blobs, snap = repo / "blobs", repo / "snapshots" / commit
    blobs.mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True)
    for f in sorted(folder.iterdir()):
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, blobs / digest)
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / digest)
    if ref is not None:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)


def test_a_repo_id_and_revision_load_from_the_local_cache(tmp_path, monkeypatch):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    old, new = tmp_path / "old", tmp_path / "new"
    first = _swapped("AutoModelForSequenceClassification", "bert", "sgpa")
    first.save_pretrained(old)
    second = _swapped("AutoModelForSequenceClassification", "bert", "kep_svgp")
    second.save_pretrained(new)
    cache = tmp_path / "hub"
    a, b = "a" * 40, "b" * 40
    _cache_snapshot(cache, a, old)
    _cache_snapshot(cache, b, new, ref="main")
    info = huggingface_hub.scan_cache_dir(cache)            # the layout huggingface_hub reads
    assert [r.repo_id for r in info.repos] == [REPO]
    assert {rev.commit_hash for r in info.repos for rev in r.revisions} == {a, b}
    enc = batch()
    main = from_pretrained(REPO, cache_dir=cache)
    _assert_same(_outputs(main, enc), _outputs(second, enc))
    pinned = from_pretrained(REPO, revision=a, cache_dir=cache)
    _assert_same(_outputs(pinned, enc), _outputs(first, enc))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    _assert_same(_outputs(from_pretrained(REPO, revision="main"), enc), _outputs(second, enc))
    auto = transformers.AutoModelForSequenceClassification.from_pretrained(
        REPO, revision=a, cache_dir=str(cache), local_files_only=True)
    _assert_same(_outputs(auto, enc), _outputs(first, enc))
    with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache"):
        from_pretrained(REPO, revision="c" * 40, cache_dir=cache)
    with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache"):
        from_pretrained("someone/absent", cache_dir=cache)
    with pytest.raises(FileNotFoundError, match="no such folder"):
        from_pretrained(str(tmp_path / "no" / "such" / "folder"))
    with pytest.raises(ValueError, match="revision"):
        from_pretrained(new, revision=a)


# -- the old format -------------------------------------------------------------------------------

def test_an_old_format_folder_loads_with_a_warning_and_resaves_protected(tmp_path):
    """A folder gpattn_ppl wrote before the swapped types (the host's model type and class
    with a record) loads exactly, with a warning to re-save; re-saved, it is protected."""
    model, enc = tiny_classifier(), batch()
    swap(model, "sgpa", layers=[-1], init="random", **SMALL["sgpa"])
    model.save_pretrained(tmp_path / "old")
    path = tmp_path / "old" / "config.json"
    config = json.loads(path.read_text())
    config.update(model_type="bert", architectures=["BertForSequenceClassification"])
    config.pop("gpattn_predictive")
    path.write_text(json.dumps(config))
    with pytest.warns(UserWarning, match="old format.*re-save it"):
        loaded = from_pretrained(tmp_path / "old")
    assert type(loaded) is type(model)
    assert loaded.config.gpattn_predictive == "mc"
    _assert_same(_outputs(loaded, enc), _outputs(model, enc))
    loaded.save_pretrained(tmp_path / "new")
    resaved = json.loads((tmp_path / "new" / "config.json").read_text())
    assert resaved["model_type"] == "gpattn_bert"
    assert resaved[SWAP_KEY] == config[SWAP_KEY]


# -- the folder check ----------------------------------------------------------------------------

def test_the_folder_check_allows_the_registered_swapped_types_only(tmp_path):
    folder, _ = _text_folder(tmp_path)
    assert check_model_folder(folder)["model_type"] == "gpattn_bert"
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for model_type, match in (("gpattn_evil", "not one transformers knows"),
                              ("gpattn_", "not one transformers knows"),
                              ("gpattn_gpt2", "not registered in this process")):
        path.write_text(json.dumps({**config, "model_type": model_type}))
        with pytest.raises(HFFolderError, match=match):
            check_model_folder(folder)


# -- one swap -------------------------------------------------------------------------------------

def test_there_is_one_swap_function():
    import gpattn_ppl as root

    assert root.swap is gpattn_ppl.hf.swap is gpattn_ppl.models.swap_attention
    assert gpattn_ppl.hf.hub.swap is gpattn_ppl.models.swap.swap_attention
    assert gpattn_ppl.hf.swap.__module__ == "gpattn_ppl.models.swap"


def test_swap_without_a_kind_is_the_recommended_configuration(tmp_path):
    """CGPT in the last layer, initialised from it, and the posterior-mean predictive in the
    config (and so in config.json); a kind given explicitly records Monte Carlo unless told."""
    model = tiny_classifier()
    (record,) = swap(model)
    assert (record["kind"], record["path"], record["init"]) == (
        "cgpt", "bert.encoder.layer.1.attention.unit", "pretrained")
    assert record["copied"]
    assert model.config.gpattn_predictive == "mean"
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["gpattn_predictive"] == "mean"
    assert from_pretrained(tmp_path).config.gpattn_predictive == "mean"
    other = tiny_classifier()
    swap(other, "sgpa", init="random", **SMALL["sgpa"])
    assert other.config.gpattn_predictive == "mc"
    swap(other, "kep_svgp", layers=[0], init="random", predictive="mean", rank=3)
    assert other.config.gpattn_predictive == "mean"
    with pytest.raises(ValueError, match="predictive must be one of mc, mean"):
        swap(tiny_classifier(), "sgpa", predictive="median")
    encoder = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(C, H, 32), 1,
                                          enable_nested_tensor=False)
    assert swap(encoder)[0]["kind"] == "cgpt"
    assert not hasattr(encoder, "config")


def test_import_gpattn_ppl_stays_cheap():
    """``import gpattn_ppl`` imports neither torch nor transformers (the registration runs when
    gpattn_ppl.hf is imported)."""
    code = ("import sys, gpattn_ppl; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "[]", run.stderr[-500:]
