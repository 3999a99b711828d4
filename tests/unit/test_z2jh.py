"""A class's JupyterHub on Kubernetes (labkit.deploy.z2jh, `labkit workshop k8s`): the values are valid for the
pinned chart's own schema, wrong values fail naming what is wrong, the options show in the values, the first start
never overwrites a learner's course (the script run with sh), and the command writes and checks files. No cluster."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from labkit.cli import main as cli
from labkit.deploy import z2jh, z2jh_files

OPTS = z2jh.HubOptions(image="registry.example.org/course/labkit:0.1.0")
SECRETS = z2jh.secret_values("class-password", "i" * 40)


def _labkit(*argv: str) -> int:
    return cli.main(["workshop", "k8s", *argv])


def _expand(value: Any, **names: str) -> Any:
    """What KubeSpawner does to every string of an init container and a volume mount: str.format with the user's
    names."""
    if isinstance(value, str):
        return value.format(**names)
    if isinstance(value, list):
        return [_expand(v, **names) for v in value]
    if isinstance(value, dict):
        return {k: _expand(v, **names) for k, v in value.items()}
    return value


# ----------------------------------------------------------------------------- the pinned schema


def test_the_stored_schema_is_the_charts_and_its_defaults_are_valid():
    import jsonschema

    schema = z2jh.schema()
    jsonschema.Draft7Validator.check_schema(schema)
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert "description" not in schema and "description" not in schema["properties"]["singleuser"]
    assert z2jh.schema_problems(z2jh.defaults()) == []
    note = (Path(z2jh.__file__).parent / "k8s_schemas" / "jupyterhub" / "SOURCES.md").read_text()
    assert z2jh.CHART_VERSION in note and "5c5f5df751588a68a7781ead01d0f62e88e2e72f" in note


def test_written_values_validate_against_the_charts_schema():
    for opts in (OPTS, z2jh.HubOptions(), z2jh.HubOptions(image="reg:5000/x/labkit:1.2", cores=0.5, memory="1.5G",
                                                          learners=30, subdomain_host="https://hub.example.org")):
        merged = z2jh.validate(z2jh.values(opts), SECRETS)
        assert merged["proxy"] == z2jh.defaults()["proxy"]  # the chart's defaults kept where labkit says nothing
    # as YAML and back: what the instructor hands to helm
    assert z2jh.validate(yaml.safe_load(z2jh_files.to_yaml(z2jh.values(OPTS))), SECRETS)


def test_helm_merge_maps_key_by_key_replaces_lists_and_null_removes():
    base = {"a": {"x": 1, "y": [1, 2]}, "b": 2}
    assert z2jh.merge(base, {"a": {"y": [3]}, "b": None}) == {"a": {"x": 1, "y": [3]}}
    assert base == {"a": {"x": 1, "y": [1, 2]}, "b": 2}


# ----------------------------------------------------------------------------- wrong values


def _problems(*documents: dict) -> list[str]:
    with pytest.raises(z2jh.ValuesError) as caught:
        z2jh.validate(z2jh.values(OPTS), SECRETS, *documents)
    return caught.value.errors


def test_a_wrong_type_is_named_with_what_the_chart_wants():
    errors = _problems({"singleuser": {"cpu": {"limit": "2"}}})
    assert errors == ["singleuser.cpu.limit: '2' is a string; the chart wants number or null"]
    errors = _problems({"singleuser": {"image": {"tag": 0.1}}})  # YAML reads `tag: 0.1` as a number
    assert errors == ["singleuser.image.tag: 0.1 is a number; the chart wants string"]


def test_a_memory_limit_as_a_number_is_the_charts_bytes_not_an_error():
    # The chart 4.4.0 takes singleuser.memory.limit as a number (bytes) or a string ("4G"): both pass.
    assert z2jh.validate(z2jh.values(OPTS), SECRETS, {"singleuser": {"memory": {"limit": 4294967296}}})
    assert _problems({"singleuser": {"memory": {"limit": ["4G"]}}}) == [
        "singleuser.memory.limit: ['4G'] is an array; the chart wants number or string or null"]


def test_unknown_keys_are_named_at_the_top_and_inside():
    errors = _problems({"flavour": "vanilla", "singleuser": {"storage": {"homeMountPth": "/home/x"}}})
    assert errors == ["flavour: unknown key (the chart 4.4.0 has no such setting here)",
                      "singleuser.storage.homeMountPth: unknown key (the chart 4.4.0 has no such setting here)"]
    # hub.config takes any class name (patternProperties ^[A-Z]), not a lower-case one
    assert _problems({"hub": {"config": {"kubeSpawner": {}}}}) == [
        "hub.config.kubeSpawner: unknown key (the chart 4.4.0 has no such setting here)"]


def test_the_courses_rules_catch_what_the_schema_allows():
    errors = _problems({"hub": {"config": {"KubeSpawner": {"disable_user_config": False},
                                           "JupyterHub": {"authenticator_class": "dummy"}}},
                        "singleuser": {"extraEnv": {"PYTHONPATH": "/home/labkit/lib", "PYTHONNOUSERSITE": None},
                                       "cpu": {"limit": None}}})
    assert [e.split(":")[0] for e in errors] == [
        "hub.config.KubeSpawner.disable_user_config", "hub.config.JupyterHub.authenticator_class",
        "singleuser.extraEnv.PYTHONPATH", "singleuser.extraEnv.PYTHONNOUSERSITE", "singleuser.cpu.limit"]
    with pytest.raises(z2jh.ValuesError, match="SharedPasswordAuthenticator.user_password: missing"):
        z2jh.validate(z2jh.values(OPTS))  # values.yaml without secrets.yaml: a hub that would not start
    with pytest.raises(z2jh.ValuesError, match=r"singleuser.extraEnv.PYTHONUSERBASE"):  # the list form of extraEnv
        z2jh.validate(z2jh.values(OPTS), SECRETS, {"singleuser": {"extraEnv": [
            {"name": "PYTHONNOUSERSITE", "value": "1"}, {"name": "PYTHONUSERBASE", "value": "/x"}]}})


# ----------------------------------------------------------------------------- options


def test_the_options_show_in_the_values():
    opts = z2jh.HubOptions(image="reg.example.org:5000/course/labkit:2.0", cores=4, memory="1.5G", instructor="alice",
                           class_pvc="class-2026", learners=12, subdomain_host="https://hub.example.org")
    v = z2jh.values(opts)
    single, config = v["singleuser"], v["hub"]["config"]
    assert single["image"] == {"name": "reg.example.org:5000/course/labkit", "tag": "2.0"}
    assert single["cpu"] == {"limit": 4.0, "guarantee": 4.0}
    assert single["memory"] == {"limit": "1536M", "guarantee": "1536M"}
    assert config["Authenticator"]["admin_users"] == ["alice"]
    assert config["Authenticator"]["allowed_users"] == [f"learner{i:02d}" for i in range(1, 13)]
    assert config["JupyterHub"] == {"authenticator_class": "shared-password", "subdomain_host": "https://hub.example.org"}
    assert config["KubeSpawner"]["disable_user_config"] is True
    env = single["extraEnv"]
    assert env["LABKIT_CHECK_SLOTS"] == "2" and env["LABKIT_CHECK_QUEUE"] == z2jh.QUEUE_DIR  # one per two cores
    assert env["PYTHONNOUSERSITE"] == "1" and "PYTHONPATH" not in env
    assert env["LABKIT_CLASS_DIR"] == z2jh.CLASS_DIR
    assert single["storage"]["extraVolumes"] == [{"name": "labkit-class",
                                                 "persistentVolumeClaim": {"claimName": "class-2026"}}]
    assert single["initContainers"][0]["image"] == opts.image
    assert z2jh.values(z2jh.HubOptions(cores=1.5))["singleuser"]["extraEnv"]["LABKIT_CHECK_SLOTS"] == "1"
    plain = z2jh.values(z2jh.HubOptions())
    assert plain["singleuser"]["image"]["name"] == "localhost/labkit"  # `labkit image build`'s name and version
    assert plain["hub"]["config"]["Authenticator"] == {"admin_users": ["instructor"], "allow_all": True}
    assert "subdomain_host" not in plain["hub"]["config"]["JupyterHub"]


@pytest.mark.parametrize("change, says", [
    ({"image": "registry.example.org:5000/labkit"}, "--image"),
    ({"memory": "lots"}, "--memory"),
    ({"memory": "10M"}, "at least 64M"),
    ({"cores": 0}, "--cores"),
    ({"instructor": "Bob!"}, "--instructor"),
    ({"instructor": "bob\n"}, "--instructor"),
    ({"class_pvc": "Class_PVC"}, "--class-pvc"),
    ({"subdomain_host": "hub"}, "--subdomain-host"),
    ({"learners": 0}, "--learners"),
])
def test_bad_options_are_refused_with_the_option_named(change, says):
    with pytest.raises(ValueError, match=says):
        z2jh.values(z2jh.HubOptions(**change))


def test_kubespawner_expands_the_first_start_and_the_class_folder_per_learner():
    v = z2jh.values(OPTS)["singleuser"]
    names = {"username": "learner07", "user_server": "learner07"}
    init = _expand(v["initContainers"][0], **names)  # would raise on a brace in the script
    assert init["command"] == ["sh", "-c", z2jh.FIRST_START]
    assert "{" not in z2jh.FIRST_START and "}" not in z2jh.FIRST_START
    assert {"name": "LEARNER_NAME", "value": "learner07"} in init["env"]
    assert init["volumeMounts"][0] == {"name": "volume-learner07", "mountPath": z2jh.HOME}
    assert v["storage"]["dynamic"]["volumeNameTemplate"] == z2jh.HOME_VOLUME  # the same volume the server mounts
    assert _expand(v["storage"]["extraVolumeMounts"], **names) == [
        {"name": "labkit-class", "mountPath": z2jh.CLASS_DIR, "subPath": "learner07"}]


# ----------------------------------------------------------------------------- the first start, run with sh


def _first_start(tmp_path: Path, home: Path) -> subprocess.CompletedProcess:
    """FIRST_START as the init container runs it, with a stand-in `labkit release` that writes a small course and
    leaves a mark that it ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "labkit"
    fake.write_text('#!/bin/sh\n# labkit release --solutions graded OUT\nout="$4"\n'
                    f'touch "{tmp_path}/released"\nmkdir -p "$out/labs"\n'
                    'echo "starter" > "$out/labs/fashion_mnist.py"\n'
                    'echo "notebook" > "$out/labs/00_start_here.ipynb"\n')
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME_DIR": str(home),
           "CLASS_ROOT": str(tmp_path / "class"), "LEARNER_NAME": "learner07"}
    return subprocess.run([shutil.which("sh") or "/bin/sh", "-c", z2jh.FIRST_START], env=env, capture_output=True,
                          text=True, timeout=30)


