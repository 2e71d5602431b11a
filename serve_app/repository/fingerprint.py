"""A cheap fingerprint of a model directory, so poll and reload notice changes without reading model bytes.

Triton compares modification times (the newest mtime under the directory must
grow).  We hash every entry's (relative path, size, mtime_ns) instead, so a
change is noticed even when the new file carries an older mtime (``cp -p``,
``rsync -t``, a file put back) and a removal is noticed without relying on the
parent directory's mtime.  Hidden entries are skipped, as the repository skips
them (an editor's swap file must not count as a change).  Directories are part
of the hash by name only, so an empty version directory added to an ensemble
counts, while their own mtimes (bumped by hidden files) don't.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# The fingerprint of a directory that does not exist (a real one is a hex digest, never empty).
MISSING = ""


def model_fingerprint(directory: Path) -> str:
    """A digest of the non-hidden files and directories under ``directory``, recursively.

    Symlinks are followed (model files often live elsewhere) but each real
    directory is walked once, so a link cycle can't loop.  Entries that vanish
    while walking are hashed as missing rather than failing: the next poll sees
    the directory as it settles.
    """
    if not directory.is_dir():
        return MISSING
    digest = hashlib.sha256()
    seen: set[str] = set()
    for top, dirs, files in os.walk(directory, followlinks=True):
        real = os.path.realpath(top)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel_top = os.path.relpath(top, directory)
        for name in dirs:
            digest.update(f"d\0{os.path.join(rel_top, name)}\n".encode("utf-8", "surrogateescape"))
        for name in sorted(f for f in files if not f.startswith(".")):
            path = os.path.join(top, name)
            try:
                stat = os.stat(path)
                entry = f"f\0{os.path.join(rel_top, name)}\0{stat.st_size}\0{stat.st_mtime_ns}\n"
            except OSError:  # removed meanwhile, or a dangling link
                entry = f"f\0{os.path.join(rel_top, name)}\0missing\n"
            digest.update(entry.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()
