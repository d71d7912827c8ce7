"""Library errors name parameters; the CLI maps them to flags in one place (bfp.cli.param_flags)."""
import ast
import re
from pathlib import Path

import pytest

from bfp.cli import cifar
from bfp.cli.flags import build_parser
from bfp.cli.param_flags import PARAM_DESTS, as_flags, flag_of
from bfp.cli.tasks import TASKS
from bfp.data import DataError
from bfp.data import cifar as data

PKG = Path(__file__).resolve().parents[1] / "bfp"
LIBRARY = [p for p in sorted(PKG.rglob("*.py")) if p.relative_to(PKG).parts[0] not in ("cli", "experiments")
           and p.name != "__main__.py"]  # a package's __main__ is a command line of its own
# The one command line below bfp.cli: python -m bfp.dynamic's own name and description.
# Not messages naming a script's flags: commands of other tools (python -m ...) and a docstring.
NOT_MESSAGES = {("dynamic/report.py", "python -m bfp.dynamic"), ("dynamic/report.py", "Tools for dynamic precision runs (--do)."),
                ("data/cifar.py", __import__("bfp.data.cifar", fromlist=["OFFLINE"]).OFFLINE)}


def options(task):
    """dest -> every option string of the script that sets it (aliases included)."""
    out = {}
    for a in build_parser(task)._actions:
        if a.option_strings:
            out.setdefault(a.dest, []).extend(a.option_strings)
    return out


OPTIONS = {name: options(t) for name, t in TASKS.items()}


def message_strings(path: Path):
    """Every string constant of ``path`` but docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


def test_no_library_message_names_a_flag():
    flags = {o for opts in OPTIONS.values() for names in opts.values() for o in names}
    found = []
    for path in LIBRARY:
        rel = str(path.relative_to(PKG))
        for text in message_strings(path):
            named = [w for w in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text) if w in flags]
            if named and (rel, text) not in NOT_MESSAGES:
                found.append(f"{rel}: {named} in {text[:80]!r}")
    assert found == []


def test_every_parameter_a_library_message_names_is_a_flag_of_every_script_that_has_it():
    names = {m for path in LIBRARY for text in message_strings(path) for m in re.findall(r"`([A-Za-z_][\w.]*)`", text)}
    assert {"channels", "path", "spec", "epochs", "lr", "batch_size_train", "n"} <= names  # the scan sees them
    for name in sorted(names):
        dest = PARAM_DESTS.get(name, name)
        having = [t for t, opts in OPTIONS.items() if dest in opts]
        assert having, f"`{name}` (dest {dest}) is no script's flag: add it to PARAM_DESTS"
        for task in having:
            for spelled in flag_of(dest, TASKS[task].hooks.flag_spellings).split("/"):
                assert spelled in OPTIONS[task][dest], (task, name, spelled)


@pytest.mark.parametrize("task, message, shown", [
    ("cifar", "`channels` must be 1 or 3, got 2", "--in-channels must be 1 or 3, got 2"),
    ("cifar", "`path` 'x' given with dataset digits", "-dp/--dataset-path 'x' given with dataset digits"),
    ("lm", "`path` a.txt: no such file", "--data a.txt: no such file"),
    ("imagenet", "`arch` 'resnet7': not a torchvision model", "-a/--arch 'resnet7': not a torchvision model"),
    ("cifar", "`compute_dtype` 'fp8': allowed fp32", "--precision 'fp8': allowed fp32"),
    ("cifar", "`GradHistogram.every` 0: allowed", "--grad-histogram 0: allowed"),
    ("cifar", "`image_size` must be >= 8", "`image_size` must be >= 8"),  # not a cifar.py flag: kept
    ("cifar", "`not_a_parameter` and `lr`", "`not_a_parameter` and --optim-lr"),
])
def test_messages_are_shown_with_the_scripts_flags(task, message, shown):
    t = TASKS[task]
    assert as_flags(message, set(OPTIONS[task]), t.hooks.flag_spellings) == shown


def test_the_library_says_the_parameter_and_the_script_says_the_flag(tiny_args, capsys):
    with pytest.raises(DataError, match=r"^`channels` must be 1 or 3, got 2$"):
        data.load("digits", channels=2)
    assert cifar(tiny_args("--in-channels", "2")) == 2
    assert capsys.readouterr().err.strip() == "cifar.py: error: --in-channels must be 1 or 3, got 2"
