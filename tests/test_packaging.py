"""How graphaudit is installed: ONNX Runtime from exactly one extra, never both; a bare install
says in one line which extra to add; the wheel holds what the package reads at run time."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(requirements) -> list[str]:
    return [r.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip() for r in requirements]


def test_onnx_runtime_comes_from_one_extra_and_never_from_the_base():
    project = _project()
    runtimes = {"onnxruntime", "onnxruntime-gpu"}
    assert not runtimes & set(_names(project["dependencies"]))  # the base would pull the CPU build beside [gpu]
    extras = project["optional-dependencies"]
    assert _names(extras["cpu"]) == ["onnxruntime"] and _names(extras["gpu"]) == ["onnxruntime-gpu"]
    for name, requirements in extras.items():
        if name not in ("cpu", "gpu"):
            assert not runtimes & set(_names(requirements)), name
    assert project["license-files"] == ["LICENSE"] and (ROOT / "LICENSE").read_text().lstrip().startswith(
        "Apache License")


def test_a_command_without_onnx_runtime_says_which_extra_to_install(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]))
    onnx.save(model, tmp_path / "m.onnx")
    code = ("import sys; sys.modules['onnxruntime'] = None\n"  # as if no runtime were installed
            "from graphaudit.cli import main; main(['static', sys.argv[1]])")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.onnx")], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 1, done.stderr
    assert done.stderr == ("graphaudit: error: expected ONNX Runtime, found none installed: install graphaudit with "
                           "one of its extras, pip install 'graphaudit[cpu]', or 'graphaudit[gpu]' for its CUDA "
                           "build\n")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """graphaudit's wheel, built from a copy of the sources (the build writes build/ and egg-info beside them)."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    source = tmp_path / "source"
    shutil.copytree(ROOT / "graphaudit", source / "graphaudit", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "fixtures", source / "fixtures", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path), str(source)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (built,) = tmp_path.glob("graphaudit-*.whl")
    return built


def test_the_wheel_holds_the_schema_the_license_the_zoo_and_no_tests(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "graphaudit/report/schema.json" in names and "graphaudit/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert not any(n.startswith(("tests/", "exporters/", "fixtures/", "scripts/")) for n in names)
    zoo = json.loads((ROOT / "fixtures" / "zoo.json").read_text())["models"]
    for model in zoo:  # the zoo's models and data ship; the training state does not
        assert f"graphaudit/zoo/{model}/model.onnx" in names and f"graphaudit/zoo/{model}/eval.npz" in names
    assert "graphaudit/zoo/zoo.json" in names
    assert not any(n.endswith(".pt") for n in names), [n for n in names if n.endswith(".pt")]
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Provides-Extra: cpu" in metadata and "Provides-Extra: gpu" in metadata
    assert "Requires-Dist: onnxruntime>=1.18; extra == \"cpu\"" in metadata


def test_the_packages_listed_are_the_package_folders():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "graphaudit").rglob("__init__.py")}
    assert listed == folders | {"graphaudit.zoo"}


@pytest.mark.slow
def test_the_demo_runs_from_the_wheel_alone(wheel, tmp_path):
    """The wheel unpacked, ahead of the checkout on the path, run from a folder with no fixtures/:
    `graphaudit demo` finds the zoo the wheel ships."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import graphaudit; print(graphaudit.__file__)"], env=env,
                           cwd=tmp_path, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(site)
    done = subprocess.run([sys.executable, "-m", "graphaudit", "demo", "-q", "--provider", "cpu"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("graphaudit demo: 5 models from site/graphaudit/zoo ("), done.stdout
    assert "latency vs dense" in done.stdout
