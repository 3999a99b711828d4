"""labkit: launch, check, record and plot the distributed-training labs."""

from labkit import env as _env

_env.apply_defaults()

__version__ = "0.1.0"