def test_the_first_start_releases_the_course_into_an_empty_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    done = _first_start(tmp_path, home)
    assert done.returncode == 0, done.stderr
    assert (home / "course" / "labs" / "fashion_mnist.py").read_text() == "starter\n"
    assert sorted(p.name for p in home.iterdir()) == ["course"]  # the work folder is gone
    assert (tmp_path / "class" / "learner07").is_dir()
    assert "released into" in done.stdout


def test_the_first_start_never_overwrites_the_learners_course(tmp_path):
    home = tmp_path / "home"
    script = home / "course" / "labs" / "fashion_mnist.py"
    script.parent.mkdir(parents=True)
    script.write_text("my own work\n")  # a modified starter; the rest of the course deleted by the learner
    done = _first_start(tmp_path, home)
    assert done.returncode == 0, done.stderr
    assert script.read_text() == "my own work\n"
    assert sorted(p.name for p in script.parent.iterdir()) == ["fashion_mnist.py"]
    assert not (tmp_path / "released").exists()  # labkit release did not even run
    assert "left as it is" in done.stdout
    # a second start of a fresh home, then a third: the course made by the second stays as the learner left it
    other = tmp_path / "home2"
    other.mkdir()
    assert _first_start(tmp_path, other).returncode == 0
    (other / "course" / "labs" / "fashion_mnist.py").write_text("edited\n")
    assert _first_start(tmp_path, other).returncode == 0
    assert (other / "course" / "labs" / "fashion_mnist.py").read_text() == "edited\n"


