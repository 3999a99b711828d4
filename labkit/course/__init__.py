"""The course itself: the lab registry, the step scripts generated from templates, and the learner's released copy."""
