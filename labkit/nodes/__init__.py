"""Machines to launch on without a cluster: virtual nodes (namespaces, a bridge, sshd and slurmd
per node) on this one."""
