#!/usr/bin/env python3
"""wheel.py OUT_DIR PLATFORM=BINARY...: assembles kvtier's platform wheels.

Each wheel holds the Python package (python/kvtier), the daemon binary at
kvtier/_bin/kvtier and the metadata of python/pyproject.toml (name,
version, dependencies, entry points). Run by scripts/build-wheel.sh, which
builds the binaries.

Why not setuptools' bdist_wheel: a wheel tagged py3-none-<platform> (one
wheel for every CPython, tied to the binary's platform) needs a setup.py
hook there, and its archive is not byte-for-byte reproducible. Here the
archive is: entries sorted, every timestamp SOURCE_DATE_EPOCH (else
1980-01-01), fixed permissions and compression, so the same tree and
binaries make the same wheel.
"""

from __future__ import annotations

import base64
import hashlib
import os
import pathlib
import sys
import time
import tomllib
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
PY = ROOT / "python"

#: The platform tags of each GOARCH: the binary is static (CGO_ENABLED=0),
#: so it runs on any glibc (and musl) Linux of that architecture.
TAGS = {
    "amd64": "manylinux_2_17_x86_64.manylinux2014_x86_64",
    "arm64": "manylinux_2_17_aarch64.manylinux2014_aarch64",
}


def metadata(project: dict) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project['description']}",
        f"License: {project.get('license', {}).get('text', '')}",
        f"Requires-Python: {project['requires-python']}",
    ]
    lines += [f"Requires-Dist: {d}" for d in project.get("dependencies", [])]
    for extra, deps in sorted(project.get("optional-dependencies", {}).items()):
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in deps]
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + (PY / project["readme"]).read_text()


def entry_points(project: dict) -> str:
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    out = []
    for group, eps in groups.items():
        out.append(f"[{group}]")
        out += [f"{k} = {v}" for k, v in sorted(eps.items())]
        out.append("")
    return "\n".join(out)


def sources(packages: list[str]) -> list[pathlib.Path]:
    """The packages' modules, their type stubs and py.typed markers (PEP 561)."""
    files = []
    for pkg in packages:
        d = PY / pkg.replace(".", "/")
        files += [p for p in d.iterdir() if p.suffix in (".py", ".pyi") or p.name == "py.typed"]
    return sorted(files)


def build(out: pathlib.Path, goarch: str, binary: pathlib.Path) -> pathlib.Path:
    conf = tomllib.loads((PY / "pyproject.toml").read_text())
    project = conf["project"]
    packages = conf["tool"]["setuptools"]["packages"]
    name, version = project["name"], project["version"]
    dist_info = f"{name}-{version}.dist-info"
    tag = f"py3-none-{TAGS[goarch]}"
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))
    stamp = time.gmtime(max(epoch, 315532800))[:6]
    entries: list[tuple[str, bytes, int]] = []
    for f in sources(packages):
        entries.append((f.relative_to(PY).as_posix(), f.read_bytes(), 0o644))
    entries.append(("kvtier/_bin/kvtier", binary.read_bytes(), 0o755))
    entries.append((f"{dist_info}/METADATA", metadata(project).encode(), 0o644))
    entries.append((f"{dist_info}/WHEEL", (
        "Wheel-Version: 1.0\nGenerator: kvtier scripts/wheel.py\nRoot-Is-Purelib: false\n"
        + "".join(f"Tag: py3-none-{t}\n" for t in TAGS[goarch].split("."))).encode(), 0o644))
    entries.append((f"{dist_info}/entry_points.txt", entry_points(project).encode(), 0o644))
    entries.append((f"{dist_info}/top_level.txt", b"kvtier\n", 0o644))
    entries.sort()
    record = []
    for path, data, _ in entries:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    entries.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))
    out.mkdir(parents=True, exist_ok=True)
    whl = out / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for path, data, mode in entries:
            info = zipfile.ZipInfo(path, date_time=stamp)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data, compresslevel=6)
    return whl


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: wheel.py OUT_DIR GOARCH=BINARY...")
    out = pathlib.Path(sys.argv[1])
    for arg in sys.argv[2:]:
        goarch, _, binary = arg.partition("=")
        if goarch not in TAGS:
            sys.exit(f"wheel.py: no platform tag for GOARCH {goarch!r} (known: {sorted(TAGS)})")
        print(build(out, goarch, pathlib.Path(binary)))


if __name__ == "__main__":
    main()
