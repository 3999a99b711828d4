def load_fashion_mnist(train_size: int, test_size: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """The first train_size/test_size images (0: all) as (N, 28, 28, 1) uint8, with integer labels.

    The files are shuffled by their authors, so a leading slice is class balanced.
    """
    try:
        (x_train, y_train), (x_test, y_test) = tf.keras.datasets.fashion_mnist.load_data()
    except Exception as e:  # no cached copy and no download: say how to get the files
        sys.exit(f"Fashion-MNIST could not be loaded: {type(e).__name__}: {e}\n"
                 "tf.keras.datasets.fashion_mnist.load_data() reads ~/.keras/datasets/fashion-mnist and\n"
                 "downloads the four files there when they are missing. Without internet access, copy\n"
                 "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and\n"
                 "t10k-labels-idx1-ubyte.gz into that folder (Debian/Ubuntu: apt-get install\n"
                 "dataset-fashion-mnist puts them in /usr/share/datasets/fashion-mnist).")
    if train_size:
        x_train, y_train = x_train[:train_size], y_train[:train_size]
    if test_size:
        x_test, y_test = x_test[:test_size], y_test[:test_size]
    return (x_train[..., None], y_train), (x_test[..., None], y_test)


def standardize(mean: float, std: float):
    """A tf.data map function: images to zero mean and unit variance, labels to one-hot."""

    def fn(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return (tf.cast(x, tf.float32) - mean) / std, tf.one_hot(tf.cast(y, tf.int32), 10)

    return fn


def augment(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Random horizontal flips and shifts of up to 20% (nearest-pixel fill) of a batch of images."""
    n, h, w = tf.shape(x)[0], 28, 28
    x = tf.where(tf.random.uniform([n, 1, 1, 1]) < 0.5, tf.reverse(x, axis=[2]), x)
    dy = tf.random.uniform([n], -(h // 5), h // 5 + 1, dtype=tf.int32)
    dx = tf.random.uniform([n], -(w // 5), w // 5 + 1, dtype=tf.int32)
    rows = tf.clip_by_value(tf.range(h)[None, :] - dy[:, None], 0, h - 1)
    cols = tf.clip_by_value(tf.range(w)[None, :] - dx[:, None], 0, w - 1)
    x = tf.gather(x, rows, axis=1, batch_dims=1)
    return tf.gather(x, cols, axis=2, batch_dims=1), y
