"""Crash-safe file primitives: temp file + fsync + atomic rename, and range copies.

Everything the project publishes under a final name goes through :func:`atomic_writer`
(or :func:`publish_dir` for folders), so a crash leaves either the old content or the new,
never a partial file.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import stat
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TypeGuard

from ..errors import ConversionError, OutputError, PackageError, WeightstoreError

COPY_CHUNK = 8 << 20
# errors that concern the file being written, whatever else the operation touched
WRITE_ERRNOS = frozenset(getattr(errno, n) for n in ("ENOSPC", "EDQUOT", "EFBIG", "EROFS")
                         if hasattr(errno, n))


class NotRegularFileError(OSError):
    """The path is a FIFO, a device, a socket or a folder: reading it could block forever
    or mean nothing, so it is refused before any read."""


def open_regular(path: str | os.PathLike[str], *, nofollow: bool = False) -> int:
    """Open ``path`` for reading, refusing anything but a regular file.

    ``O_NONBLOCK`` makes opening a FIFO return at once (a plain open would wait for a
    writer), so the check on the opened descriptor never races with the path.
    ``nofollow``: a symbolic link is refused too (``OSError`` with ``ELOOP``), as store
    objects never are links.
    """
    flags = (os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)
             | getattr(os, "O_NOCTTY", 0) | (getattr(os, "O_NOFOLLOW", 0) if nofollow else 0))
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise NotRegularFileError(f"{kind} (a FIFO, device or socket is never read)"
                                  if kind != "a folder" else kind)
    return fd


class FileTooLargeError(ValueError):
    """The file is larger than what its reader takes: refused before it is read."""


# bytes: a record (a cache entry, a signed record, a prepared record) larger than this is
# refused before it is read, so a sparse file of gigabytes costs one fstat, not its size in
# memory and seconds of hashing. The largest of a model of 100,000 weights is some tens of
# megabytes.
RECORD_LIMIT = 64 << 20


def read_regular(path: str | os.PathLike[str], *, limit: int | None = None) -> bytes:
    """The whole of a regular file; a FIFO, device, socket or folder is refused before any
    read (:class:`NotRegularFileError`, an ``OSError``), so a reader never waits on one.
    ``limit``: a file of more bytes is refused (:class:`FileTooLargeError`, a
    ``ValueError``) before anything is read, and never more than that is read (a file
    growing meanwhile is refused too)."""
    with os.fdopen(open_regular(path), "rb") as f:
        if limit is None:
            return f.read()
        if os.fstat(f.fileno()).st_size > limit or len(data := f.read(limit + 1)) > limit:
            raise FileTooLargeError(f"larger than {limit} bytes")
        return data


def read_record_bytes(path: str | os.PathLike[str]) -> bytes:
    """A record file, at most :data:`RECORD_LIMIT` bytes (see :func:`read_regular`)."""
    return read_regular(path, limit=RECORD_LIMIT)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Persist a rename or create inside ``path`` (no-op where directories can't be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@functools.cache
def _umask() -> int:
    """The process umask, read without changing it where the system allows."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore once, before any worker thread
    os.umask(mask)
    return mask


def file_mode() -> int:
    """What ``open()`` would give a new file: temp files start private (0600)."""
    return 0o666 & ~_umask()


def dir_mode() -> int:
    return 0o777 & ~_umask()


_HELD: dict[str, int] = {}  # temp folder -> the descriptor that holds its lock


def make_temp_dir(parent: Path, prefix: str) -> Path:
    """A temp folder beside its final place, with the permissions of an ordinary mkdir.

    The folder stays locked (``flock`` on the folder itself) until :func:`publish_dir` or
    :func:`discard_temp_dir` lets it go, so a temp folder with ``prefix`` that can be locked
    has lost its run (a killed process): those are removed first. A live run's is never
    touched, whoever started it.
    """
    import tempfile  # only where something is written

    remove_dead_temp_dirs(parent, prefix)
    while True:
        path = Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=parent))
        fd = _hold(path)
        if fd is not None:
            break
    os.chmod(path, dir_mode())
    if fd >= 0:
        _HELD[str(path)] = fd
    return path


def _hold(path: Path) -> int | None:
    """Lock the new folder ``path``: its descriptor (-1 where folders cannot be locked), or
    None when a sweep of dead temp folders took it between its creation and the lock (it
    saw a folder nobody held and removed it)."""
    try:
        import fcntl
    except ImportError:
        return -1
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits only for such a sweep
        if os.path.samestat(os.stat(path), os.fstat(fd)):
            return fd
    except FileNotFoundError:
        pass
    except OSError:  # a file system without locks: the folder is only never swept
        return fd
    os.close(fd)
    return None


