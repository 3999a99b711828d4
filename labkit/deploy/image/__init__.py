"""The course's container image: a Debian root file system from ``mmdebstrap`` with the project's
Python environment, Horovod built with the project's patch, OpenMPI, ssh and Fashion-MNIST, imported
into podman (``labkit image build``). :mod:`.recipe` holds what goes in and the commands (argument
lists), :mod:`.build` runs them, :mod:`.cli` is the command line."""
