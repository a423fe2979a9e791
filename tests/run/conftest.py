"""The tiny CoLA run every experiment test starts from (seconds per epoch on a CPU)."""

import pytest

TINY = {
    "model": {"dim": 16, "depth": 1, "heads": 2, "mlp_dim": 16, "dropout": 0.1, "max_len": 40},
    "data": {"name": "cola", "max_len": 40, "batch_size": 16, "limit_train": 64, "limit_eval": 32},
    "train": {"epochs": 2, "lr": 1e-3, "warmup_epochs": 0.5, "progress": False},
    "eval": {"mc_samples": 2},
}


@pytest.fixture
def tiny_config():
    import copy

    return copy.deepcopy(TINY)


@pytest.fixture
def drawn(monkeypatch):
    """``{file name: Figure}`` of every figure saved while the test runs."""
    figures = {}
    from gpattn_ppl.run import plotting

    save = plotting._save

    def spy(fig, path, *args, **kwargs):
        figures[path.name] = fig
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(plotting, "_save", spy)
    return figures
