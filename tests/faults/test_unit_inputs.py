"""Regression: an empty batch or sequence and a float64 input to a float32 unit are named errors
in every registered unit (they used to fail deep inside CGPT / SCGPT or a matmul)."""

import pytest
import torch

from gpattn_ppl.attention import ATTENTION, build_attention

from .conftest import tried


@pytest.mark.parametrize("kind", sorted(ATTENTION))
@pytest.mark.parametrize("shape", [(0, 5), (2, 0)])
def test_empty_batch_or_sequence_is_named(kind, shape):
    unit = build_attention(kind, 16, 2).float()
    tried("unit input")
    with pytest.raises(ValueError, match=r"empty input \(B = \d+, N = \d+\)"):
        unit(torch.zeros(*shape, 16))


@pytest.mark.filterwarnings("ignore::gpattn_ppl.errors.NumericsWarning")  # SCGPT at random init
@pytest.mark.parametrize("kind", sorted(ATTENTION))
def test_a_dtype_other_than_the_units_is_named(kind):
    unit = build_attention(kind, 16, 2).float()
    tried("unit input")
    with pytest.raises(ValueError, match=r"x is torch.float64 but the unit's parameters are "
                                         r"torch.float32"):
        unit(torch.randn(2, 5, 16, dtype=torch.float64))
    unit(torch.randn(2, 5, 16))  # its own dtype works


def test_a_run_folder_deleted_mid_run_is_not_recreated(tmp_path):
    import copy
    import shutil

    from gpattn_ppl.run.experiment import Trainer
    from gpattn_ppl.run.rundir import RunFolderError
    from tests.run.conftest import TINY

    cfg = copy.deepcopy(TINY)
    run = tmp_path / "run"
    trainer = Trainer(cfg, run)
    validate = trainer.validate

    def delete_then_validate():
        shutil.rmtree(run)
        return validate()

    trainer.validate = delete_then_validate
    tried("run folder")
    with pytest.raises(RunFolderError, match="config.yaml disappeared during training"):
        trainer.fit()
    assert not run.exists()
