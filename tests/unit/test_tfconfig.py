"""TF_CONFIG builders: pure functions, no TensorFlow."""

from __future__ import annotations

import json
import socket

import pytest

from labkit.core import tfconfig as tc


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = tc.free_ports(5)
    assert len(set(ports)) == 5
    assert all(tc.port_is_free(p) for p in ports)


def test_port_is_free_sees_a_bound_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert not tc.port_is_free(s.getsockname()[1])


def test_cluster_spec_local_layout() -> None:
    spec = tc.cluster_spec(workers=2, ps=1, chief=True)
    assert list(spec) == ["chief", "worker", "ps"]
    assert [len(spec[k]) for k in spec] == [1, 2, 1]
    assert all(a.startswith("localhost:") for v in spec.values() for a in v)
    assert len(set(tc.ports(spec))) == 4


def test_cluster_spec_with_hosts_keeps_order() -> None:
    spec = tc.cluster_spec(workers=2, ps=1, hosts=["a:1", "b:2", "c:3"])
    assert spec == {"worker": ["a:1", "b:2"], "ps": ["c:3"]}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"workers": 0}, "at least one worker"),
        ({"workers": -1}, "whole number"),
        ({"workers": 2, "hosts": ["a:1"]}, "one per task"),
        ({"workers": 2, "hosts": ["a:1", "a:1"]}, "repeated"),
        ({"workers": 1, "hosts": ["nohostport"]}, "host:port"),
        ({"workers": 1, "hosts": ["a:70000"]}, "host:port"),
    ],
)
def test_cluster_spec_rejects_bad_input(kwargs: dict, match: str) -> None:
    with pytest.raises(tc.ClusterError, match=match):
        tc.cluster_spec(**kwargs)


def test_tf_config_round_trip() -> None:
    spec = {"worker": ["localhost:1111", "localhost:2222"]}
    value = tc.tf_config(spec, "worker", 1)
    assert json.loads(value) == {"cluster": spec, "task": {"type": "worker", "index": 1}}
    assert tc.parse(value) == (spec, "worker", 1)


@pytest.mark.parametrize(
    ("cluster", "task", "index", "match"),
    [
        ({"worker": ["a:1"]}, "ps", 0, "not in the cluster"),
        ({"worker": ["a:1"]}, "worker", 1, "index must be in 0..0"),
        ({"boss": ["a:1"]}, "boss", 0, "unknown task type"),
        ({"worker": "a:1"}, "worker", 0, "non-empty list"),
        ({"chief": ["a:1", "b:2"]}, "chief", 0, "at most one chief"),
        ({}, "worker", 0, "non-empty dict"),
    ],
)
def test_tf_config_rejects_bad_input(cluster: dict, task: str, index: int, match: str) -> None:
    with pytest.raises(tc.ClusterError, match=match):
        tc.tf_config(cluster, task, index)


def test_tasks_and_chief() -> None:
    spec = {"ps": ["a:3"], "worker": ["a:1", "a:2"], "chief": ["a:9"]}
    assert tc.tasks(spec) == [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]
    assert tc.chief_task(spec) == ("chief", 0)
    assert tc.chief_task({"worker": ["a:1"]}) == ("worker", 0)


def test_parse_rejects_garbage() -> None:
    with pytest.raises(tc.ClusterError, match="not a TF_CONFIG"):
        tc.parse("{}")


def test_serving_tells_a_listening_task_from_a_closed_port() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert tc.serving(f"127.0.0.1:{port}")
    assert not tc.serving(f"127.0.0.1:{port}")
    with pytest.raises(tc.ClusterError):
        tc.serving("no-port-here")
