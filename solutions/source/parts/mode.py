# Small mode trains a narrow WRN-16-1 on a class-balanced subset with a larger learning
# rate, so that a CPU reaches the target accuracy in minutes; full mode is the lab's
# WRN-16-10 on all data with the lab's settings.
MODES = {
    "small": {"widen_factor": 1, "train_size": 6000, "test_size": 1000, "base_lr": 0.05, "target_accuracy": 0.82},
    "full": {"widen_factor": 10, "train_size": 0, "test_size": 0, "base_lr": 0.01, "target_accuracy": 0.85},
}


def apply_mode(args: argparse.Namespace) -> argparse.Namespace:
    """Resolve --mode auto (full with a GPU, else small) and fill the settings left unset."""
    if args.mode == "auto":
        args.mode = "full" if tf.config.list_physical_devices("GPU") else "small"
    for key, value in MODES[args.mode].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args
