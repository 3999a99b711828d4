"""What the notebooks show and call: quick mode and unchanged-script reuse, the live dashboard,
the virtual-node cells."""
