"""Helpers the tests share: the repository's folders, a browser on JupyterLab, an sshd on the loopback address,
the probe cases the checks' judges are tested on, a virtual environment without labkit."""
