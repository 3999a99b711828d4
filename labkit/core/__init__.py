"""What every layer uses: the environment contract, the process layer, output and progress, atomic files, TF_CONFIG,
stack dumps, import hooks and command-line argument types. Imports nothing else of labkit."""
