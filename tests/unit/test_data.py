"""labkit.instrument.data: finding and validating Fashion-MNIST offline, loading, and the tf.data pipeline."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from labkit.instrument import data

IMAGE_MAGIC, LABEL_MAGIC = 2051, 2049
SMALL = {"train": 60, "test": 20}


def write_idx(path: Path, array: np.ndarray, magic: int) -> Path:
    """Write ``array`` (uint8) as a gzipped IDX file: magic, one big-endian uint32 per dimension, data."""
    header = struct.pack(">I", magic) + struct.pack(">" + "I" * array.ndim, *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())
    return path


def write_dataset(folder: Path, n_train: int = SMALL["train"], n_test: int = SMALL["test"], seed: int = 0) -> dict:
    """The four Fashion-MNIST files in ``folder``; image i of a split has pixel [0, 0] == i."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for split, n in (("train", n_train), ("test", n_test)):
        x = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        x[:, 0, 0] = np.arange(n) % 256
        arrays[f"{split}_images"] = x
        arrays[f"{split}_labels"] = (np.arange(n) % 10).astype(np.uint8)
    for key, (name, magic, _) in data.FILES.items():
        write_idx(folder / name, arrays[key], magic)
    return arrays


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No data anywhere: LABKIT_DATA unset, an empty home (Keras cache), no system package."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("LABKIT_DATA", raising=False)
    monkeypatch.setattr(data, "SYSTEM_DIR", tmp_path / "no-system-package")
    return tmp_path


@pytest.fixture
def small_files(isolated, monkeypatch):
    """data.FILES with small shapes, so that small fake files count as valid."""
    files = {
        "train_images": ("train-images-idx3-ubyte.gz", IMAGE_MAGIC, (SMALL["train"], 28, 28)),
        "train_labels": ("train-labels-idx1-ubyte.gz", LABEL_MAGIC, (SMALL["train"],)),
        "test_images": ("t10k-images-idx3-ubyte.gz", IMAGE_MAGIC, (SMALL["test"], 28, 28)),
        "test_labels": ("t10k-labels-idx1-ubyte.gz", LABEL_MAGIC, (SMALL["test"],)),
    }
    monkeypatch.setattr(data, "FILES", files)
    return isolated


@pytest.fixture
def fake(small_files, monkeypatch):
    """A valid small data set in $LABKIT_DATA; returns (folder, arrays)."""
    folder = small_files / "fmnist"
    arrays = write_dataset(folder)
    monkeypatch.setenv("LABKIT_DATA", str(folder))
    return folder, arrays


# ------------------------------------------------------------------ finding and validating


def test_files_table_matches_the_real_data_set():
    assert {name for name, _, _ in data.FILES.values()} == {
        "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz",
    }
    assert data.FILES["train_images"][1:] == (IMAGE_MAGIC, (60000, 28, 28))
    assert data.FILES["test_labels"][1:] == (LABEL_MAGIC, (10000,))


def test_find_and_locate_use_labkit_data(fake):
    folder, _ = fake
    assert data.candidate_dirs()[0] == folder
    assert data.find() == folder
    assert data.locate() == folder


def test_labkit_data_comes_before_the_keras_cache(fake, monkeypatch):
    folder, _ = fake
    cache = data.keras_cache_dir(create=True)
    write_dataset(cache, seed=1)
    assert data.find() == folder
    monkeypatch.delenv("LABKIT_DATA")
    assert data.find() == cache


def test_incomplete_folder_is_skipped(fake):
    folder, _ = fake
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    assert data.find() is None


def test_truncated_gzip_is_a_data_error(fake):
    folder, _ = fake
    path = folder / "train-images-idx3-ubyte.gz"
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(data.DataError, match="damaged") as e:
        data.find()
    assert "train-images-idx3-ubyte.gz" in str(e.value)
    assert "LABKIT_DATA" in str(e.value)  # says how to get a good copy
    with pytest.raises(data.DataError):
        data.load(10, 5)


def test_bad_header_is_a_data_error(fake):
    folder, arrays = fake
    # A labels file that claims to hold images.
    write_idx(folder / "train-labels-idx1-ubyte.gz", arrays["train_labels"], IMAGE_MAGIC)
    with pytest.raises(data.DataError, match="bad header"):
        data.locate()


