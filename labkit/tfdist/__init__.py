"""tf.distribute clusters of processes (chief, workers, parameter servers): started, followed, faulted and torn down."""