def _let_go(path: Path) -> None:
    fd = _HELD.pop(str(path), None)
    if fd is not None:
        os.close(fd)


@contextlib.contextmanager
def folder_lock(path: Path) -> Iterator[None]:
    """Hold the folder ``path`` exclusively (``flock`` on the folder itself, waiting for
    another holder): for a short step that replaces several files in it, which two runs
    must not interleave. No lock file is left in the folder (a no-op where folders cannot
    be locked)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        with contextlib.suppress(OSError):  # a file system without locks: unserialized
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def discard_temp_dir(path: Path | None) -> None:
    """Remove a temp folder of :func:`make_temp_dir` that is not to be published."""
    import shutil

    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
        inside = str(path) + os.sep
        for held in [p for p in _HELD if p == str(path) or p.startswith(inside)]:
            _let_go(Path(held))


def is_temp_dir_name(name: str, prefix: str) -> bool:
    """Is ``name`` one that :func:`make_temp_dir` gives with ``prefix``: the prefix,
    tempfile's 8 random characters, ``.tmp``?"""
    import re

    return re.fullmatch(re.escape(prefix) + r"[a-z0-9_]{8}\.tmp", name) is not None


def is_temp_dir(path: Path, prefix: str) -> bool:
    """Is ``path`` a temp folder of :func:`make_temp_dir` with ``prefix``, a live run's
    or a killed one's: such a name, and a folder itself (a file or a link named like one
    is not one)?"""
    try:
        return is_temp_dir_name(path.name, prefix) and stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def remove_dead_temp_dirs(parent: Path, prefix: str) -> list[Path]:
    """Remove the temp folders ``<prefix>*.tmp`` in ``parent`` whose run died: those that
    can be locked (a live run holds its own, see :func:`make_temp_dir`)."""
    import glob

    return [stale for stale in parent.glob(f"{glob.escape(prefix)}*.tmp")
            if is_temp_dir_name(stale.name, prefix) and unheld_temp_dir(stale)]


