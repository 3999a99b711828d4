"""Fashion-MNIST, found offline, validated, and fed through a tf.data pipeline.

Search order for the four ``*-ubyte.gz`` files: ``$LABKIT_DATA``, the Keras cache
(``~/.keras/datasets/fashion-mnist``; tf-keras ignores ``$KERAS_HOME`` there), then
Debian's ``dataset-fashion-mnist`` package (``/usr/share/datasets/fashion-mnist``).
"""

from __future__ import annotations

import functools
import gzip
import os
import shutil
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from labkit.core import contract

FILES = {
    "train_images": ("train-images-idx3-ubyte.gz", 2051, (60000, 28, 28)),
    "train_labels": ("train-labels-idx1-ubyte.gz", 2049, (60000,)),
    "test_images": ("t10k-images-idx3-ubyte.gz", 2051, (10000, 28, 28)),
    "test_labels": ("t10k-labels-idx1-ubyte.gz", 2049, (10000,)),
}
SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
CLASS_NAMES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]
HOW_TO_GET = (
    "How to get Fashion-MNIST:\n"
    "  * Debian/Ubuntu: sudo apt-get install dataset-fashion-mnist   (or run `make setup`)\n"
    "  * with internet access: python -c 'import labkit.instrument.data as d; d.download()'\n"
    "  * or copy the four files (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz,\n"
    "    t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) into a folder and\n"
    "    set LABKIT_DATA=/path/to/that/folder"
)


class DataError(RuntimeError):
    """The data set is missing or damaged; the message says how to fix it."""


@dataclass(frozen=True)
class Split:
    """Images (N, 28, 28) uint8 and integer labels (N,) of one split."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)


def keras_cache_dir(create: bool = False) -> Path:
    """Where ``tf.keras.datasets.fashion_mnist.load_data()`` looks for its files.

    This mirrors tf-keras' ``get_file``: ``~/.keras`` whatever ``$KERAS_HOME`` says,
    or ``/tmp/.keras`` when ``~/.keras`` is not writable (or does not exist).
    ``create`` makes ``~/.keras/datasets/fashion-mnist`` first when it can.
    """
    base = Path(os.path.expanduser("~")) / ".keras"
    if create:
        try:
            (base / "datasets" / "fashion-mnist").mkdir(parents=True, exist_ok=True)
        except OSError:
            pass
    if not os.access(base, os.W_OK):
        base = Path("/tmp") / ".keras"
    return base / "datasets" / "fashion-mnist"


def candidate_dirs() -> list[Path]:
    """Folders searched for the data set, in order."""
    dirs = []
    if contract.settings().data:
        dirs.append(Path(contract.settings().data).expanduser())
    dirs += [keras_cache_dir(), SYSTEM_DIR]
    return dirs


def _read_idx(path: Path, magic: int, shape: tuple[int, ...]) -> np.ndarray:
    """Read one gzipped IDX file, checking header, size and gzip integrity."""
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{path} is damaged ({e}). Delete it and get the data again.\n{HOW_TO_GET}") from e
    header = 8 if len(shape) == 1 else 16
    if len(raw) < header or struct.unpack(">I", raw[:4])[0] != magic:
        raise DataError(f"{path} is not a Fashion-MNIST IDX file (bad header).\n{HOW_TO_GET}")
    dims = struct.unpack(">" + "I" * len(shape), raw[4:header])
    if tuple(dims) != shape or len(raw) != header + int(np.prod(shape)):
        raise DataError(f"{path} has shape {dims} and {len(raw)} bytes; expected {shape}.\n{HOW_TO_GET}")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(shape)


def find(validate: bool = True) -> Path | None:
    """First folder holding all four files (validated when asked), or None."""
    problems = []
    for d in candidate_dirs():
        if all((d / name).is_file() for name, _, _ in FILES.values()):
            if not validate:
                return d
            try:
                for name, magic, shape in FILES.values():
                    _read_idx(d / name, magic, shape)
                return d
            except DataError as e:
                problems.append(str(e).split("\n")[0])
    if problems:
        raise DataError("Fashion-MNIST files found but damaged:\n  " + "\n  ".join(problems) + "\n" + HOW_TO_GET)
    return None


def locate(validate: bool = True) -> Path:
    """Like :func:`find` but raises a :class:`DataError` saying how to get the data."""
    d = find(validate)
    if d is None:
        looked = "\n".join(f"  - {p}" for p in candidate_dirs())
        raise DataError(f"Fashion-MNIST was not found. Looked in:\n{looked}\n{HOW_TO_GET}")
    return d


def fill_keras_cache(source: Path | None = None) -> Path:
    """Copy the files into the Keras cache so ``fashion_mnist.load_data()`` works offline."""
    source = source or locate()
    dest = keras_cache_dir(create=True)
    dest.mkdir(parents=True, exist_ok=True)
    for name, _, _ in FILES.values():
        target = dest / name
        if source.resolve() != dest.resolve() and (
            not target.exists() or target.stat().st_size != (source / name).stat().st_size
        ):
            tmp = target.with_suffix(".part")
            shutil.copyfile(source / name, tmp)
            os.replace(tmp, target)
    return dest


def download() -> Path:
    """Fetch the files with Keras' own downloader (needs internet access)."""
    import tensorflow as tf

    try:
        tf.keras.datasets.fashion_mnist.load_data()
    except Exception as e:  # noqa: BLE001 - network errors come in many types
        raise DataError(f"Download failed ({e}).\n{HOW_TO_GET}") from e
    return keras_cache_dir()


