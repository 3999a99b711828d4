"""labkit: launch, check, record and plot the distributed-training labs.

The layers, top to bottom (each imports only those below it; ``.importlinter`` holds the contract):
cli > workshop > ui > grading > check, deploy > measure > figures > tfdist > launching > nodes > instrument > records >
course > core. See docs/architecture.md.
"""

__version__ = "0.1.0"