def test_wrong_shape_is_a_data_error(fake):
    folder, arrays = fake
    write_idx(folder / "t10k-images-idx3-ubyte.gz", arrays["test_images"][:-1], IMAGE_MAGIC)
    with pytest.raises(data.DataError, match="expected"):
        data.find()


def test_damaged_copy_is_not_used_when_a_good_one_exists(fake):
    folder, _ = fake
    good = data.keras_cache_dir(create=True)
    write_dataset(good)
    path = folder / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-7])
    assert data.find() == good
    assert data.locate() == good


def test_missing_data_says_how_to_get_it(isolated):
    assert data.find() is None
    with pytest.raises(data.DataError) as e:
        data.locate()
    message = str(e.value)
    assert "not found" in message
    assert "apt-get install dataset-fashion-mnist" in message
    assert "LABKIT_DATA" in message
    for folder in data.candidate_dirs():
        assert str(folder) in message


def test_fill_keras_cache_makes_keras_load_data_work(fake, tmp_path, monkeypatch):
    import tensorflow as tf

    folder, arrays = fake
    # tf-keras' get_file() ignores KERAS_HOME: the files must land in ~/.keras.
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras-home"))
    dest = data.fill_keras_cache()
    assert dest == Path.home() / ".keras" / "datasets" / "fashion-mnist"
    assert sorted(p.name for p in dest.iterdir()) == sorted(name for name, _, _ in data.FILES.values())
    assert data.fill_keras_cache(folder) == dest  # second run: nothing to copy, same answer

    (x_train, y_train), (x_test, y_test) = tf.keras.datasets.fashion_mnist.load_data()
    np.testing.assert_array_equal(x_train, arrays["train_images"])
    np.testing.assert_array_equal(y_train, arrays["train_labels"])
    np.testing.assert_array_equal(x_test, arrays["test_images"])
    np.testing.assert_array_equal(y_test, arrays["test_labels"])


# ------------------------------------------------------------------ loading


def test_load_everything(fake):
    _, arrays = fake
    train, test = data.load()
    assert len(train) == SMALL["train"] and len(test) == SMALL["test"]
    np.testing.assert_array_equal(train.x, arrays["train_images"])
    np.testing.assert_array_equal(test.y, arrays["test_labels"])
    assert train.x.dtype == np.uint8 and train.y.dtype == np.int64


def test_load_subsets_and_offsets(fake):
    _, arrays = fake
    train, test = data.load(train_size=10, test_size=4, offset=3)
    np.testing.assert_array_equal(train.x, arrays["train_images"][3:13])
    np.testing.assert_array_equal(train.y, arrays["train_labels"][3:13])
    np.testing.assert_array_equal(test.x[:, 0, 0], [3, 4, 5, 6])
    # Offsets wrap around the end of a split.
    train, _ = data.load(train_size=5, test_size=1, offset=SMALL["train"] - 2)
    np.testing.assert_array_equal(train.x[:, 0, 0], [58, 59, 0, 1, 2])
    with pytest.raises(ValueError, match="only"):
        data.load(train_size=SMALL["train"] + 1)


def test_stats_are_mean_and_std():
    x = np.array([[0, 0], [255, 255]], dtype=np.uint8)
    mean, std = data.stats(x)
    assert mean == pytest.approx(127.5)
    assert std == pytest.approx(127.5)


@pytest.mark.skipif(not (data.SYSTEM_DIR / data.FILES["train_images"][0]).exists(),
                    reason="Debian's dataset-fashion-mnist is not installed")
def test_real_data_set(monkeypatch):
    monkeypatch.setenv("LABKIT_DATA", str(data.SYSTEM_DIR))
    train, test = data.load(train_size=1000, test_size=200)
    assert train.x.shape == (1000, 28, 28) and test.x.shape == (200, 28, 28)
    assert set(np.unique(train.y)) == set(range(10))
    # The authors shuffled the files, so a leading slice is roughly class balanced.
    assert np.bincount(train.y, minlength=10).min() >= 70
    mean, std = data.stats(train.x)
    assert 60 < mean < 90 and 80 < std < 100


# ------------------------------------------------------------------ the tf.data pipeline


