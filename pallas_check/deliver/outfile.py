"""Where a report goes when `--output FILE` is given, and how it is written there safely.

A report file is checked before the script runs (a bad target is a usage error, exit 2,
before any work is lost) and written after it:

- `-` is standard output;
- a descriptor the process inherited, named as `/dev/stdout`, `/dev/stderr`, `/dev/fd/N`
  or `/proc/self/fd/N`, is written as a stream through that descriptor (never reopened
  or replaced: `-o /dev/stdout >> log` appends to `log`, keeping what was there);
- a regular file (or a new one) is replaced atomically: a temporary file in the same
  folder, then a rename, so a reader sees the old report or the whole new one (a
  temporary file a killed run left is removed by the next run, see TEMP_SUFFIX);
- a symlink is followed: its target is replaced atomically, in the target's folder, and
  the link stays a link;
- a device, FIFO or socket (`/dev/null`, `>(cat)`) is written directly, never replaced;
- a folder, the script itself, or a place we may not write is refused.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import tempfile
import time
from pathlib import Path

from pallas_check.config.errors import OutputError as OutputError  # raised here, caught by importers

STDOUT = "-"


def is_stdout(path: Path | str | None) -> bool:
    return path is not None and str(path) == STDOUT


_STREAM_PATH = re.compile(r"/dev/(stdout|stderr)|/(?:dev|proc/self)/fd/(\d+)")


def stream_descriptor(path: Path | str) -> int | None:
    """The inherited descriptor a path names (`/dev/stdout` -> 1), else None. Resolving
    such a path would find the file the shell redirected into and replace it: a new
    file, the log written before it gone."""
    match = _STREAM_PATH.fullmatch(str(path))
    if match is None:
        return None
    if match.group(1):
        return 1 if match.group(1) == "stdout" else 2
    return int(match.group(2))


def check_target(path: Path, script: Path | None = None, flag: str = "--output") -> None:
    """Raise OutputError unless a report can be written to `path` after the run (`flag`:
    the option that named it, as the message says: `--output`, `--trace`, `--baseline`)."""
    if is_stdout(path):
        return
    fd = stream_descriptor(path)
    if fd is not None:
        try:
            os.fstat(fd)
        except OSError:
            raise OutputError(f"cannot use {flag} {path}: descriptor {fd} is not open")\
                from None
        return
    real = Path(os.path.realpath(path))
    if script is not None and script.exists() and real == Path(os.path.realpath(script)):
        raise OutputError(f"{flag} {path} is the script itself; refusing to overwrite it")
    try:
        info = os.stat(real)
    except FileNotFoundError:
        _check_new_file(path, real, flag)
        return
    except OSError as exc:
        raise OutputError(f"cannot use {flag} {path}: {exc.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        raise OutputError(f"{flag} {path} is a folder, not a file")
    if not os.access(real, os.W_OK):
        if stat.S_ISREG(info.st_mode) and os.access(real.parent, os.W_OK):
            return  # a read-only file in a writable folder is replaced, as `mv` would
        raise OutputError(f"cannot write {flag} {path}: permission denied")
    if stat.S_ISREG(info.st_mode) and not os.access(real.parent, os.W_OK | os.X_OK):
        return  # written in place (see write_report)


def same_target(first: Path | str, second: Path | str) -> bool:
    """Whether two report targets are one place, so that the second report written would
    destroy the first (or be interleaved with it in one stream): the same file by its
    resolved path or inode (a symlink to it, a hard link), the same stream descriptor, or
    a stream that is redirected into that file. `/dev/null` takes anything twice."""
    one, other = _identity(first), _identity(second)
    return one is not None and one == other


def _identity(path: Path | str) -> tuple[str | int, ...] | None:
    fd = 1 if is_stdout(path) else stream_descriptor(path)
    if fd is not None:
        try:
            info = os.fstat(fd)
        except OSError:
            return ("fd", fd)
        # A terminal is one per descriptor here: a report on stdout and a trace on stderr
        # are read apart; a file or pipe behind two descriptors is one place.
        return ("fd", fd) if stat.S_ISCHR(info.st_mode) else ("inode", info.st_dev,
                                                               info.st_ino)
    real = os.path.realpath(path)
    if real == os.devnull:
        return None
    try:
        info = os.stat(real)
    except OSError:
        return ("path", real)
    return ("inode", info.st_dev, info.st_ino)


def _check_new_file(path: Path, real: Path, flag: str) -> None:
    """A new report may create its own folder (`-o reports/run.json`), one level, under a
    folder that exists: never a chain of folders from a typo'd or absent root (run as
    root, `/nonexistent/sub/t.json` would otherwise create `/nonexistent` at `/`)."""
    folder = real.parent
    if not folder.exists():
        if not folder.parent.exists():
            raise OutputError(f"cannot create {flag} {path}: {folder.parent} does not"
                              f" exist (only the report's own folder is created)")
        folder = folder.parent
    if not folder.is_dir():
        raise OutputError(f"cannot create {flag} {path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"cannot create {flag} {path}: {folder} is not writable")


def write_report(path: Path, text: str) -> None:
    """Write `text` to `path` as described above (call check_target first)."""
    fd = stream_descriptor(path)
    if fd is not None:
        _write_to_descriptor(fd, text)
        return
    real = Path(os.path.realpath(path))
    try:
        info: os.stat_result | None = os.stat(real)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):
        # A device, FIFO or socket: written into, never replaced.
        with open(real, "w", encoding="utf-8") as handle:
            handle.write(text)
        return
    if info is not None and not os.access(real.parent, os.W_OK | os.X_OK):
        with open(real, "w", encoding="utf-8") as handle:  # no folder to stage a copy in
            handle.write(text)
        return
    _replace_atomically(real, text, None if info is None else stat.S_IMODE(info.st_mode))


def _write_to_descriptor(fd: int, text: str) -> None:
    """Append to an inherited descriptor after what Python buffered for it (the script's
    own prints come first, as they were printed)."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    data = text.encode("utf-8")
    while data:
        written = os.write(fd, data)
        data = data[written:]


