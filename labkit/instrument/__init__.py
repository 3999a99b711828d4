"""Code that runs inside or beside the learner's processes: the observer, the checks' probes, the data set and
the plain workloads the measurements start."""
