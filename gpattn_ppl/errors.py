"""The library's error classes: every error it raises on purpose is a :class:`GpattnError`.

Each concrete class also derives from the builtin error it has always been (``ValueError``,
``RuntimeError``), so ``except ValueError`` keeps working:

=====================================================  =========================================
class                                                  raised for
=====================================================  =========================================
:class:`gpattn_ppl.schema.ConfigError`                 a bad config value (names the key path)
:class:`DataError`                                     a malformed data file (names file, line)
:class:`gpattn_ppl.run.rundir.RunFolderError`          a run folder that may not be used as asked
:class:`gpattn_ppl.infer.checkpoint.CheckpointError`   a missing, corrupt or mismatched checkpoint
:class:`gpattn_ppl.safe_files.UnsafePathError`         a link, folder, FIFO, socket or device where
                                                       a file is written, or a symlinked folder on
                                                       the way (names the path and what it is)
:class:`gpattn_ppl.safe_files.DiskFullError`           no space left / quota while writing (names
                                                       the path and the bytes wanted)
:class:`gpattn_ppl.data.hf_folder.HFFolderError`       a Hugging Face model folder that asks to run
                                                       its code, leads out of itself, is malformed
                                                       or is not the one a run was trained with
:class:`gpattn_ppl.hf.hub.SwapRecordError`             a swap record or saved weights that do not
                                                       rebuild the model (names the tensor)
:class:`gpattn_ppl.hf.pipeline.PipelineLoadError`      ``transformers.pipeline(...)`` could not
                                                       load a folder as a swapped model (names the
                                                       cause; deliberately no builtin base: see
                                                       the class)
:class:`gpattn_ppl.linalg.CholeskyError`               a matrix that cannot be factorised
:class:`gpattn_ppl.linalg.NonFiniteError`              a matrix with NaN / inf entries (overflow)
:class:`DivergenceError`                               training went non-finite (epoch, step, term)
=====================================================  =========================================

Numerical events that do not stop a computation (a jitter escalation, an objective term far
larger than the cross-entropy) are a :class:`NumericsWarning`, once per place or per run.

The command line (:mod:`gpattn_ppl.run.cli`) prints such an error as one
``gpattn-ppl <command>: error: <message>`` line and exits with status 2.

>>> issubclass(DataError, GpattnError) and issubclass(DataError, ValueError)
True
"""

from __future__ import annotations

__all__ = ["DataError", "DivergenceError", "GpattnError", "NumericsWarning"]


class GpattnError(Exception):
    """Base class of every error the library raises on purpose; the message says what is wrong
    and where (key path, file and line, run folder)."""


class DataError(GpattnError, ValueError):
    """A data file that cannot be read as the dataset expects; the message names the file and,
    for a malformed row, its line."""


class DivergenceError(GpattnError, FloatingPointError):
    """Training became non-finite; the message names the epoch, the step and the objective term
    (or the logits, the parameters) that went non-finite first."""


class NumericsWarning(UserWarning):
    """A numerical event worth knowing that did not stop the computation: a Cholesky jitter
    escalation (once per module and matrix), an objective term or a loss out of its usual range
    (once per run, naming the config option that fixes it)."""