# Our temporary files are `.NAME.XXXXXXXX.pallas-check-tmp` beside the report NAME. One
# outlives its run only when the process is killed outright (SIGKILL, power loss) while
# writing; the next run writing the same report removes those older than STALE_TEMP_S (a
# report is written in well under a second: a younger one may be another run's, still
# being written).
TEMP_SUFFIX = ".pallas-check-tmp"
STALE_TEMP_S = 60.0


def _remove_stale_temps(path: Path) -> None:
    prefix = f".{path.name}."
    try:
        names = [n for n in os.listdir(path.parent)
                 if n.startswith(prefix) and n.endswith(TEMP_SUFFIX)]
    except OSError:
        return
    now = time.time()
    for name in names:
        stale = path.parent / name
        try:
            if now - stale.lstat().st_mtime > STALE_TEMP_S:
                stale.unlink()
        except OSError:  # gone already, or not ours to remove
            pass


def _replace_atomically(path: Path, text: str, mode: int | None) -> None:
    """A temporary file in `path`'s folder, then a rename over `path`. At most that
    folder is created, never its parents (check_target refused a longer chain)."""
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        _rename_over(tmp, path, mode)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _temp_beside(path: Path) -> tuple[int, str]:
    path.parent.mkdir(exist_ok=True)
    _remove_stale_temps(path)
    return tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=str(path.parent))


def _rename_over(tmp: str, path: Path, mode: int | None) -> None:
    if mode is None:  # a new file: what `open` would give (mkstemp's is 0600)
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    os.chmod(tmp, mode)
    os.replace(tmp, path)


class StagedFile:
    """A file written piece by piece as the run goes (`--trace`), that appears at its path
    only whole: the pieces go to `handle` (binary), a temporary file beside the target
    (TEMP_SUFFIX, as `write_report`'s), renamed over it by `commit`; so a reader sees the
    old file or the whole new one, whenever the run is stopped. A target that is not
    replaced (a stream descriptor, a device or FIFO, a file in a folder we may not write)
    is staged in an unnamed temporary file and copied in by `commit`. `folder`: where
    the staging is, for more temporary files of the same run (None: the system's)."""

    def __init__(self, path: Path) -> None:
        self._fd = stream_descriptor(path)
        self._real = Path(os.path.realpath(path))
        self._tmp: str | None = None
        self._mode: int | None = None
        self.folder: Path | None = None
        try:
            info: os.stat_result | None = os.stat(self._real)
        except FileNotFoundError:
            info = None
        replaced = self._fd is None and (info is None or (
            stat.S_ISREG(info.st_mode) and os.access(self._real.parent, os.W_OK | os.X_OK)))
        if replaced:
            fd, self._tmp = _temp_beside(self._real)
            self._mode = None if info is None else stat.S_IMODE(info.st_mode)
            self.handle = os.fdopen(fd, "w+b")
            self.folder = self._real.parent
        else:
            self.handle = tempfile.TemporaryFile()

    def commit(self) -> None:
        """The staged bytes become the file (or are written into the stream)."""
        self.handle.flush()
        if self._tmp is not None:
            try:
                os.fsync(self.handle.fileno())
                self.handle.close()
                _rename_over(self._tmp, self._real, self._mode)
            except BaseException:
                self.discard()
                raise
            return
        self.handle.seek(0)
        if self._fd is not None:
            for stream in (sys.stdout, sys.stderr):
                if stream is not None:
                    stream.flush()
            while chunk := self.handle.read(1 << 20):
                while chunk:
                    chunk = chunk[os.write(self._fd, chunk):]
        else:
            with open(self._real, "wb") as target:
                while chunk := self.handle.read(1 << 20):
                    target.write(chunk)
        self.handle.close()

    def discard(self) -> None:
        """No file after all: the staging is removed."""
        self.handle.close()
        if self._tmp is not None and os.path.exists(self._tmp):
            os.unlink(self._tmp)
