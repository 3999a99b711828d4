"""Behaviour checks of learners scripts."""
