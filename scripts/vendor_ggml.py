#!/usr/bin/env python3
"""Populate ``vendor/ggml/`` with the pinned upstream ggml source tree.

Three sources:

* default: the sdist named in ``vendor/ggml.lock`` (the registry package
  ``llama-cpp-python`` 0.3.36, whose ``vendor/llama.cpp/ggml/`` folder is ggml
  0.25.3), fetched with the ordinary ``pip download``, checked against the pinned
  sha256, and that folder extracted; a tree populated from an earlier pin is
  replaced (its stamp names the other sdist);
* ``--sdist PACKAGE==VERSION``: another registry sdist that carries a ggml tree,
  pinned the same way in ``vendor/sdists/PACKAGE-VERSION.lock`` (for example
  ``libggml-python==0.20.2.post1``, whose ``ggml/`` is the tree of ggml 0.20.2, the pin before);
  ``--pin PACKAGE==VERSION --subdir PATH`` writes such a lock from the registry's
  file (its sha256 and the ggml version of the tree);
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
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "vendor" / "ggml.lock"
SDIST_LOCKS = ROOT / "vendor" / "sdists"
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


def sdist_lock_path(requirement: str) -> Path:
    """vendor/sdists/PACKAGE-VERSION.lock for ``PACKAGE==VERSION``."""
    name, sep, version = requirement.partition("==")
    if not sep or not name or not version or any(c in requirement for c in "/\\ ;<>"):
        raise VendorError(f"{requirement!r}: give an exact pin, PACKAGE==VERSION")
    return SDIST_LOCKS / f"{name}-{version}.lock"


def read_sdist_lock(requirement: str) -> dict[str, str]:
    path = sdist_lock_path(requirement)
    if not path.is_file():
        raise VendorError(f"no pin for {requirement} in {path.parent} (pin it: scripts/vendor_ggml.py "
                          f"--pin {requirement} --subdir PATH/TO/ggml)")
    lock = read_lock(path)
    if lock["package"] != requirement:
        raise VendorError(f"{path} pins {lock['package']}, not {requirement}")
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


def _download(requirement: str, dest: str) -> Path:
    """The sdist of ``requirement`` (PACKAGE==VERSION) from the registry, with pip; only
    the package itself is taken as source (its build requirements as wheels)."""
    name = requirement.split("==")[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", name, "--dest", dest, requirement]
    print("vendor_ggml:", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, env=_pip_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise VendorError(f"pip download failed (exit {proc.returncode}):\n{proc.stdout}")
    got = [p for p in Path(dest).iterdir() if p.name.endswith((".tar.gz", ".zip"))]
    if len(got) != 1:
        raise VendorError(f"pip download of {requirement} gave {sorted(p.name for p in got)}, not one sdist")
    return got[0]


def fetch_sdist(lock: dict[str, str]) -> Path:
    """Return a verified copy of the pinned sdist, downloading it if needed."""
    cache = cache_dir()
    cached = cache / lock["sdist"]
    if cached.is_file() and sha256_of(cached) == lock["sha256"]:
        return cached
    with tempfile.TemporaryDirectory() as tmp:
        got = _download(lock["package"], tmp)
        if got.name != lock["sdist"]:
            raise VendorError(f"pip download gave {got.name}, the pin names {lock['sdist']}")
        digest = sha256_of(got)
        if digest != lock["sha256"]:
            raise VendorError(
                f"sha256 mismatch for {lock['sdist']}: got {digest}, pinned {lock['sha256']}")
        cache.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(got, cached)
    return cached


def pin(requirement: str, subdir: str) -> Path:
    """Write vendor/sdists/PACKAGE-VERSION.lock for a registry sdist whose ``subdir``
    holds a ggml tree: the file's name and sha256 as the registry serves it now, and
    the tree's ggml version. The file is kept in the cache like the default pin's."""
    path = sdist_lock_path(requirement)
    subdir = subdir.strip("/")
    with tempfile.TemporaryDirectory() as tmp:
        got = _download(requirement, tmp)
        tree = Path(tmp) / "tree"
        _extract_subdir(got, subdir, tree)
        if not is_ggml_tree(tree):
            raise VendorError(f"{got.name}: {subdir}/ is not a ggml tree (no CMakeLists.txt + include/ggml.h)")
        text = (tree / "CMakeLists.txt").read_text()
        found = [re.search(rf"set\(GGML_VERSION_{k}\s+(\d+)\)", text) for k in ("MAJOR", "MINOR", "PATCH")]
        parts = [m.group(1) for m in found if m is not None]
        version = ".".join(parts) if len(parts) == 3 else "unknown"
        digest = sha256_of(got)
        cache = cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(got, cache / got.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# A registry sdist carrying ggml {version} (written by scripts/vendor_ggml.py --pin).\n"
                    f"# Read by scripts/vendor_ggml.py --sdist {requirement}; the tree is populated at build\n"
                    f"# time and never committed.\n"
                    f"version = {version}\npackage = {requirement}\nsdist = {got.name}\nsha256 = {digest}\n"
                    f"subdir = {subdir}\n")
    print(f"vendor_ggml: pinned {requirement} (ggml {version}, sha256 {digest}) in {path}", flush=True)
    return path


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
    sub = Path(subdir).parts              # one folder ("ggml") or a path ("vendor/llama.cpp/ggml")
    if not sub or ".." in sub or Path(subdir).is_absolute():
        raise VendorError(f"bad subdir {subdir!r}")
    n = 1 + len(sub)
    with tarfile.open(sdist, "r:gz") as tar:
        members = []
        for m in tar.getmembers():
            parts = Path(m.name).parts
            # <top>/<subdir>/... -> ...
            if ".." in parts or Path(m.name).is_absolute():
                raise VendorError(f"{sdist.name}: unsafe member name {m.name!r}")
            inside = len(parts) > n and parts[1:n] == sub
            if not inside:
                continue                  # the rest of the sdist is never extracted nor trusted
            if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
                raise VendorError(f"{sdist.name}: {m.name!r} is not a file, directory or link")
            if m.issym() or m.islnk():
                base = root / Path(m.name).parent if m.issym() else root
                target = Path(os.path.normpath(base / m.linkname))
                if Path(m.linkname).is_absolute() or not _inside(root / parts[0] / subdir, target):
                    raise VendorError(f"{sdist.name}: link {m.name!r} -> {m.linkname!r} points outside {subdir}/")
            m.name = str(Path(*parts[n:]))
            if m.islnk():
                m.linkname = str(Path(*Path(m.linkname).parts[n:]))
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


def _stamp(lock: dict[str, str]) -> str:
    """What a tree populated from ``lock`` says of its source (``.pyggml-source``)."""
    return f"pypi:{lock['package']} sha256:{lock['sha256']}"


def populate(dest: Path, source: Path | None = None, force: bool = False, sdist: str | None = None) -> Path:
    """Populate ``dest`` from ``source`` (a local tree), the sdist pinned for ``sdist``
    (PACKAGE==VERSION) in vendor/sdists/, or the default pin, vendor/ggml.lock."""
    dest = dest.resolve()
    lock = None if source is not None else read_sdist_lock(sdist) if sdist else read_lock()
    if is_ggml_tree(dest) and not force:
        had = (dest / STAMP).read_text().strip() if (dest / STAMP).is_file() else ""
        if lock is None or not had.startswith("pypi:") or had == _stamp(lock):
            print(f"vendor_ggml: {dest} already populated", flush=True)
            return dest
        # a registry tree of another pin (the lock moved since): never build a stale tree
        print(f"vendor_ggml: {dest} holds {had}, the pin is {_stamp(lock)}: replacing it", flush=True)
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
            assert lock is not None
            _extract_subdir(fetch_sdist(lock), lock["subdir"], tmp)
            stamp = _stamp(lock) + "\n"
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
    ap.add_argument("--sdist", metavar="PACKAGE==VERSION",
                    help="the ggml tree of this registry sdist, pinned in vendor/sdists/ (see --pin)")
    ap.add_argument("--pin", metavar="PACKAGE==VERSION",
                    help="write vendor/sdists/PACKAGE-VERSION.lock for this registry sdist (with --subdir)")
    ap.add_argument("--subdir", help="--pin: the sdist's folder that holds ggml (e.g. vendor/llama.cpp/ggml)")
    args = ap.parse_args(argv)
    if args.pin and not args.subdir:
        ap.error("--pin needs --subdir, the sdist's folder that holds ggml")
    if sum(map(bool, (args.source, args.sdist, args.pin))) > 1:
        ap.error("give one of --from, --sdist, --pin")
    try:
        if args.pin:
            pin(args.pin, args.subdir)
            return 0
        populate(args.dest, args.source, args.force, args.sdist)
    except VendorError as e:
        print(f"vendor_ggml: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
