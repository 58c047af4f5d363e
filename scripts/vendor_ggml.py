#!/usr/bin/env python3
"""Populate ``vendor/ggml/`` with the pinned upstream ggml source tree.

Two sources:

* default: the sdist named in ``vendor/ggml.lock`` (the registry package
  ``libggml-python``, whose ``ggml/`` folder is upstream's tagged tree), fetched
  with the ordinary ``pip download``, checked against the pinned sha256, and
  the ``ggml/`` folder extracted;
* ``--from PATH``: a local upstream tree (for example a git checkout of master).

The tree is written to a temporary folder next to the destination and renamed
into place, so an interrupted run never leaves a half-populated ``vendor/ggml``.
A stamp file ``.pyggml-source`` inside records where the tree came from; the
build reads it into ``pyggml.build_info()``.

This script uses only the standard library: CMake runs it at configure time,
inside pip's isolated build environment.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "vendor" / "ggml.lock"
DEFAULT_DEST = ROOT / "vendor" / "ggml"
STAMP = ".pyggml-source"


class VendorError(RuntimeError):
    pass


def read_lock(path: Path | None = None) -> dict[str, str]:
    path = path or LOCK
    lock: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise VendorError(f"{path}: malformed line {line!r}")
        lock[key.strip()] = value.strip()
    for key in ("version", "package", "sdist", "sha256", "subdir"):
        if key not in lock:
            raise VendorError(f"{path}: missing key {key!r}")
    return lock


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def is_ggml_tree(path: Path) -> bool:
    return (path / "CMakeLists.txt").is_file() and (path / "include" / "ggml.h").is_file()


def cache_dir() -> Path:
    base = os.environ.get("PYGGML_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "pyggml"


def _pip_env() -> dict[str, str]:
    # CMake may run us inside pip's isolated build environment, whose PYTHONPATH
    # hides the interpreter's own site-packages (and with it pip). The download
    # is an ordinary user-level pip call, so give it the interpreter's normal view.
    env = dict(os.environ)
    for var in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME"):
        env.pop(var, None)
    return env


def fetch_sdist(lock: dict[str, str]) -> Path:
    """Return a verified copy of the pinned sdist, downloading it if needed."""
    cache = cache_dir()
    cached = cache / lock["sdist"]
    if cached.is_file() and sha256_of(cached) == lock["sha256"]:
        return cached
    name = lock["package"].split("==")[0]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download",
            "--no-deps", "--no-binary", name, "--dest", tmp, lock["package"],
        ]
        print("vendor_ggml:", " ".join(cmd), flush=True)
        proc = subprocess.run(cmd, env=_pip_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise VendorError(f"pip download failed (exit {proc.returncode}):\n{proc.stdout}")
        got = Path(tmp) / lock["sdist"]
        if not got.is_file():
            raise VendorError(f"pip download did not produce {lock['sdist']}: {os.listdir(tmp)}")
        digest = sha256_of(got)
        if digest != lock["sha256"]:
            raise VendorError(
                f"sha256 mismatch for {lock['sdist']}: got {digest}, pinned {lock['sha256']}")
        cache.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(got, cached)
    return cached


def _inside(root: Path, target: Path) -> bool:
    """Is target (resolved, no symlinks followed beyond root) inside root?"""
    try:
        target.relative_to(root)
    except ValueError:
        return False
    return True


def _extract_subdir(sdist: Path, subdir: str, out: Path) -> None:
    """Extract <top>/<subdir>/ of the sdist into out. Every member is checked here, on
    every Python (tarfile's "data" filter is absent before 3.10.12 / 3.11.4): no absolute
    or ``..`` names, only files, directories and links whose target stays inside."""
    root = Path("/__sdist__")
    with tarfile.open(sdist, "r:gz") as tar:
        members = []
        for m in tar.getmembers():
            parts = Path(m.name).parts
            # <top>/<subdir>/... -> ...
            if ".." in parts or Path(m.name).is_absolute():
                raise VendorError(f"{sdist.name}: unsafe member name {m.name!r}")
            if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
                raise VendorError(f"{sdist.name}: {m.name!r} is not a file, directory or link")
            if m.issym() or m.islnk():
                base = root / Path(m.name).parent if m.issym() else root
                target = Path(os.path.normpath(base / m.linkname))
                if Path(m.linkname).is_absolute() or not _inside(root / parts[0] / subdir, target):
                    raise VendorError(f"{sdist.name}: link {m.name!r} -> {m.linkname!r} points outside {subdir}/")
            if len(parts) >= 3 and parts[1] == subdir:
                m.name = str(Path(*parts[2:]))
                if m.islnk():
                    m.linkname = str(Path(*Path(m.linkname).parts[2:]))
                members.append(m)
        if not members:
            raise VendorError(f"{sdist.name} has no {subdir}/ folder")
        if hasattr(tarfile, "data_filter"):      # Python >= 3.11.4, 3.10.12: a second line of defence
            tar.extractall(out, members=members, filter="data")
        else:                                    # everything was checked above
            tar.extractall(out, members=members)


def _check_links(source: Path) -> None:
    """A local tree may hold symlinks (a checkout does); each must point inside it."""
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames[:] = [d for d in dirnames if d != ".git" and not d.startswith("build")]
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path.is_symlink():
                target = (path.parent / os.readlink(path)).resolve()
                if not _inside(source, target):
                    raise VendorError(f"{path} is a link to {os.readlink(path)}, outside {source}")


def populate(dest: Path, source: Path | None = None, force: bool = False) -> Path:
    dest = dest.resolve()
    if is_ggml_tree(dest) and not force:
        print(f"vendor_ggml: {dest} already populated", flush=True)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".ggml-", dir=dest.parent))
    try:
        if source is not None:
            source = source.resolve()
            if not is_ggml_tree(source):
                raise VendorError(f"{source} is not a ggml source tree (no CMakeLists.txt + include/ggml.h)")
            _check_links(source)
            # links are copied as links (all checked to stay inside): never followed out
            shutil.copytree(source, tmp, dirs_exist_ok=True, symlinks=True,
                            ignore=shutil.ignore_patterns(".git", "build*"))
            stamp = f"src:{source}\n"
        else:
            lock = read_lock()
            sdist = fetch_sdist(lock)
            _extract_subdir(sdist, lock["subdir"], tmp)
            stamp = f"pypi:{lock['package']} sha256:{lock['sha256']}\n"
        if not is_ggml_tree(tmp):
            raise VendorError("populated tree has no CMakeLists.txt + include/ggml.h")
        (tmp / STAMP).write_text(stamp)
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    print(f"vendor_ggml: populated {dest} from {stamp.strip()}", flush=True)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="source", type=Path,
                    help="copy this local upstream ggml tree instead of the pinned sdist")
    ap.add_argument("--dest", type=Path, default=DEFAULT_DEST,
                    help="where to put the tree (default: vendor/ggml)")
    ap.add_argument("--force", action="store_true", help="replace an already populated tree")
    args = ap.parse_args(argv)
    try:
        populate(args.dest, args.source, args.force)
    except VendorError as e:
        print(f"vendor_ggml: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
