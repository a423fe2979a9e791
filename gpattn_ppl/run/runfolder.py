"""Opening a run folder: the one reader of every file a run wrote, each checked as it is read.

:func:`open_run` is how resume (:class:`~gpattn_ppl.run.training.Trainer`), ``evaluate``
(:func:`~gpattn_ppl.run.results.evaluate_run`), ``predict`` / :func:`~gpattn_ppl.run.predictor.load_run`,
``plot`` and ``compare`` (reusing finished runs) read a run folder
(:mod:`~gpattn_ppl.run.rundir` lists its files). Nothing in a run folder is executed:

* ``.pt`` files load with ``weights_only=True``
  (:func:`~gpattn_ppl.infer.checkpoint.load_pt`): a pickled object is refused unread;
* JSON and YAML are read with explicit schemas; an invalid file is a one-line
  :class:`~gpattn_ppl.run.rundir.RunFolderError` naming it;
* the plugins a run records (``--import`` at training) are never imported from here: when the
  config needs one that is not imported, the error names the ``--import`` to pass.

Cross-file rules: the config stored in ``best.pt`` must equal ``config.yaml`` (bar the ``eval``
section and the keys a resume ignores), ``calibration.json`` must agree with the temperature in
``results.json``, and a temperature must lie in
:data:`~gpattn_ppl.metrics.temperature.TEMPERATURE_RANGE`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..schema import refuse_duplicate_keys
from .rundir import IGNORED_KEYS, RunFolderError, _first_line, config_differences, read_manifest

__all__ = ["RunFolder", "open_run", "written_run"]


class RunFolder:
    """A run folder opened for reading; build it with :func:`open_run`.

    :ivar path: the folder.
    :ivar manifest: ``run.json``, schema-checked.
    :ivar config: the validated config of ``config.yaml`` (with the overrides given to
        :func:`open_run` applied).
    """

    def __init__(self, path: Path, manifest: dict, config, saved_config: dict) -> None:
        self.path, self.manifest, self.config = path, manifest, config
        self._saved = saved_config

    def __repr__(self) -> str:
        return f"RunFolder({self.path})"

    # -- JSON files ----------------------------------------------------------------------------
    def _json(self, name: str, *, required: bool = True) -> Any:
        path = self.path / name
        if not path.is_file():
            if required:
                raise RunFolderError(f"{self.path} has no {name}; train or evaluate it again")
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"),
                              object_pairs_hook=refuse_duplicate_keys)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError) as err:
            raise RunFolderError(f"{path} is corrupt: {_first_line(err)}") from None

    def encoder_state(self) -> dict:
        """``encoder.json`` (its keys are checked when the encoder is built:
        :meth:`encoder`)."""
        state = self._json("encoder.json")
        if not isinstance(state, dict):
            raise RunFolderError(f"{self.path / 'encoder.json'} is corrupt: expected a mapping")
        return state

    def encoder(self, **kw):
        """The input encoder of ``encoder.json`` (:func:`gpattn_ppl.data.encoder_from_state`).

        An ``arch: hf`` run's checkpoint folder is found from its record (the absolute path, or
        ``checkpoint=PATH``; never the current directory) and its digest checked
        (:func:`~gpattn_ppl.data.hf_folder.locate_checkpoint`); the encoder's ``folder`` is it.

        :raises ~gpattn_ppl.data.hf_folder.HFFolderError: the checkpoint folder is gone, breaks
            a rule, or is not the one the run was trained with (both digests named).
        """
        from ..data import HFFolderError, encoder_from_state

        try:
            return encoder_from_state(self.encoder_state(), where=str(self.path / "encoder.json"),
                                      **kw)
        except HFFolderError:
            raise
        except (ValueError, TypeError, KeyError) as err:
            raise RunFolderError(f"{self.path / 'encoder.json'} is invalid: "
                                 f"{_first_line(err)}") from None

    def pin_checkpoint(self, cfg: dict, encoder) -> dict:
        """``cfg`` with ``model.checkpoint`` set to the folder ``encoder`` (of :meth:`encoder`)
        found and checked, for an ``arch: hf`` run (others: ``cfg`` as is), so the model is
        built from the same folder as the tokenizer."""
        if getattr(encoder, "kind", None) != "hf" or cfg["model"].get("arch") != "hf":
            return cfg
        return {**cfg, "model": {**cfg["model"], "checkpoint": str(encoder.folder)}}

    def history(self) -> list[dict]:
        """``history.json``: one mapping per epoch (``[]`` when the run has none yet)."""
        history = self._json("history.json", required=False)
        if history is None:
            return []
        if not isinstance(history, list) or not all(
                isinstance(r, dict) and isinstance(r.get("epoch"), int) for r in history):
            raise RunFolderError(f"{self.path / 'history.json'} is corrupt: expected a list of "
                                 "per-epoch mappings with an integer 'epoch'")
        return history

    def results(self, *, required: bool = True) -> dict | None:
        """``results.json`` (``None`` if absent and not ``required``)."""
        results = self._json("results.json", required=required)
        if results is None:
            return None
        if not isinstance(results, dict) or not isinstance(results.get("test"), dict):
            raise RunFolderError(f"{self.path / 'results.json'} is corrupt: expected a mapping "
                                 "with a 'test' entry")
        return results

    def temperature(self) -> float | None:
        """The temperature ``results.json`` records (``None``: evaluated without temperature
        scaling, or not evaluated), checked against ``calibration.json``.

        :raises RunFolderError: a temperature outside
            :data:`~gpattn_ppl.metrics.temperature.TEMPERATURE_RANGE` or not a number, or a
            ``calibration.json`` that disagrees with ``results.json`` (an evaluation was
            interrupted between the two, or a file was edited).
        """
        from ..metrics.temperature import check_temperature

        results = self.results(required=False)
        ts = None if results is None else results.get("temperature_scaling")
        tau = None
        if ts is not None:
            if not isinstance(ts, dict):
                raise RunFolderError(f"{self.path / 'results.json'}: temperature_scaling must be "
                                     "a mapping")
            tau = self._checked_tau(ts.get("temperature"), "results.json", check_temperature)
        cal = self._json("calibration.json", required=False)
        if cal is not None:
            cal_tau = self._checked_tau(cal.get("temperature") if isinstance(cal, dict) else cal,
                                        "calibration.json", check_temperature)
            if tau is None or abs(cal_tau - tau) > 1e-9 * max(1.0, abs(tau)):
                said = "no temperature scaling" if tau is None else f"temperature {tau:g}"
                raise RunFolderError(
                    f"{self.path}: calibration.json (temperature {cal_tau:g}) disagrees with "
                    f"results.json ({said}); an evaluation was interrupted or a file edited\n"
                    f"hint: run `gpattn-ppl evaluate {self.path}` again")
        return tau

    def _checked_tau(self, value, name: str, check) -> float:
        try:
            return check(value, f"{self.path / name}: temperature")
        except ValueError as err:
            raise RunFolderError(f"{err}; evaluate the run again") from None

    # -- tensors ---------------------------------------------------------------------------------
    def checkpoint(self, name: str = "best.pt", map_location="cpu") -> dict:
        """A checkpoint of the run, weights only; for ``best.pt`` its stored config must equal
        ``config.yaml`` (bar the ``eval`` section and :data:`~gpattn_ppl.run.rundir.IGNORED_KEYS`).

        :raises CheckpointError: missing, corrupt or unsafe file.
        :raises RunFolderError: the checkpoint was trained with another config.
        """
        from ..infer import load_checkpoint

        state = load_checkpoint(self.path / name, map_location=map_location)
        saved = state.get("config")
        if saved is not None:
            if not isinstance(saved, dict):
                raise RunFolderError(f"{self.path / name}: its 'config' entry is not a mapping")
            ignore = IGNORED_KEYS + ("eval",)
            diff = config_differences(saved, self._saved, ignore, names=(name, "config.yaml"))
            if diff:  # keys added to the schema since the checkpoint was written: defaults
                diff = config_differences(_validated_or_raw(saved), self._saved, ignore,
                                          names=(name, "config.yaml"))
            if diff:
                raise RunFolderError(
                    f"{self.path}: {name} was trained with another config than config.yaml "
                    f"says ({'; '.join(diff)}); a file was replaced or edited\nhint: train the "
                    "run again (--force)")
        return state

    def load_weights(self, net, name: str = "best.pt", map_location="cpu") -> dict:
        """Load a checkpoint's weights into ``net`` (strictly); returns the checkpoint.

        :raises CheckpointError: the weights do not fit the model ``config.yaml`` describes
            (one line naming the file and the first mismatching tensor).
        """
        from ..infer import CheckpointError

        state = self.checkpoint(name, map_location)
        result = _load_state(net, state["model"])
        if result is not None:
            raise CheckpointError(f"{self.path / name} does not fit the model config.yaml "
                                  f"describes: {result}")
        return state

    def predictions(self) -> dict:
        """``predictions.pt``, weights only, its layout checked
        (:func:`~gpattn_ppl.infer.checkpoint.load_predictions`)."""
        from ..infer import load_predictions

        path = self.path / "predictions.pt"
        if not path.is_file():
            raise RunFolderError(f"{self.path} has no predictions.pt\nhint: run `gpattn-ppl "
                                 f"evaluate {self.path}` first")
        return load_predictions(path)


def _load_state(net, state: dict) -> str | None:
    """Load ``state`` into ``net`` strictly; ``None`` on success, else the first problem."""
    own = net.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing:
        return f"{len(missing)} tensor(s) missing, first {missing[0]!r}"
    if unexpected:
        return f"{len(unexpected)} unexpected tensor(s), first {unexpected[0]!r}"
    if shapes:
        k = shapes[0]
        return (f"{len(shapes)} tensor(s) of another shape, first {k!r}: "
                f"{tuple(state[k].shape)} in the file, {tuple(own[k].shape)} in the model")
    net.load_state_dict(state)
    return None


def _validated_or_raw(cfg: dict) -> dict:
    """A stored config with the defaults of keys added to the schema since it was written (as
    written when it no longer validates: the differences then name the keys)."""
    from .config import ConfigError, validate_config

    try:
        return dict(validate_config(cfg, extras=False))
    except ConfigError:
        return cfg


def written_run(run_dir: str | Path, cfg) -> RunFolder:
    """The folder a :class:`~gpattn_ppl.run.training.Trainer` is writing, with the validated
    config it wrote to ``config.yaml`` (not read and validated again)."""
    run_dir = Path(run_dir)
    return RunFolder(run_dir, read_manifest(run_dir), cfg, dict(cfg))


def open_run(run_dir: str | Path, overrides: list[str] | None = None) -> RunFolder:
    """Open a run folder for reading: its manifest and config, checked.

    :param overrides: ``--set`` overrides applied to the config (callers restrict which).
    :raises RunFolderError: not a run folder, an invalid ``run.json`` / ``config.yaml``, or a
        config that needs a plugin the run recorded but this process has not imported (the
        message names the ``--import`` to pass; a run folder never imports code by itself).
    """
    from ..schema import ConfigError, read_yaml_mapping
    from .config import apply_overrides, validate_config
    from .plugins import imported_plugins

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunFolderError(f"{run_dir} is not a folder")
    manifest = read_manifest(run_dir)
    path = run_dir / "config.yaml"
    try:
        raw = read_yaml_mapping(path)
    except (OSError, ConfigError) as err:
        raise RunFolderError(f"{path} cannot be read: {_first_line(err)}") from None
    try:
        saved = dict(validate_config(raw, extras=False))
    except ConfigError as err:
        missing = [p for p in manifest.get("plugins", []) if p not in imported_plugins()]
        if missing:
            flags = " ".join(f"--import {p}" for p in missing)
            raise RunFolderError(
                f"{path} is not valid here ({_first_line(err)}); the run was trained with "
                f"plugins that are not imported\nhint: pass {flags} if you trust them (a run "
                "folder never imports code by itself)") from None
        raise RunFolderError(f"{path} is not valid for this version: {_first_line(err)}"
                             ) from None
    # the optional packages a config needs are checked by the commands that load data (train,
    # evaluate), not here: predicting with a CIFAR-10 run needs no corruption package
    cfg = validate_config(apply_overrides(saved, overrides) if overrides else saved,
                          extras=False)
    return RunFolder(run_dir, manifest, cfg, saved)
