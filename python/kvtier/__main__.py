"""``kvtier`` / ``python -m kvtier``: the kvtier daemon and command line.

A platform wheel (scripts/build-wheel.sh) carries the Go binary at
kvtier/_bin/kvtier; this runs it with the same arguments, in this process
(exec), so that signals and exit codes are the binary's own. The
pure-Python package (an sdist, or ``pip install ./python``) has no binary
and says so.
"""

from __future__ import annotations

import os
import pathlib
import sys


def binary() -> pathlib.Path | None:
    """The daemon binary this package carries, or None."""
    p = pathlib.Path(__file__).resolve().parent / "_bin" / "kvtier"
    return p if p.is_file() and os.access(p, os.X_OK) else None


def main() -> None:
    b = binary()
    if b is None:
        sys.stderr.write(
            "kvtier: this installation of the kvtier package has no daemon binary (it was installed from the\n"
            "pure-Python sources). Install a platform wheel (scripts/build-wheel.sh builds them) or build the\n"
            "binary with Go 1.26: go build -o kvtier ./cmd/kvtier\n")
        sys.exit(2)
    os.execv(b, [str(b), *sys.argv[1:]])


if __name__ == "__main__":
    main()
