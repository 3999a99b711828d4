"""The one way labkit changes library behaviour inside a learner's process: one small module per entry point
(``fit``, ``arguments``, ``coordinator``, ``dataset``, ``conv``), each installed once and shared by every probe of
the process (:mod:`labkit.instrument.observe`, :mod:`labkit.instrument.probe`, :mod:`labkit.instrument.dprobe`).
A hook keeps no state of its own: its listeners are the rank's observer's (:mod:`labkit.instrument.observer`)."""
