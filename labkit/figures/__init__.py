"""Figures drawn from records: scaling plots, views of what the ranks did, Horovod's timeline,
the lab's small models."""
