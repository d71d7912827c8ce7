"""Where named config files are found: network presets (``conf_net/NAME.json``)
and training configs (``conf_train/NAME.json``).

Both are looked up the same way, in order: the folder in the working
directory, the repository's folder beside the package (source checkouts and
editable installs), and ``bfp/<folder>`` inside an installed wheel (the same
files, shipped as package data).
"""
from __future__ import annotations

from pathlib import Path

from .errors import ConfigError, _suggest

_PACKAGE = Path(__file__).resolve().parents[1]  # bfp/
_REPO = _PACKAGE.parent


def _config_dirs(folder: str) -> list[Path]:
    dirs = [Path.cwd() / folder, _REPO / folder, _PACKAGE / folder]
    out: list[Path] = []
    for p in dirs:
        if p.is_dir() and all(p.resolve() != q.resolve() for q in out):
            out.append(p)
    return out


def _names(dirs: list[Path]) -> list[str]:
    return sorted({p.stem for d in dirs for p in d.glob("*.json")})


def _stem(name: str) -> str:
    return name[:-5] if name.endswith(".json") else name


def _find(name: str, dirs: list[Path]) -> Path | None:
    for d in dirs:
        p = d / f"{_stem(name)}.json"
        if p.is_file():
            return p
    return None


def preset_dirs() -> list[Path]:
    """Where preset names are looked up, in order: ``./conf_net`` (the working
    directory), the repository's ``conf_net/`` next to the package (source
    checkouts and editable installs), and ``bfp/conf_net`` inside an installed
    package (the same files, shipped as package data)."""
    return _config_dirs("conf_net")


def preset_names() -> list[str]:
    """Every preset name ``load_config`` finds (file names without ``.json``)."""
    return _names(preset_dirs())


def find_preset(name: str) -> Path:
    """The file of preset ``name`` (``"ResNet18_FB12"`` or ``"ResNet18_FB12.json"``)."""
    found = _find(name, preset_dirs())
    if found is not None:
        return found
    names = preset_names()
    raise ConfigError(f"{name}: no such config file or preset{_suggest(_stem(name), names)}; presets "
                      f"(in {', '.join(str(d) for d in preset_dirs()) or 'no conf_net folder'}): {', '.join(names)}")


def train_config_dirs() -> list[Path]:
    """Where training-config names are looked up, in order: ``./conf_train``,
    the repository's ``conf_train/`` next to the package, and ``bfp/conf_train``
    inside an installed package (as ``preset_dirs`` for ``conf_net``)."""
    return _config_dirs("conf_train")


def train_config_names() -> list[str]:
    """Every training-config name ``find_train_config`` finds (file names without ``.json``)."""
    return _names(train_config_dirs())


def find_train_config(name: str) -> Path:
    """The training-config file ``name`` means: an existing file path as given,
    else ``NAME.json`` (``"digits_demo"`` or ``"digits_demo.json"``) in
    ``train_config_dirs()``."""
    path = Path(name)
    if path.is_file():
        return path
    found = _find(name, train_config_dirs())
    if found is not None:
        return found
    names = train_config_names()
    raise ConfigError(f"{name}: no such training config file or name{_suggest(_stem(name), names)}; training configs "
                      f"(in {', '.join(str(d) for d in train_config_dirs()) or 'no conf_train folder'}): "
                      f"{', '.join(names) or 'none'}")
