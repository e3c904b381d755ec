# gptoss_build.py - an in-tree PEP 517 build backend for the gptoss Python package, written with
# the standard library only (zipfile, tarfile, hashlib), so `pip install bindings/python` works
# offline with nothing but pip: no setuptools or wheel package is needed (Debian's python3 and
# many CI images lack `wheel`). It packs gptoss/ into a wheel; if libgptoss.so* was copied into
# gptoss/ first, the library is bundled and the wheel is tagged for this platform instead of
# py3-none-any. Editable installs (pip install -e) get a .pth file pointing at this directory.
from __future__ import annotations

import base64
import hashlib
import io
import os
import sysconfig
import tarfile
import zipfile
from typing import Dict, List, Optional, Tuple

NAME = "gptoss"
VERSION = "0.1.0"  # keep equal to gptoss.__version__ (a test checks)
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

METADATA = f"""Metadata-Version: 2.1
Name: {NAME}
Version: {VERSION}
Summary: Run OpenAI's gpt-oss models through libgptoss (ctypes binding)
License: Apache-2.0
Requires-Python: >=3.8
"""


def _package_files() -> List[Tuple[str, str]]:
    """(path in the wheel, path on disk) for every file of the package."""
    out = []
    root = os.path.join(HERE, NAME)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith((".pyc", ".pyo")):
                continue
            full = os.path.join(dirpath, f)
            out.append((os.path.relpath(full, HERE).replace(os.sep, "/"), full))
    return out


def _tag(files: List[Tuple[str, str]]) -> str:
    if any(os.path.basename(arc).startswith("libgptoss.so") for arc, _ in files):
        return "py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "py3-none-any"


def _write_wheel(directory: str, entries: Dict[str, bytes], tag: str) -> str:
    dist_info = f"{NAME}-{VERSION}.dist-info"
    entries = dict(entries)
    entries[f"{dist_info}/METADATA"] = METADATA.encode()
    entries[f"{dist_info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: gptoss_build\n"
                                     f"Root-Is-Purelib: {'true' if tag.endswith('any') else 'false'}\n"
                                     f"Tag: {tag}\n").encode()
    record = []
    for arc, data in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{arc},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    entries[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    filename = f"{NAME}-{VERSION}-{tag}.whl"
    with zipfile.ZipFile(os.path.join(directory, filename), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in entries.items():
            info = zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if ".so" in arc else 0o644) << 16
            z.writestr(info, data, zipfile.ZIP_DEFLATED)
    return filename


def get_requires_for_build_wheel(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[dict] = None) -> List[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: Optional[dict] = None,
                metadata_directory: Optional[str] = None) -> str:
    files = _package_files()
    entries = {}
    for arc, full in files:
        with open(full, "rb") as f:
            entries[arc] = f.read()
    return _write_wheel(wheel_directory, entries, _tag(files))


def build_editable(wheel_directory: str, config_settings: Optional[dict] = None,
                   metadata_directory: Optional[str] = None) -> str:
    return _write_wheel(wheel_directory, {f"_{NAME}_editable.pth": (HERE + "\n").encode()}, "py3-none-any")


def build_sdist(sdist_directory: str, config_settings: Optional[dict] = None) -> str:
    base = f"{NAME}-{VERSION}"
    filename = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz") as tar:
        for rel in ["pyproject.toml", "README.md", "_build/gptoss_build.py"] + [a for a, _ in _package_files()]:
            tar.add(os.path.join(HERE, rel), arcname=f"{base}/{rel}")
        pkg_info = METADATA.encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(pkg_info)
        tar.addfile(info, io.BytesIO(pkg_info))
    return filename
