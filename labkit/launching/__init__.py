"""Starting a command on N workers: the launchers (mpirun, horovodrun, ssh, Slurm) behind one interface, their table,
host lists, the per-rank wrapper and ipyparallel engines."""
