"""The one way labkit changes library behaviour inside a learner's process: one small module per entry point
(``fit``, ``arguments``, ``dataset``, ``conv``), each installed once and shared by every observer of the process
(:mod:`labkit.instrument.observe`, :mod:`labkit.instrument.probe`, :mod:`labkit.instrument.dprobe`)."""