def unheld_temp_dir(folder: Path, *, remove: bool = True) -> bool:
    """Is ``folder``, a temp folder of :func:`make_temp_dir`, one whose run died (no run
    holds it)? Then it is removed while locked (unless ``remove`` is False), so a run
    that only just created it sees it gone and makes another. False for a file or a link
    named like one: not ours."""
    import shutil

    if str(folder) in _HELD:
        return False
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
                     | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        if not _try_lock(fd):
            return False
        if remove:
            shutil.rmtree(folder, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def check_output_file(path: str | os.PathLike[str],
                      error: type[WeightstoreError] = OutputError) -> None:
    """Refuse an output path that is neither new nor a regular file (nor a link to one):
    a rename would put a file in place of a FIFO, a device node or a socket (``/dev/full``
    replaced by a report), and a folder is never an output file. Every file published
    under a name given by a user goes through here, by :func:`atomic_writer`; commands
    also call it before their work, so a bad ``--output`` costs nothing. ``error``: the
    command's own class (a conversion refuses with :class:`ConversionError`)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # new, or a path the write itself will report
        return
    if stat.S_ISREG(mode):
        return
    kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode)
            or stat.S_ISBLK(mode) else "something else")
    raise error(f"output path is not a regular file but {kind}; only a regular file or a "
                "new path is written", output=os.fspath(path))


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str], mode: str = "wb", *,
                  sync_dir: bool = True, durable: bool = True,
                  sweep: bool = False) -> Iterator[BinaryIO]:
    """Yield a temp file beside ``path``; on success fsync it and rename it over ``path``.

    The writer holds a lock on its temp file until it is renamed or removed
    (:func:`locked_temp`), so a temp file that can be locked has lost its writer (a killed
    process). ``sweep`` first removes such temp files of ``path``: where a large file is
    rewritten in place, beside a user's own files.

    The file gets the mode an ordinary ``open()`` would give it (0666 less the umask), so
    published packages and shared stores are readable by others as usual. ``sync_dir``
    False leaves the folder's fsync to the caller: a temp folder published by
    :func:`publish_dir`, which fsyncs it once for all its files before renaming it.
    ``durable=False`` skips both fsyncs, for notes that mean nothing after a crash (who
    holds a lock): still never torn, only possibly lost; or for a caller that fsyncs the
    file itself before the block ends and its folder after (the package writer, whose
    workers fsync the files they read back side by side).
    """
    path = Path(path)
    check_output_file(path)
    if sweep:
        remove_dead_temps(path)
    try:
        fd, tmp = locked_temp(path.parent, f".{path.name}.")
    except OSError as exc:  # the path asked for, not the temp name nobody asked for
        raise type(exc)(exc.errno, exc.strerror or str(exc), str(path)) from None
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, file_mode())
        with os.fdopen(fd, mode, closefd=False) as f:  # fd (and its lock) stays open
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        check_output_file(path)  # again: the write may have taken a while
        try:
            os.replace(tmp, path)
        except OSError as exc:  # name the path asked for, not the temp file beside it
            raise type(exc)(exc.errno, exc.strerror, str(path)) from None
        tmp = None
        if durable and sync_dir:
            fsync_dir(path.parent)
    except OSError as exc:
        if exc.filename is None and exc.errno in WRITE_ERRNOS:
            raise _with_path(exc, path) from None
        raise
    finally:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        os.close(fd)  # the lock goes last: once the temp name is renamed away or removed


def locked_temp(folder: str | os.PathLike[str], prefix: str) -> tuple[int, str]:
    """A new temp file ``<prefix><random>.tmp`` in ``folder``, open and held: its writer
    keeps an exclusive ``flock`` on it until the file is renamed away or removed (the
    descriptor is closed only then), so a temp file that no process holds has lost its
    writer (a killed process: the kernel drops its locks) and :func:`unlink_unheld` may
    remove it. A sweep that took the file between its creation and the lock has removed
    it: another is made. Where the file system has no locks, the file is not held, and
    no sweep ever removes it."""
    import tempfile

    while True:
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)  # waits only for a sweep looking at it
            if os.path.samestat(os.stat(tmp, follow_symlinks=False), os.fstat(fd)):
                return fd, tmp
        except FileNotFoundError:
            pass  # swept before we held it
        except (ImportError, OSError):
            return fd, tmp  # no locks here: never swept
        os.close(fd)


def _try_lock(fd: int) -> bool:
    """Take an exclusive lock on ``fd`` without waiting; False when another holds it (or
    the platform or file system has no such locks)."""
    try:
        import fcntl
    except ImportError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def unlink_unheld(folder_fd: int, name: str, *, remove: bool = True) -> bool:
    """Remove the regular file ``name`` of the folder open as ``folder_fd`` when no
    process holds it (see :func:`locked_temp`): it is locked first and removed while
    locked, so a writer that made it only just now sees it gone and makes another.
    ``remove=False`` only says whether it would be removed. False when it is held, gone,
    not a regular file, or on a file system without locks."""
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_NONBLOCK", 0), dir_fd=folder_fd)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or not _try_lock(fd):
            return False
        if not os.path.samestat(os.stat(name, dir_fd=folder_fd, follow_symlinks=False),
                                os.fstat(fd)):
            return False  # replaced since it was opened: judged next time
        if remove:
            os.unlink(name, dir_fd=folder_fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def remove_dead_temps(path: Path) -> list[Path]:
    """Remove the temp files that atomic writes of ``path`` left when their process died
    (no process holds them: :func:`unlink_unheld`)."""
    import glob

    folder = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        return [stale for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp")
                if unlink_unheld(folder, stale.name)]
    finally:
        os.close(folder)


def name_path(exc: OSError, written: str | os.PathLike[str],
              read: str | os.PathLike[str] | None = None) -> OSError:
    """The error with the file it concerns, when it named none: the file written for a
    full or read-only disk (``No space left on device`` alone does not say which), else
    the file read from (``written`` when there is none). An error that is not the file
    system's (no errno: a registry or network error raised through the same ``except``) is
    left as it is."""
    if exc.filename or exc.errno is None:
        return exc
    path = written if exc.errno in WRITE_ERRNOS or read is None else read
    return type(exc)(exc.errno, exc.strerror or str(exc), os.fspath(path))


def _with_path(exc: OSError, path: Path) -> OSError:
    """The same error, naming ``path`` when it named no file (``No space left on device``
    alone does not say which disk)."""
    if exc.filename is not None:
        return exc
    return type(exc)(exc.errno, exc.strerror or str(exc), str(path))


def parse_json(data: str | bytes) -> Any:
    """``json.loads``, a document nested deeper than the parser follows refused as the
    malformed input it is: a ``ValueError``, as any other, never a ``RecursionError``."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes | memoryview, *,
                       sync_dir: bool = True, durable: bool = True) -> None:
    with atomic_writer(path, sync_dir=sync_dir, durable=durable) as f:
        f.write(data)


