"""Grading a learner's checkout (``labkit grade``), its reports for CI, and the final
assessment with its calibrated budget."""
