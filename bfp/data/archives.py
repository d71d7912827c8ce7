"""Unpacking a dataset archive so that nothing in it can write outside its folder, and nothing
half-unpacked is ever used.

``unpack(archive, extract_to)`` checks every member itself before writing anything (a library's
extraction filter is not enough: Python's ``tarfile`` ``filter="data"`` had a bypass through
symlink chains longer than the path limit, CVE-2025-4517): a member must be a regular file or a
folder, with a relative name free of ``..`` and of backslashes and control characters that
resolves inside the destination; symlinks, hard links, devices and FIFOs are refused (a dataset
needs none), as is an archive with more than one top folder. Members under a ``.bfp-cache/``
folder are skipped (a decoded-image cache is this project's own, never taken from outside).
Files are written by this module from the member's data, never by ``tarfile``'s extraction.

The archive is unpacked into a temporary sibling folder and renamed into place only when every
member is written, with a marker (``.bfp-unpacked.json``: the archive's size and SHA-256, the
member count) inside, so a kill leaves nothing that looks usable: a leftover temporary folder
(``.TOP.partial-PID``, named literally, of a process that is gone) is removed at the next call,
and a folder without a matching marker is refused, never reused. Processes unpacking the same
archive at once (the ranks of one run) each write their own temporary folder; the first rename
wins and the others take its folder.

``image_folder(arg, extract_to)``: a ``-dp``/``--data`` argument that is an image folder, or an
archive of one unpacked as above, resolved to the folder holding ``train/`` and ``test/``.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import zlib
from pathlib import Path, PurePosixPath

from .folders import find_image_folder

__all__ = ["ArchiveError", "unpack", "check_members", "MARKER", "remove_dead_partials", "image_folder",
           "ARCHIVE_SUFFIXES"]

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")

MARKER = ".bfp-unpacked.json"
CACHE_DIR = ".bfp-cache"
_BAD_CHARS = set("\\\0") | {chr(c) for c in range(32)}


class ArchiveError(ValueError):
    """An archive that cannot be (safely) unpacked; the message names it."""


def _alive(pid: int) -> bool:
    """Whether process ``pid`` may still run (a process we may not signal counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def remove_dead_partials(folder: Path, name: str) -> list[Path]:
    """Remove the temporary folders ``folder/.NAME.partial-PID`` that a killed run of this module
    left: ``name`` is compared literally, character for character (never as a pattern: a folder named
    ``*`` matches only ``.*.partial-PID``), PID must be all digits, and a folder whose process may
    still run is kept. Returns what was removed."""
    prefix, gone = f".{name}.partial-", []
    try:
        entries = list(os.scandir(folder))
    except OSError:  # no such folder, or not a folder: nothing of ours is there
        return gone
    for e in entries:
        pid = e.name[len(prefix):]
        if e.name.startswith(prefix) and pid.isdigit() and pid.isascii() and \
                e.is_dir(follow_symlinks=False) and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(e.path, ignore_errors=True)
            gone.append(Path(e.path))
    return gone


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_members(tar: tarfile.TarFile, where: str) -> tuple[str, list[tarfile.TarInfo]]:
    """(the archive's one top folder, the members to write): every member checked as the module
    docstring says; ``ArchiveError`` naming the first bad one."""
    keep, tops = [], set()
    for m in tar.getmembers():
        name = m.name
        what = f"{where}: member {name!r}"
        if not name or name.startswith("/") or (len(name) > 1 and name[1] == ":"):
            raise ArchiveError(f"{what} has an absolute name; refused (members must be relative paths)")
        if _BAD_CHARS & set(name):
            raise ArchiveError(f"{what} has a backslash or control character in its name; refused")
        parts = PurePosixPath(name).parts
        if ".." in parts:
            raise ArchiveError(f"{what} climbs out of the folder with '..'; refused")
        if m.issym() or m.islnk():
            raise ArchiveError(f"{what} is a {'symbolic' if m.issym() else 'hard'} link to {m.linkname!r}; "
                               "links are refused (a dataset archive needs none)")
        if not (m.isfile() or m.isdir()):
            raise ArchiveError(f"{what} is a device, FIFO or other special file; refused")
        parts = tuple(p for p in parts if p != ".")
        if not parts:
            continue
        tops.add(parts[0])
        if CACHE_DIR in parts:
            continue  # never taken from outside
        keep.append(m)
    if len(tops) != 1:
        raise ArchiveError(f"{where}: expected one top folder in the archive, found {sorted(tops)[:5] or 'none'}")
    return tops.pop(), keep


def _write(tar: tarfile.TarFile, members: list[tarfile.TarInfo], root: Path) -> None:
    base = root.resolve()
    for m in members:
        path = (root / m.name).resolve()
        if path != base and base not in path.parents:  # belt and braces after check_members
            raise ArchiveError(f"member {m.name!r} resolves outside the destination; refused")
        if m.isdir():
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        src = tar.extractfile(m)
        with open(path, "xb") as out:  # x: never through an existing file or link
            shutil.copyfileobj(src, out)


def _marker(archive: Path, count: int) -> dict:
    return {"archive": archive.name, "size": archive.stat().st_size, "sha256": _sha256(archive), "members": count}


def _unpacked_from(target: Path, want: dict) -> bool:
    """Whether ``target`` holds the marker of the archive ``want`` describes."""
    try:
        return json.loads((target / MARKER).read_text()) == want
    except (OSError, ValueError):
        return False


def unpack(archive: Path, extract_to: Path) -> Path:
    """The folder ``archive``'s top folder is unpacked to under ``extract_to`` (done once; a folder
    unpacked from this very archive, by its marker, is reused). ``ArchiveError`` names the archive,
    the member or the folder at fault; nothing is left half-written."""
    archive, extract_to = Path(archive), Path(extract_to)
    where = f"archive {str(archive)!r}"
    if extract_to.exists() and not extract_to.is_dir():
        raise ArchiveError(f"the extraction folder {str(extract_to)!r} is a file; give a folder to unpack {archive.name} into")
    try:
        with tarfile.open(archive) as tar:
            top, members = check_members(tar, where)
            target = extract_to / top
            remove_dead_partials(extract_to, top)  # a killed earlier unpacking
            want = _marker(archive, len(members))
            if target.exists():
                if _unpacked_from(target, want):
                    return target
                raise ArchiveError(f"{where}: {str(target)!r} exists but was not unpacked from this archive "
                                   f"(no matching {MARKER}); remove it, or unpack elsewhere")
            print(f"unpacking {archive} into {extract_to}/ (once)")
            try:
                extract_to.mkdir(parents=True, exist_ok=True)
                tmp = extract_to / f".{top}.partial-{os.getpid()}"
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
            except OSError as e:
                raise ArchiveError(f"the extraction folder {str(extract_to)!r}: cannot write there "
                                   f"({e.strerror or e})") from None
            try:
                _write(tar, members, tmp)
                (tmp / top).mkdir(exist_ok=True)
                (tmp / top / MARKER).write_text(json.dumps(want, indent=1))
                try:
                    os.rename(tmp / top, target)
                except OSError:  # another process (a rank of the same run) put it there first
                    if not _unpacked_from(target, want):
                        raise
            except OSError as e:
                raise ArchiveError(f"the extraction folder {str(extract_to)!r}: unpacking {archive.name} failed "
                                   f"({e.strerror or e})") from None
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise ArchiveError(f"{where}: not a readable .tar.gz/.tar archive (corrupt or truncated: {e})") from None
    except OSError as e:  # gzip.BadGzipFile among them
        raise ArchiveError(f"{where}: cannot read it as a .tar.gz/.tar archive ({e.strerror or e})") from None
    return target


def image_folder(arg: str, extract_to: Path, flag: str = "`path`") -> Path:
    """``arg`` if it is a folder; a ``.tar.gz``/``.tgz``/``.tar`` is unpacked into ``extract_to``
    once (``unpack``; reused when already there). The folder with ``train/`` and ``test/`` class
    folders inside it is returned; ``ArchiveError`` names ``flag`` and what is wrong."""
    p = Path(arg)
    if not p.exists():
        raise ArchiveError(f"{flag} {arg!r} does not exist; give the CIFAR-10 JPEG folder (train/ and test/ "
                           f"class folders) or its .tar.gz")
    if p.is_file():
        if not p.name.endswith(ARCHIVE_SUFFIXES):
            raise ArchiveError(f"{flag} {arg!r} is a file but not a .tar.gz/.tgz/.tar archive")
        p = unpack(p, extract_to)  # every member checked; renamed into place only when complete
    found = find_image_folder(p)
    if found is None:
        raise ArchiveError(f"{flag} {arg!r} holds no train/ and test/ class folders")
    return found