def write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """``pwrite`` until every byte is out (a single call may write part of the buffer)."""
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def copy_range(src_fd: int, src_offset: int, dst_fd: int, dst_offset: int, length: int) -> None:
    """Copy ``length`` bytes between descriptors in the kernel where possible.

    ``os.copy_file_range`` lets filesystems that support it share extents (reflink) and
    avoids user-space buffers elsewhere; a read/write loop is the fallback.
    """
    remaining = length
    use_kernel = hasattr(os, "copy_file_range")
    while remaining > 0:
        n = 0
        if use_kernel:
            try:
                n = os.copy_file_range(src_fd, dst_fd, min(remaining, 1 << 30),
                                       src_offset, dst_offset)
            except OSError:
                use_kernel = False
                continue
            if n == 0:
                raise EOFError(f"source ended {remaining} bytes early")
        else:
            chunk = os.pread(src_fd, min(remaining, COPY_CHUNK), src_offset)
            if not chunk:
                raise EOFError(f"source ended {remaining} bytes early")
            write_all(dst_fd, chunk, dst_offset)
            n = len(chunk)
        src_offset += n
        dst_offset += n
        remaining -= n


def read_exact(fd: int, offset: int, length: int) -> bytes:
    """Read exactly ``length`` bytes or raise ``EOFError`` (never a silent short read)."""
    parts = []
    remaining = length
    while remaining > 0:
        chunk = os.pread(fd, min(remaining, 1 << 30), offset)
        if not chunk:
            raise EOFError(f"short read: {length - remaining} of {length} bytes at offset "
                           f"{offset - (length - remaining)}")
        parts.append(chunk)
        offset += len(chunk)
        remaining -= len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@functools.cache
def _renameat2():
    """glibc's renameat2, or None where the system has none."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        func = libc.renameat2
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                     ctypes.c_uint]
    return func


_SYNC_FILE_RANGE_WRITE = 2


@functools.cache
def _sync_file_range():
    """glibc's sync_file_range, or None where the system has none."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        func = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return func


WRITEBACK_MIN = 1 << 20  # a range this large is worth a writeback hint of its own


def start_writeback(fd: int, offset: int = 0, nbytes: int = 0) -> None:
    """Ask the kernel to start writing ``fd``'s dirty pages now, without waiting: the
    ``nbytes`` at ``offset``, or (0) everything from ``offset`` on.

    The fsync that publishes the file then waits only for what is still in flight, so
    the disk works while the caller copies the next range, reads the file back or writes
    the next one. A hint only: durability still comes from the fsync (no-op where
    unsupported).
    """
    func = _sync_file_range()
    if func is not None:
        func(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``RENAME_EXCHANGE``); False where unsupported."""
    func = _renameat2()
    if func is None:
        return False
    if func(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    import ctypes

    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False  # the filesystem cannot exchange
    raise OSError(err, os.strerror(err), str(b))


def published_meanwhile(folder: Path) -> PackageError:
    """The error of a run that lost the race for a new folder to another run."""
    return PackageError("another run published this folder meanwhile; it is left as that "
                        "run wrote it", folder=str(folder))


def publish_dir(tmp_dir: Path, final_dir: Path, *, replace: bool = False,
                over_empty: bool = False) -> None:
    """Put a fully written temp folder in place of ``final_dir``, atomically where possible.

    Without ``replace``, ``final_dir`` must not exist (``over_empty``: or be an empty
    folder) and is created by one atomic rename that never replaces anything (Linux
    ``RENAME_NOREPLACE``): of two runs that checked the folder absent and raced to publish
    it, one wins and the other gets :func:`published_meanwhile`, its temp folder left for
    its caller to discard. Every command that publishes a folder goes through here, so the
    check that decided to write the folder is made again in the same step as the rename.

    With ``replace``, an existing folder is swapped out in one step (``RENAME_EXCHANGE``),
    so readers see the old package or the new one, never none. Where the system cannot
    exchange, the old folder is renamed aside first; the caller holds the folder's lock.

    Leftovers of earlier killed publishes of the same folder (``.<name>.*.tmp`` that no run
    holds, ``.<name>.old-*``) are removed.
    """
    import glob
    import shutil

    fsync_dir(tmp_dir)
    parent, name = final_dir.parent, final_dir.name
    if replace and final_dir.exists():
        if exchange(tmp_dir, final_dir):
            shutil.rmtree(tmp_dir, ignore_errors=True)
        else:
            old = parent / f".{name}.old-{os.urandom(8).hex()}"
            os.replace(final_dir, old)
            os.replace(tmp_dir, final_dir)
            shutil.rmtree(old, ignore_errors=True)
    else:
        if over_empty:
            with contextlib.suppress(OSError):  # not empty (or gone): the rename decides
                final_dir.rmdir()
        _rename_new(tmp_dir, final_dir)
    _let_go(tmp_dir)
    fsync_dir(parent)
    remove_dead_temp_dirs(parent, f".{name}.")
    for stale in parent.glob(f".{glob.escape(name)}.old-*"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)


_RENAME_NOREPLACE = 1


def _rename_new(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``, which must not exist; :func:`published_meanwhile` when it
    does. Where the system has no ``RENAME_NOREPLACE``, a rename after a check: a folder
    made in between is replaced only if it is empty."""
    func = _renameat2()
    if func is not None:
        if func(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst),
                _RENAME_NOREPLACE) == 0:
            return
        import ctypes

        err = ctypes.get_errno()
        if err in (errno.EEXIST, errno.ENOTEMPTY):
            raise published_meanwhile(dst)
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), str(dst))
    if os.path.lexists(dst):
        raise published_meanwhile(dst)
    try:
        os.rename(src, dst)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            raise published_meanwhile(dst) from None
        raise type(exc)(exc.errno, exc.strerror, str(dst)) from None


