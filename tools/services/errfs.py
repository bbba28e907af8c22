"""errfs: a FUSE pass-through filesystem whose writes can be made to fail (EIO, EROFS).

`python -m tools.services.errfs SOURCE MOUNTPOINT CONTROL` mounts SOURCE at MOUNTPOINT
(foreground: the mount lives as long as the process) and reads CONTROL, a file outside
the mount, before every modifying operation: empty or "ok" passes everything through;
"eio" or "erofs" fails every write, create, truncate, rename, unlink and mkdir with that
error, as a failing disk or a filesystem remounted read-only would; "eio-read:NAME"
fails every read of a file whose path contains NAME with EIO (a bad sector under one
file) and passes everything else. Other reads always pass. With `--direct-io` (a
fourth argument) the kernel caches no file content, so every read reaches this process
(without it, pages written through the mount may be served from the page cache).
The kernel's writeback cache is off (libfuse's default), so a pwrite reaches this
process and its error reaches the writer's pwrite — what the spool sees on a real
failing disk once the page cache stops hiding it. Used by tests/faults/ and the chaos
kind `disk-error` through tools.services.disk_faults (which also unmounts it). Needs
root, /dev/fuse, libfuse2 (Debian) and fusepy (PyPI), all installed by `make`.
"""

from __future__ import annotations

import errno
import os
import sys

from fuse import FUSE, FuseOSError, Operations  # fusepy

_ERRORS = {"eio": errno.EIO, "erofs": errno.EROFS}


class ErrFS(Operations):
    def __init__(self, source: str, control: str) -> None:
        self.source = os.path.realpath(source)
        self.control = control
        self._seen: tuple[float, int] = (-1.0, -1)
        self._mode = 0
        self._bad_reads = ""

    def _path(self, path: str) -> str:
        return os.path.join(self.source, path.lstrip("/"))

    def _load(self) -> None:
        """Re-read CONTROL when it changed."""
        try:
            st = os.stat(self.control)
            key = (st.st_mtime, st.st_size)
            if key != self._seen:
                with open(self.control) as f:
                    text = f.read().strip()
                mode, _, name = text.partition(":")
                self._mode = _ERRORS.get(text.lower(), 0)
                self._bad_reads = name if mode.lower() == "eio-read" and name else ""
                self._seen = key
        except FileNotFoundError:
            self._mode, self._bad_reads = 0, ""

    def _check(self) -> None:
        """Raise the configured error of modifying operations, if any."""
        self._load()
        if self._mode:
            raise FuseOSError(self._mode)

    def _check_read(self, path: str) -> None:
        """Raise EIO if reads of `path` are set to fail."""
        self._load()
        if self._bad_reads and self._bad_reads in path:
            raise FuseOSError(errno.EIO)

    # -- reads (pass, unless "eio-read:NAME" names the file) --------------------------

    def getattr(self, path, fh=None):  # noqa: ANN001, ANN201
        st = os.lstat(self._path(path))
        return {k: getattr(st, k) for k in ("st_atime", "st_ctime", "st_gid", "st_mode",
                                             "st_mtime", "st_nlink", "st_size", "st_uid")}

    def readdir(self, path, fh):  # noqa: ANN001, ANN201
        return [".", "..", *os.listdir(self._path(path))]

    def access(self, path, mode):  # noqa: ANN001, ANN201
        if not os.access(self._path(path), mode):
            raise FuseOSError(errno.EACCES)

    def statfs(self, path):  # noqa: ANN001, ANN201
        st = os.statvfs(self._path(path))
        return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize",
                                             "f_favail", "f_ffree", "f_files", "f_flag",
                                             "f_frsize", "f_namemax")}

    def open(self, path, flags):  # noqa: ANN001, ANN201
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC):
            self._check()
        return os.open(self._path(path), flags)

    def read(self, path, size, offset, fh):  # noqa: ANN001, ANN201
        self._check_read(path)
        return os.pread(fh, size, offset)

    def release(self, path, fh):  # noqa: ANN001, ANN201
        os.close(fh)

    def flush(self, path, fh):  # noqa: ANN001, ANN201
        return 0

    def fsync(self, path, datasync, fh):  # noqa: ANN001, ANN201
        self._check()
        os.fsync(fh)

    # -- writes (fail on demand) -----------------------------------------------------------

    def create(self, path, mode, fi=None):  # noqa: ANN001, ANN201
        self._check()
        return os.open(self._path(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)

    def write(self, path, data, offset, fh):  # noqa: ANN001, ANN201
        self._check()
        return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):  # noqa: ANN001, ANN201
        self._check()
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._path(path), length)

    def rename(self, old, new):  # noqa: ANN001, ANN201
        self._check()
        os.rename(self._path(old), self._path(new))

    def unlink(self, path):  # noqa: ANN001, ANN201
        self._check()
        os.unlink(self._path(path))

    def mkdir(self, path, mode):  # noqa: ANN001, ANN201
        self._check()
        os.mkdir(self._path(path), mode)

    def rmdir(self, path):  # noqa: ANN001, ANN201
        self._check()
        os.rmdir(self._path(path))

    def chmod(self, path, mode):  # noqa: ANN001, ANN201
        self._check()
        os.chmod(self._path(path), mode)

    def utimens(self, path, times=None):  # noqa: ANN001, ANN201
        os.utime(self._path(path), times)


def main(argv: list[str]) -> int:
    direct_io = argv[3:] == ["--direct-io"]
    if len(argv) != 3 and not direct_io:
        print("usage: python -m tools.services.errfs SOURCE MOUNTPOINT CONTROL [--direct-io]",
              file=sys.stderr)
        return 2
    source, mountpoint, control = argv[:3]
    FUSE(ErrFS(source, control), mountpoint, foreground=True, nothreads=True,
         allow_other=True, fsname="quire-errfs", **({"direct_io": True} if direct_io else {}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
