"""Exporter: SavedModel versions in TF Serving's layout, published atomically, oldest pruned.

Layout (what TF Serving's file system source polls)::

    <dir>/<version>/saved_model.pb
    <dir>/<version>/variables/...
    <dir>/<version>/assets.extra/streamer.json   topic, step and the offsets trained up to

``offsets`` in streamer.json lists every partition of the topic: the next offset the model has
not trained (every record below it was trained, or lies before where this model's stream
started), or ``null`` where the model has no position for the partition (it never read it and
no checkpoint or commit it started from had one).

The serving signature (``serving_default``) takes the model's inputs by name. Keras' own
export is used when every input is a plain tensor. A ragged input (a variable-length feature
without ``pad_to``) cannot be a signature input, so then the signature takes it flat, as
``<name>`` (the values, rows end to end) and ``<name>_row_lengths`` (int64, one per example),
which is what TF Serving and any other client can send; the SavedModel's ``serve`` function
takes the same ``tf.RaggedTensor`` the model was trained on::

    loaded = tf.saved_model.load(version_dir)
    loaded.serve({"user": users, "items": tf.ragged.constant(ids), "x": x})
    loaded.signatures["serving_default"](
        user=users, items=flat_ids, items_row_lengths=lengths, x=x)

A version is written under ``<dir>/.streamer-tmp-<version>-<random>`` (a name TF Serving ignores: not
all digits) and then renamed into place, so a reader polling the directory sees a version
either complete or not at all. Old versions are renamed to ``.del-...`` before they are deleted,
for the same reason. Versions strictly increase, across restarts too: a new version is
``max(step, newest version + 1)``. One export directory belongs to one worker.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from streamer.decode.schema import ROW_LENGTHS_SUFFIX
from streamer.train.errors import ModelDivergedError
from streamer.train.trainer import check_finite_weights

__all__ = ["INFO_FILE", "Exporter", "publish", "read_info", "serving_inputs"]

log = logging.getLogger(__name__)

INFO_FILE = os.path.join("assets.extra", "streamer.json")
_TMP_PREFIX = ".streamer-tmp-"
_DEL_PREFIX = ".streamer-del-"
#: What this exporter writes beside versions, and only that: ``.streamer-tmp-<v>-<hex8>``
#: (a version being written) and ``.streamer-del-<v>-<hex8>`` (one being removed).
_OURS = re.compile(r"^\.streamer-(tmp|del)-\d+-[0-9a-f]{8}$")


def read_info(version_dir: str) -> dict[str, Any]:
    """The ``streamer.json`` of one exported version (offsets keyed by int partition)."""
    with open(os.path.join(version_dir, INFO_FILE), encoding="utf-8") as fh:
        info: dict[str, Any] = json.load(fh)
    info["offsets"] = {
        int(p): None if o is None else int(o) for p, o in info.get("offsets", {}).items()
    }
    return info


def serving_inputs(element_spec: Mapping[str, Any], names: Sequence[str]) -> dict[str, tf.TypeSpec]:
    """The specs of the model's inputs in a batch of the pipeline, any batch size.

    >>> serving_inputs(source.dataset().element_spec, bundle.input_names)  # doctest: +SKIP
    {'user': TensorSpec(shape=(None,), dtype=tf.string, name='user'), 'items': ...}
    """
    out: dict[str, tf.TypeSpec] = {}
    for name in names:
        spec = element_spec[name]
        if isinstance(spec, tf.RaggedTensorSpec):
            out[name] = tf.RaggedTensorSpec(
                [None, *spec.shape[1:]], spec.dtype, spec.ragged_rank, spec.row_splits_dtype
            )
        else:
            out[name] = tf.TensorSpec([None, *spec.shape[1:]], spec.dtype, name=name)
    return out


def publish(
    exporter: Exporter,
    model: keras.Model,
    step: int,
    offsets: Mapping[int, int | None],
    topic: str,
    inputs: Mapping[str, tf.TypeSpec] | None,
    *,
    announce: bool = True,
) -> str | None:
    """``exporter.export``, timed and logged: the version's directory, or None when it failed
    (an ERROR line: a failed export never stops training). A model with a non-finite weight
    raises ModelDivergedError (never exported). ``announce`` False: the success line is DEBUG
    (a cluster worker's throwaway copy)."""
    t0 = time.monotonic()
    try:
        path = exporter.export(model, step, offsets, topic, inputs=inputs)
    except ModelDivergedError:
        raise
    except Exception as exc:
        log.error("export at step %d failed: %s", step, exc)
        return None
    log.log(
        logging.INFO if announce else logging.DEBUG,
        "exported %s at step %d in %.2fs",
        path,
        step,
        time.monotonic() - t0,
    )
    return path


def _export_with_ragged(model: keras.Model, path: str, inputs: Mapping[str, tf.TypeSpec]) -> None:
    """A SavedModel whose ``serving_default`` takes ragged inputs as values + row lengths."""
    from keras.export import ExportArchive

    ragged = [n for n, spec in inputs.items() if isinstance(spec, tf.RaggedTensorSpec)]
    flat: dict[str, tf.TensorSpec] = {}
    for name, spec in inputs.items():
        if name in ragged:
            flat[name] = tf.TensorSpec([None, *spec.shape[2:]], spec.dtype, name=name)
            lengths = name + ROW_LENGTHS_SUFFIX
            flat[lengths] = tf.TensorSpec([None], tf.int64, name=lengths)
        else:
            flat[name] = spec

    @tf.function(input_signature=[flat])
    def serving_default(features: dict[str, tf.Tensor]) -> Any:
        rebuilt = {n: features[n] for n in inputs}
        for name in ragged:
            # Validated: these come from clients, not from our own decoder.
            rebuilt[name] = tf.RaggedTensor.from_row_lengths(
                features[name], features[name + ROW_LENGTHS_SUFFIX]
            )
        return model(rebuilt, training=False)

    @tf.function(input_signature=[dict(inputs)])
    def serve(features: dict[str, Any]) -> Any:
        return model(features, training=False)

    archive = ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", serving_default)
    archive.add_endpoint("serve", serve)
    archive.write_out(path, verbose=False)


class Exporter:
    """Writes numbered SavedModel versions of a Keras model into ``directory``; keeps ``keep``.

    >>> exporter = Exporter("/models/streamer", keep=3)                   # doctest: +SKIP
    >>> exporter.export(model, step=1000, offsets={0: 5120, 1: 4987}, topic="samples")  # doctest: +SKIP
    '/models/streamer/1000'
    """

    def __init__(
        self, directory: str, keep: int = 3, *, info: Mapping[str, Any] | None = None
    ) -> None:
        """``info``: more entries of every version's streamer.json (a replay says so)."""
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.directory = directory
        self.keep = keep
        self.info = dict(info or {})
        os.makedirs(directory, exist_ok=True)
        # Left over by a crash mid-export or mid-prune: never a version, safe to remove. Only
        # our own names: the directory may hold other people's files.
        for name in os.listdir(directory):
            if _OURS.match(name):
                shutil.rmtree(os.path.join(directory, name), ignore_errors=True)

    def versions(self) -> list[int]:
        """The complete versions this exporter wrote, oldest first: numbered directories with
        its ``assets.extra/streamer.json`` (a ``2019/`` of someone else's is never one, so
        never pruned)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(
            int(n)
            for n in names
            if n.isdigit() and os.path.isfile(os.path.join(self.directory, n, INFO_FILE))
        )

    def latest(self) -> str | None:
        versions = self.versions()
        return os.path.join(self.directory, str(versions[-1])) if versions else None

    def latest_step(self) -> int | None:
        """The training step of the newest version, or None without one (or without its info)."""
        path = self.latest()
        if path is None:
            return None
        try:
            return int(read_info(path)["step"])
        except (OSError, ValueError, KeyError):
            return None

    def export(
        self,
        model: keras.Model,
        step: int,
        offsets: Mapping[int, int | None],
        topic: str,
        *,
        inputs: Mapping[str, tf.TypeSpec] | None = None,
    ) -> str:
        """Write a new version and publish it with one rename; returns its directory.

        ``inputs`` (``serving_inputs(...)``) are the model's input specs; without a ragged one
        (or without ``inputs``) Keras' export writes the signature from the model's inputs.
        A model with a NaN or Inf weight is never exported (ModelDivergedError).
        """
        check_finite_weights(model.variables, what="export", step=step)
        existing = self.versions()
        version = max(int(step), existing[-1] + 1 if existing else 1)
        while os.path.exists(os.path.join(self.directory, str(version))):
            version += 1  # a numbered directory that is not ours stays as it is
        tmp = os.path.join(self.directory, f"{_TMP_PREFIX}{version}-{secrets.token_hex(4)}")
        final = os.path.join(self.directory, str(version))
        t0 = time.monotonic()
        try:
            if inputs and any(isinstance(s, tf.RaggedTensorSpec) for s in inputs.values()):
                _export_with_ragged(model, tmp, inputs)
            else:
                model.export(tmp, format="tf_saved_model", verbose=False)
            os.makedirs(os.path.join(tmp, "assets.extra"), exist_ok=True)
            info = {
                "topic": topic,
                "step": int(step),
                "version": version,
                "offsets": {
                    str(p): None if o is None else int(o) for p, o in sorted(offsets.items())
                },
                "exported_at": time.time(),
                **self.info,
            }
            with open(os.path.join(tmp, INFO_FILE), "w", encoding="utf-8") as fh:
                json.dump(info, fh, indent=1)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.rename(tmp, final)  # atomic: a reader sees all of the version or none of it
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _fsync_dir(self.directory)
        log.debug("exported version %d in %.2fs", version, time.monotonic() - t0)
        self._prune()
        return final

    def _prune(self) -> None:
        versions = self.versions()
        for old in versions[: max(0, len(versions) - self.keep)]:
            path = os.path.join(self.directory, str(old))
            gone = os.path.join(self.directory, f"{_DEL_PREFIX}{old}-{secrets.token_hex(4)}")
            try:
                os.rename(path, gone)  # out of sight first: never a half-deleted version
            except OSError as exc:
                log.warning("could not remove old export %s: %s", path, exc)
                continue
            shutil.rmtree(gone, ignore_errors=True)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