def is_relative_inside(name: object, *, hidden: bool = True) -> TypeGuard[str]:
    """``name`` is a '/'-separated relative path that stays inside its folder: not empty
    or absolute, no ``..``, ``.`` or empty component, no backslash or NUL; with ``hidden``
    False, no component starting with a dot either (temp files and locks are hidden)."""
    if (not isinstance(name, str) or not name or name.startswith("/") or "\\" in name
            or "\x00" in name):
        return False
    return not any(p in ("", ".", "..") or (not hidden and p.startswith("."))
                   for p in name.split("/"))


MAX_ALIGNMENT = 1 << 20  # 1 MiB: a page-size multiple on every system weights are loaded on


def alignment_problem(value: object) -> str | None:
    """Why ``value`` cannot be a weight alignment, or None when it can: the one rule of the
    recipe schema, ``convert --alignment``, layout planning and the store. A power of two
    from 1 to :data:`MAX_ALIGNMENT`: a larger one buys nothing a loader can use, and pads
    each payload with up to that many zero bytes (2**36 made a 550 GB sparse file)."""
    if type(value) is not int or value < 1 or value & (value - 1) or value > MAX_ALIGNMENT:
        return (f"alignment must be a power of two, at least 1 and at most {MAX_ALIGNMENT} "
                f"(1 MiB), got {value!r}")
    return None


def align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def check_outputs(src: Path, inputs: set[Path], outputs: Iterable[Path], *,
                  keeps_folder: bool = False) -> None:
    """Refuse outputs that would overwrite an input file, or leave the input's folder when
    ``keeps_folder`` (the model's weights are files beside it)."""
    for out in outputs:
        out = Path(out)
        if "\0" in str(out):
            raise ConversionError("output path contains a NUL byte", output=repr(str(out)))
        if not out.parent.is_dir():
            raise ConversionError("output folder does not exist", folder=str(out.parent))
        check_output_file(out, ConversionError)
        if out.resolve() in inputs:
            raise ConversionError("output would overwrite a file the input model reads",
                                  input=str(src), output=str(out))
        if keeps_folder and out.resolve().parent != src.resolve().parent:
            raise ConversionError("the model's weights are files beside it; write the output "
                                  "in the same folder", input=str(src), output=str(out))


def check_output_folder(folder: Path) -> None:
    """Can ``folder`` (which may not exist yet) be created and written? Checked before a
    build touches the store, so a bad output path costs nothing and loses nothing."""
    text = str(folder)
    if "\0" in text:
        raise PackageError("output path contains a NUL byte", folder=repr(text))
    existing = folder
    while not os.path.lexists(existing) and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        raise PackageError("output path runs through something that is not a folder",
                           folder=text, blocked_by=str(existing))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PackageError("output folder is not writable", folder=text,
                           not_writable=str(existing))
