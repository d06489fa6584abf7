"""The file-level content-addressed store: each regular file of every image, once.

Where it sits: under the FUSE image cache (``csi.fuse.images``), which fills it
while it walks a layer's tar members (``csi.fuse.index``), and under the FUSE
filesystem (``csi.fuse.fs``), which serves reads from it. Layout under ``root``::

    ingest/                 files being written (invisible; wiped at start)
    files/sha256/<hex>      one file per distinct content, mode 0444
    variants/<hex>.<mode>.<mtime>
                            a copy for each further (content, mode, mtime) the hard
                            links of linked trees need (``csi.fuse.linked``)

It follows the node's one commit recipe (``rukpak.store.commit.place``): bytes are
hashed as they arrive, the finished file is fsynced and renamed into place, so a crash
leaves nothing or a complete file; content that is already present is
success and the new copy is dropped. N versions of a bundle that differ in one
file therefore cost one extra file. Unlike the blob store the digest is often
not known in advance (tar members carry none): :meth:`FileStore.ingest`
computes it, or checks it when the caller names one (lazy fetches, whose TOC
does).

*Variants* serve trees presented as hard links (``csi.fuse.linked``): a hard link
shares its inode's mode, times and owner, so a linked tree needs an inode per
(content, mode, mtime) its files show; the owner is the plugin's for every stored
file (as for bind mode's trees), so it is no part of the key. The first variant of
a content *is* the content's own file (``files/sha256/<hex>``, whose mode and times
nobody else reads: the FUSE view and the overlay take only its bytes), given the
variant's mode and mtime when no linked tree links it yet and found by them after
(no second name: a name costs a directory entry a file, and 10 versions of a bundle
would pay it 10 times over); a further variant of the same content (another mode or
mtime) is a copy in ``variants/``, fsynced. Identical files across versions (same
mode, same mtime) so share one inode and one copy on disk, as they share one stored
file. A copy is unused when no link but its own name remains (a name made by the
first layout, a second link to the content's inode, counts that one too):
:meth:`FileStore.drop_unused_variants` removes those, under
:attr:`FileStore.variants_lock`, which a linked tree's builder holds.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from rukpak.common import errors
from rukpak.common.fsio import unlink_size
from rukpak.oci import digest as digests
from rukpak.store import commit

ALGORITHM = "sha256"
CHUNK = 1 << 20


def verify_fd(fd: int, digest: str) -> bool:
    """Whether the file open on ``fd`` hashes to ``digest`` (read from offset 0, by ``pread``)."""
    hasher = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, CHUNK, offset):
        hasher.update(chunk)
        offset += len(chunk)
    return f"{ALGORITHM}:{hasher.hexdigest()}" == digest


def matches(data: bytes, digest: str) -> bool:
    """Whether ``data`` (a whole file) hashes to ``digest``."""
    return f"{ALGORITHM}:{hashlib.sha256(data).hexdigest()}" == digest


class FileIngest:
    """An open ingest file; :attr:`digest` is set once the ``with`` block commits it."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._hasher = hashlib.sha256()
        self.size = 0
        self.digest = ""

    def write(self, data: bytes | memoryview) -> None:
        self._hasher.update(data)
        self.size += len(data)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def computed(self) -> str:
        return f"{ALGORITHM}:{self._hasher.hexdigest()}"


