"""Patch an unpacked pyfuse3 3.5.0 sdist so read and readdir get the inode when fh is 0.

Why: in the kernel's no-open mode (csi/fuse/fs.py) reads and directory reads
carry handle 0; libfuse passes the inode beside it but pyfuse3 drops it. The
patch hands the inode to ``Operations.read``/``readdir`` in that case, in the
Cython source (handlers.pxi) and in the generated C the build compiles, and
sets the version to ``3.5.0+rukpak.inodehandles`` (which still satisfies
``pyfuse3==3.5.0``). Usage: ``python hack/pyfuse3/patch.py SDIST_DIR``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

VERSION = "3.5.0+rukpak.inodehandles"
HANDLERS = ("fuse_read", "fuse_readdirplus")


def patch(root: Path) -> None:
    c_file = root / "src/pyfuse3/__init__.c"
    text = c_file.read_text()
    for func in HANDLERS:
        pattern = re.compile(
            r"(\*     c\.fh = fi\.fh             # <<<<<<<<<<<<<<\n \*     save_retval\("
            + func
            + r"_async\(c\)\)\n(?: \* \n)?\*/\n  __pyx_t_\d+ = )__pyx_v_fi->fh;"
        )
        text, count = pattern.subn(r"\1(__pyx_v_fi->fh ? __pyx_v_fi->fh : __pyx_v_ino);", text)
        if count != 1:
            raise SystemExit(f"{c_file}: {func} not found once ({count}); is this pyfuse3 3.5.0?")
    c_file.write_text(text)

    pxi = root / "src/pyfuse3/handlers.pxi"
    source = pxi.read_text()
    for func in HANDLERS:
        pattern = re.compile(r"(cdef void " + func + r" \(.*?)    c\.fh = fi\.fh\n", re.S)
        source, count = pattern.subn(r"\1    c.fh = fi.fh if fi.fh else ino\n", source, count=1)
        if count != 1:
            raise SystemExit(f"{pxi}: {func} not found; is this pyfuse3 3.5.0?")
    pxi.write_text(source)

    project = root / "pyproject.toml"
    meta = project.read_text()
    if 'dynamic = ["version"]' not in meta:
        raise SystemExit(f"{project}: no dynamic version to pin; is this pyfuse3 3.5.0?")
    project.write_text(meta.replace('dynamic = ["version"]', f'version = "{VERSION}"'))


if __name__ == "__main__":
    patch(Path(sys.argv[1]))
