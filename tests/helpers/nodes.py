"""Whether virtual nodes can be brought up here for a test."""

from __future__ import annotations

import os

from labkit.nodes import net


def nodes_problem() -> str | None:
    """Why virtual nodes with a rate-limited link cannot start here (None when they can)."""
    if os.geteuid() != 0:
        return "virtual nodes need root"
    if net.missing_tools(rate=True):
        return f"{', '.join(net.missing_tools(rate=True))} not installed"
    if net.netns_names() or net.link_exists(net.BRIDGE):
        return "virtual nodes are already up on this machine"
    return None
