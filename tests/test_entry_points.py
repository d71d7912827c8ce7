"""The scripts users run: every declared console script, and the package installed as a wheel."""
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
# What each console script must answer --help for: the script itself and its subcommands.
HELP_ARGS = {"bfp": [[], ["cifar"], ["imagenet"], ["generate-config"], ["plot"]]}


def run_entry(target: str, args, cwd=None):
    module, _, func = target.partition(":")
    code = f"import sys; from {module} import {func} as f; sys.exit(f())"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_declared_console_script_answers_help(name):
    assert name in HELP_ARGS, f"console script {name!r} has no --help check here"
    for sub in HELP_ARGS[name]:
        r = run_entry(SCRIPTS[name], [*sub, "--help"])
        assert r.returncode == 0, (sub, r.stderr)
        assert "usage:" in r.stdout and "Traceback" not in r.stderr, sub
    installed = shutil.which(name)
    if installed:  # the executable pip wrote runs the same function
        assert subprocess.run([installed, "--help"], capture_output=True, timeout=120).returncode == 0


def test_bfp_cifar_is_cifar_py(tmp_path):
    args = ["--mode", "generate-config", "-m", "ResNet10", "--config-out"]
    a = subprocess.run([sys.executable, str(ROOT / "cifar.py"), *args, str(tmp_path / "a.json")],
                       capture_output=True, text=True, timeout=120)
    b = run_entry(SCRIPTS["bfp"], ["cifar", *args, str(tmp_path / "b.json")])
    c = run_entry(SCRIPTS["bfp"], ["generate-config", "-m", "ResNet10", "--config-out", str(tmp_path / "c.json")])
    assert a.returncode == b.returncode == c.returncode == 0, (a.stderr, b.stderr, c.stderr)
    text = (tmp_path / "a.json").read_text()
    assert text == (tmp_path / "b.json").read_text() == (tmp_path / "c.json").read_text()


def test_bfp_names_a_bad_command_and_the_good_ones():
    r = run_entry(SCRIPTS["bfp"], ["train"])
    assert r.returncode == 2 and "unknown command 'train'" in r.stderr and "cifar" in r.stderr
    assert "bfp cifar: error: --training-epochs must be >= 1" in run_entry(
        SCRIPTS["bfp"], ["cifar", "-d", "digits", "--training-epochs", "0"]).stderr


def _site_dirs() -> list[str]:
    import site
    return [d for d in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(d)]


def test_wheel_installed_outside_the_source_tree_runs_a_shipped_training_config(tmp_path):
    """Not editable, run from another directory: presets (conf_net) and training
    configs (conf_train) come from the wheel's package data. The wheel goes into a
    target folder; the run uses ``python -S`` (no site processing, so no ``.pth`` file
    and no editable install's import finder can supply a module the wheel lacks) with
    the target first and this interpreter's site-packages after it, for the
    dependencies (torch, numba ...). The wheel must hold every package of the tree."""
    import zipfile
    wheels, target, elsewhere = tmp_path / "wheels", tmp_path / "target", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    wheel, = wheels.glob("*.whl")
    shipped = {os.path.dirname(n) for n in zipfile.ZipFile(wheel).namelist() if n.startswith("bfp/")}
    in_tree = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "bfp").rglob("*.py") if "__pycache__" not in p.parts}
    in_tree |= {str(p.parent.relative_to(ROOT)) for p in (ROOT / "bfp").rglob("*.json")}
    assert in_tree - shipped == set() and {"bfp/data", "bfp/diagnostics", "bfp/conf_net"} <= shipped
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *_site_dirs()])}
    py = [sys.executable, "-S"]
    where = subprocess.run([*py, "-c", "import bfp, bfp.cli.main, bfp.data, bfp.diagnostics; print(bfp.__file__); "
                            "import sys; print([f for f in sys.meta_path if 'editable' in repr(f)])"],
                           cwd=elsewhere, env=env, capture_output=True, text=True)
    assert where.returncode == 0, where.stderr[-2000:]
    assert str(target) in where.stdout and where.stdout.strip().endswith("[]"), where.stdout
    r = subprocess.run([*py, "-c", "import sys; from bfp.cli import main; sys.exit(main())", "cifar", "-tc",
                        "digits_demo", "--training-epochs", "1",
                        "--num-workers", "0", "--progress", "False", "--limit-train-images", "256",
                        "--limit-test-images", "64", "--bfp", "ResNet18_FB16"],
                       cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "epoch 1/1:" in r.stdout and "ResNet18_FB16" in r.stdout
