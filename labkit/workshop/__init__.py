"""A workshop for a class: JupyterHub with learner accounts, the course per learner, and the class view.

Between :mod:`labkit.cli` and :mod:`labkit.ui` in the layers. ``labkit workshop up|status|down`` and
``labkit class status`` (:mod:`labkit.cli.workshop`); the class records themselves are written by
:mod:`labkit.records.classlog`, which checks and the assessment call. Imports nothing at import time.
"""