@functools.lru_cache(maxsize=4)
def _splits(folder: str) -> tuple[Split, Split]:
    """The train and test splits of the files in ``folder``, read once per process (:class:`DataError` for a
    damaged file)."""
    arrays = {k: _read_idx(Path(folder) / name, magic, shape) for k, (name, magic, shape) in FILES.items()}
    return (Split(arrays["train_images"], arrays["train_labels"].astype(np.int64)),
            Split(arrays["test_images"], arrays["test_labels"].astype(np.int64)))


def load(train_size: int | None = None, test_size: int | None = None, offset: int = 0) -> tuple[Split, Split]:
    """Train and test splits, optionally the subset ``[offset, offset + size)`` of each.

    The files are shuffled by their authors, so a leading slice is class balanced.
    """
    # Reading validates each file, so the folder is not validated (decompressed) twice;
    # only when its files turn out damaged is a fully validated folder looked for.
    try:
        train, test = _splits(str(locate(validate=False)))
    except DataError:
        train, test = _splits(str(locate()))
    return _subset(train, train_size, offset), _subset(test, test_size, offset)


def _subset(split: Split, size: int | None, offset: int) -> Split:
    if size is None or size <= 0:
        return split
    if size > len(split):
        raise ValueError(f"asked for {size} examples but the split has only {len(split)}")
    idx = (np.arange(size) + offset) % len(split)
    return Split(split.x[idx], split.y[idx])


def stats(x: np.ndarray) -> tuple[float, float]:
    """Feature-wise mean and std of uint8 images (one channel), in [0, 255] units."""
    xf = x.astype(np.float32)
    return float(xf.mean()), float(xf.std() + 1e-7)


def dataset(
    split: Split,
    batch_size: int,
    training: bool,
    mean: float,
    std: float,
    shard: tuple[int, int] | None = None,
    repeat: bool = True,
    seed: int | None = None,
) -> Any:
    """A ``tf.data.Dataset`` of standardised ``(images, one-hot labels)`` batches.

    Training batches are shuffled and augmented the way the lab's
    ``ImageDataGenerator`` did: random horizontal flip and shifts of up to 20% of
    the width and height (nearest-pixel fill). ``shard=(num_workers, index)``
    keeps every ``num_workers``-th example for worker ``index``.
    """
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((split.x[..., None], split.y))
    if shard is not None:
        num, index = shard
        if not 0 <= index < num:
            raise ValueError(f"shard index {index} is outside 0..{num - 1}")
        ds = ds.shard(num, index)
    if training:
        ds = ds.shuffle(min(len(split), 10_000), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    ds = ds.batch(batch_size, drop_remainder=training)

    def prep(x: Any, y: Any) -> Any:
        x = (tf.cast(x, tf.float32) - mean) / std
        if training:
            x = _augment(x, seed)
        return x, tf.one_hot(y, 10)

    ds = ds.map(prep, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def _augment(x: Any, seed: int | None) -> Any:
    """Random horizontal flip and integer shifts up to 20%, with nearest fill."""
    import tensorflow as tf

    n = tf.shape(x)[0]
    h, w = 28, 28
    # One op seed each: in a graph, ops with equal seeds draw equal numbers (dx == dy).
    s_flip, s_dy, s_dx = (None, None, None) if seed is None else (seed, seed + 1, seed + 2)
    x = tf.where(tf.random.uniform([n, 1, 1, 1], seed=s_flip) < 0.5, tf.reverse(x, axis=[2]), x)
    max_dy, max_dx = int(0.2 * h), int(0.2 * w)
    dy = tf.random.uniform([n], -max_dy, max_dy + 1, dtype=tf.int32, seed=s_dy)
    dx = tf.random.uniform([n], -max_dx, max_dx + 1, dtype=tf.int32, seed=s_dx)
    # Gather rows/columns from clipped, shifted index grids: nearest-edge fill.
    rows = tf.clip_by_value(tf.range(h)[None, :] - dy[:, None], 0, h - 1)
    cols = tf.clip_by_value(tf.range(w)[None, :] - dx[:, None], 0, w - 1)
    x = tf.gather(x, rows, axis=1, batch_dims=1)
    x = tf.gather(x, cols, axis=2, batch_dims=1)
    return x
