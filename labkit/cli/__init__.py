"""The ``labkit`` command line: one module per command group; each parses its arguments and calls the layers below."""