def test_the_first_start_leaves_a_course_that_is_a_link_or_a_file_alone(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "course").symlink_to(tmp_path / "nowhere")
    assert _first_start(tmp_path, home).returncode == 0
    assert (home / "course").is_symlink() and not (tmp_path / "nowhere").exists()


# ----------------------------------------------------------------------------- the command


def test_the_command_writes_the_folder_and_checks_it(tmp_path, capsys):
    out = tmp_path / "hub"
    assert _labkit("-o", str(out), "--cores", "3", "--memory", "6G", "--instructor", "alice", "--learners", "4",
                   "--image", "registry.example.org/labkit:0.1.0", "--class-pvc", "class-folder") == 0
    said = capsys.readouterr().out
    assert "nothing deployed" in said
    assert sorted(p.name for p in out.iterdir()) == ["Containerfile.hub", "README.md", "class-pvc.yaml",
                                                     "secrets.yaml", "values.yaml"]
    assert stat.S_IMODE((out / "secrets.yaml").stat().st_mode) == 0o600
    v = yaml.safe_load((out / "values.yaml").read_text())
    assert v["singleuser"]["cpu"]["limit"] == 3.0 and v["singleuser"]["memory"]["limit"] == "6G"
    assert v["hub"]["config"]["Authenticator"]["admin_users"] == ["alice"]
    assert yaml.safe_load((out / "class-pvc.yaml").read_text())["metadata"]["name"] == "class-folder"
    readme = (out / "README.md").read_text()
    for words in ("helm repo add jupyterhub https://hub.jupyter.org/helm-chart/", "--version 4.4.0",
                  "--values values.yaml --values secrets.yaml", "helm uninstall", "ReadWriteMany", "registry"):
        assert words in readme
    assert _labkit("--check", str(out / "values.yaml"), str(out / "secrets.yaml")) == 0
    secrets = yaml.safe_load((out / "secrets.yaml").read_text())["hub"]["config"]["SharedPasswordAuthenticator"]
    assert len(secrets["admin_password"]) >= 32 and secrets["admin_password"] not in json.dumps(v)


def test_the_command_refuses_a_folder_with_files_unless_forced(tmp_path, capsys):
    out = tmp_path / "hub"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    assert _labkit("-o", str(out)) == 2
    assert "not empty" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert _labkit("-o", str(out), "--force") == 0
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "values.yaml").is_file()


def test_the_command_names_what_is_wrong_in_an_edited_file(tmp_path, capsys):
    out = tmp_path / "hub"
    assert _labkit("-o", str(out)) == 0
    capsys.readouterr()
    edited = tmp_path / "edited.yaml"
    edited.write_text("singleuser:\n  cpu:\n    limit: \"2\"\nflavour: vanilla\n")
    assert _labkit("--check", str(out / "values.yaml"), str(out / "secrets.yaml"), str(edited)) == 1
    err = capsys.readouterr().err
    assert "singleuser.cpu.limit: '2' is a string; the chart wants number or null" in err
    assert "flavour: unknown key" in err
    assert _labkit("--check", str(tmp_path / "missing.yaml")) == 2
    assert _labkit("--check", str(edited), "-o", str(tmp_path / "x")) == 2  # one or the other
    assert _labkit("--memory", "4G") == 2
