#% step 11
def wide_resnet(widen_factor: int, weight_decay: float, num_classes: int = 10,
                norm: type | None = None) -> tf.keras.Model:
    """WideResNet-16-k for 28x28 grey images: 16k/32k/64k channels (k=10: 160/320/640); ``norm``: the
    batch-normalisation layer (default: Keras's BatchNormalization)."""
    layers = tf.keras.layers
    norm = norm or layers.BatchNormalization
#% else
def wide_resnet(widen_factor: int, weight_decay: float, num_classes: int = 10) -> tf.keras.Model:
    """WideResNet-16-k for 28x28 grey images: 16k/32k/64k channels (k=10: 160/320/640)."""
    layers = tf.keras.layers
#% end
    l2 = tf.keras.regularizers.l2(weight_decay) if weight_decay else None

    def cbr(x: tf.Tensor, filters: int) -> tf.Tensor:  # convolution, batch norm, ReLU
#% step 11
        conv = layers.Conv2D(filters, 3, padding="same", kernel_regularizer=l2)
        x = conv(x)
        # momentum 0.9: the moving statistics settle within the ~100 steps of a small-mode epoch; a name of its
        # own after its convolution's (Horovod's SyncBatchNormalization gives every instance the same one)
        x = norm(momentum=0.9, name=f"{conv.name}_bn")(x)
#% else
        x = layers.Conv2D(filters, 3, padding="same", kernel_regularizer=l2)(x)
        # momentum 0.9: the moving statistics settle within the ~100 steps of a small-mode epoch
        x = layers.BatchNormalization(momentum=0.9)(x)
#% end
        return layers.Activation("relu")(x)

    def block(x: tf.Tensor, filters: int, project: bool = False) -> tf.Tensor:
        shortcut = layers.Conv2D(filters, 1, padding="same", kernel_regularizer=l2)(x) if project else x
        y = cbr(x, filters)
        y = layers.Dropout(0.01)(y)
        y = cbr(y, filters)
        return layers.Add()([shortcut, y])

    inputs = layers.Input(shape=(28, 28, 1))
    x = cbr(inputs, 16)
    for i, width in enumerate((16 * widen_factor, 32 * widen_factor, 64 * widen_factor)):
        if i:
            x = layers.MaxPooling2D(2)(x)
        x = block(x, width, project=True)
        x = block(x, width)
    x = layers.GlobalAveragePooling2D()(x)
#% step 12
    # float32 output: the softmax and the loss stay in full precision whatever the layers compute in
    outputs = layers.Dense(num_classes, activation="softmax", kernel_regularizer=l2, dtype="float32")(x)
#% else
    outputs = layers.Dense(num_classes, activation="softmax", kernel_regularizer=l2)(x)
#% end
    return tf.keras.Model(inputs, outputs, name=f"wrn_16_{widen_factor}")