class FileStore:
    """Files by content digest. Thread-safe: writers never share an ingest file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ingest_dir = root / "ingest"
        self.files_dir = root / "files" / ALGORITHM
        self.variants_dir = root / "variants"
        self.variants_lock = threading.Lock()
        self._files_prefix = f"{self.files_dir}{os.sep}"
        for d in (root, self.ingest_dir, self.files_dir, self.variants_dir):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        for entry in self.ingest_dir.iterdir():  # unfinished ingests from before a crash
            entry.unlink(missing_ok=True)

    def path(self, digest: str) -> Path:
        """Where ``digest`` lives (present or not); InvalidArgument for a malformed digest."""
        algorithm, _, _ = digests.check(digest).partition(":")
        if algorithm != ALGORITHM:
            raise errors.InvalidArgument(f"file digest {digest!r}: only sha256 is supported")
        return self.files_dir / digests.hex_of(digest)

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    @contextlib.contextmanager
    def ingest(
        self,
        *,
        expect: str | None = None,
        size: int | None = None,
        durable: bool = True,
        accept: Callable[[str], bool] | None = None,
    ) -> Iterator[FileIngest]:
        """Stream one file in; leaving the block normally commits it under its digest.

        With ``expect`` (and ``size``) the content must match, else DataLoss and
        nothing is kept. With ``accept``, content whose digest it refuses is dropped
        (``digest`` stays empty): nobody asked for it. Leaving with an error discards
        the ingest. Idempotent: content already present is success (the new copy is
        dropped). With ``durable=False`` nothing is fsynced: bulk writers call
        :meth:`sync` once before they commit what refers to the files (an index).
        """
        tmp = self.ingest_dir / secrets.token_hex(8)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            try:
                sink = FileIngest(fd)
                yield sink
                digest = sink.computed()
                if expect is not None and digest != expect:
                    raise errors.DataLoss(
                        f"file content hashes to {digest}, the table of contents says "
                        f"{expect}; the registry served different content"
                    )
                if size is not None and sink.size != size:
                    raise errors.DataLoss(
                        f"file {digest}: got {sink.size} bytes, the table of contents says {size}"
                    )
                if accept is not None and not accept(digest):
                    tmp.unlink()
                    return
                final = self.path(digest)
                if not final.is_file():
                    os.fchmod(fd, 0o444)
                # the node's one recipe: fsync (durable), rename, fsync the directory;
                # content already present is success and this copy goes
                commit.place(tmp, final, fd=fd, durable=durable)
            finally:
                os.close(fd)
            sink.digest = digest
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def sync(self) -> None:
        """Make every file written so far durable: one syncfs of the store's filesystem."""
        commit.sync_filesystem(self.files_dir)

    def put_bytes(self, data: bytes) -> str:
        """Store small content already in memory; returns its digest."""
        with self.ingest() as sink:
            sink.write(data)
        return sink.digest

    def open_fd(self, digest: str) -> int | None:
        """A read-only descriptor of the stored file (the caller closes it); None when missing.

        On the FUSE read path: a plain string path, no ``Path`` objects, one ``open(2)``.
        """
        try:
            return os.open(self._files_prefix + digests.hex_of(digest), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None

    def verify(self, digest: str) -> bool:
        """Whether the stored file still hashes to ``digest`` (False when missing)."""
        fd = self.open_fd(digest)
        if fd is None:
            return False
        try:
            return verify_fd(fd, digest)
        finally:
            os.close(fd)

    def delete(self, digest: str) -> int:
        """Remove a file; returns the bytes freed (0 if absent)."""
        return unlink_size(self.path(digest))

    def digests(self) -> Iterator[str]:
        for entry in self.files_dir.iterdir():
            digest = f"{ALGORITHM}:{entry.name}"
            if digests.is_valid(digest):
                yield digest

    def disk_usage(self) -> int:
        """Bytes allocated on disk by stored files and variants (blocks, as ``du`` counts:
        an inode once, however many names it has)."""
        total = 0
        seen: set[int] = set()
        for directory in (self.files_dir, self.variants_dir):
            for entry in os.scandir(directory):
                with contextlib.suppress(FileNotFoundError):
                    st = entry.stat(follow_symlinks=False)
                    if st.st_ino not in seen:
                        seen.add(st.st_ino)
                        total += st.st_blocks * 512
        return total

    # --- variants (hard-link targets of linked trees) ------------------------------------

    def variant(self, digest: str, mode: int, mtime: int) -> str:
        """The path of an inode holding ``digest``'s content with ``mode`` and ``mtime``
        (made when missing). The caller holds :attr:`variants_lock` until it has linked
        the variant (else a collection may remove it); FileNotFoundError when the store
        lacks the content."""
        hexdigest = digests.hex_of(digest)
        content = self._files_prefix + hexdigest
        times = (mtime * 10**9,) * 2
        st = os.stat(content)
        if stat.S_IMODE(st.st_mode) == mode and st.st_mtime_ns == times[0]:
            return content  # the content's own inode is this variant
        path = f"{self.variants_dir}{os.sep}{hexdigest}.{mode:o}.{mtime}"
        if os.path.lexists(path):
            return path
        if st.st_nlink == 1:  # no linked tree links the content's inode: adopt it
            os.chmod(content, mode)
            os.utime(content, ns=times)
            return content
        tmp = self.ingest_dir / secrets.token_hex(8)
        try:
            with open(content, "rb") as src, open(tmp, "xb") as dst:
                shutil.copyfileobj(src, dst, CHUNK)
                dst.flush()
                os.fchmod(dst.fileno(), mode)
                os.utime(dst.fileno(), ns=times)
                os.fsync(dst.fileno())
            os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return path

    def drop_unused_variants(self) -> int:
        """Remove variants no linked tree links (idempotent); returns how many went."""
        dropped = 0
        with self.variants_lock:
            for entry in os.scandir(self.variants_dir):
                with contextlib.suppress(FileNotFoundError):
                    st = entry.stat(follow_symlinks=False)
                    own = 1
                    with contextlib.suppress(OSError):
                        content = os.stat(self._files_prefix + entry.name.partition(".")[0])
                        own += (content.st_ino, content.st_dev) == (st.st_ino, st.st_dev)
                    if st.st_nlink <= own:
                        os.unlink(entry.path)
                        dropped += 1
        return dropped

    def clear(self) -> None:
        for directory in (self.files_dir, self.variants_dir):
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