def make_split(n: int, seed: int = 0) -> data.Split:
    rng = np.random.default_rng(seed)
    return data.Split(rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8), np.arange(n, dtype=np.int64) % 10)


def batches(ds) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(x.numpy(), y.numpy()) for x, y in ds]


def test_batches_have_the_right_shapes_and_one_hot_labels():
    split = make_split(50)
    mean, std = data.stats(split.x)
    out = batches(data.dataset(split, 16, training=False, mean=mean, std=std, repeat=False))
    assert [len(y) for _, y in out] == [16, 16, 16, 2]  # evaluation keeps the partial batch
    x, y = out[0]
    assert x.shape == (16, 28, 28, 1) and x.dtype == np.float32
    assert y.shape == (16, 10)
    np.testing.assert_array_equal(y.sum(axis=1), np.ones(16))
    np.testing.assert_array_equal(y.argmax(axis=1), split.y[:16])

    train = batches(data.dataset(split, 16, training=True, mean=mean, std=std, repeat=False, seed=0))
    assert [len(y) for _, y in train] == [16, 16, 16]  # training drops it
    assert all(x.shape == (16, 28, 28, 1) for x, _ in train)


def test_repeat_keeps_going():
    split = make_split(10)
    ds = data.dataset(split, 4, training=False, mean=0.0, std=1.0)
    assert len(list(ds.take(7))) == 7


def test_evaluation_batches_are_standardised():
    split = make_split(200)
    mean, std = data.stats(split.x)
    x = np.concatenate([x for x, _ in batches(data.dataset(split, 64, False, mean, std, repeat=False))])
    assert x.shape == (200, 28, 28, 1)
    assert abs(float(x.mean())) < 1e-3
    assert float(x.std()) == pytest.approx(1.0, abs=1e-3)
    np.testing.assert_allclose(x[..., 0], (split.x - mean) / std, rtol=1e-5, atol=1e-5)


def test_augmentation_changes_images_but_keeps_shape_and_pixels():
    split = make_split(10)  # labels 0..9: each image is identified by its label
    mean, std = data.stats(split.x)
    (x, y), = batches(data.dataset(split, 10, training=True, mean=mean, std=std, repeat=False, seed=0))
    assert x.shape == (10, 28, 28, 1)
    changed = 0
    for image, label in zip(x[..., 0], y.argmax(axis=1), strict=True):
        original = ((split.x[label] - mean) / std).astype(np.float32)
        # Flips and shifts with nearest-edge fill only move pixels around.
        assert np.isin(image, original).all()
        changed += not np.allclose(image, original)
    assert changed >= 8


def test_random_shifts_are_independent_and_at_most_20_percent():
    n = 64
    x = np.zeros((n, 28, 28), dtype=np.uint8)
    x[:, 14, 14] = 255  # one bright pixel: its position shows the flip and the shift
    split = data.Split(x, np.zeros(n, dtype=np.int64))
    (out, _), = batches(data.dataset(split, n, training=True, mean=0.0, std=1.0, repeat=False, seed=3))
    rows, cols = np.unravel_index(out[..., 0].reshape(n, -1).argmax(axis=1), (28, 28))
    dy = rows - 14
    dx_or_flipped = cols - 14  # a flip moves column 14 to 13
    assert np.abs(dy).max() <= 5 and np.abs(dx_or_flipped).max() <= 6
    assert len(set(dy)) > 3
    assert len(set(dy - dx_or_flipped)) > 2  # not diagonal shifts only


def test_shards_are_disjoint_and_cover_the_split():
    n = 20
    x = np.repeat(np.arange(n, dtype=np.uint8), 28 * 28).reshape(n, 28, 28)  # image i is all i
    split = data.Split(x, np.arange(n, dtype=np.int64) % 10)
    seen = []
    for index in range(2):
        ds = data.dataset(split, 4, training=False, mean=0.0, std=1.0, shard=(2, index), repeat=False)
        seen.append({int(v) for xb, _ in batches(ds) for v in xb[:, 0, 0, 0]})
    assert len(seen[0]) == len(seen[1]) == n // 2
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == set(range(n))
    with pytest.raises(ValueError, match="shard index"):
        data.dataset(split, 4, training=False, mean=0.0, std=1.0, shard=(2, 2))
