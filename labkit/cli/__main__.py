"""``python -m labkit.cli ARGS``: the same as the ``labkit`` command."""

from labkit.cli.main import main

raise SystemExit(main())
