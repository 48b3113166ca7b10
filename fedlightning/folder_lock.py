"""Who may write a run folder, and writes into it that a kill or a full disk cannot leave half-done.

A run holds its folder with :func:`hold` for as long as it runs: an exclusive advisory lock on
``<folder>/.lock`` (released by the end of the process, even by SIGKILL), removed when the run
ends. A second run on a held folder is refused with :class:`RunFolderTakenError` before it
writes anything. Holding is not owning: a folder that holds the outputs of an earlier run
(:data:`RUN_OUTPUTS`) becomes this run's only once :mod:`fedlightning.run_folder` has checked
that its ``run.json`` records the same config (:func:`mark_claimed`); until then
:func:`writable` is false and the job records (``status.json``, ``error.txt``, Hydra's
``.hydra/``) are not written into it.

A write that fails for lack of space or permission (``ENOSPC``, ``EROFS``, ``EACCES``, ...)
while a folder is held ends the run with :class:`WriteFailedError`: one sentence naming the file
and the fix. Light on purpose (no torch): the command imports it before Lightning.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from fedlightning.errors import ConfigError, FedLightningError

LOCK_FILE = ".lock"
RUN_OUTPUTS = ("summary.json", "comm_records.csv", "bits_vs_accuracy.csv", "checkpoints", "csv")
"""What a run writes into its folder: a folder holding any of them belongs to the run that wrote them."""

_REASONS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EFBIG: "the file is larger than the file system allows",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission is denied",
    errno.EPERM: "the operation is not permitted",
    errno.ENOTDIR: "a part of its path is a regular file, not a folder",
    errno.EEXIST: "a regular file is in the way of the folder",
    errno.EISDIR: "a folder is in its place",
}


class RunFolderTakenError(ConfigError):
    """The run folder belongs to another run (a running one, or one of another config); nothing is written."""


class WriteFailedError(FedLightningError):
    """A file of the run could not be written (no space, read-only, permission); the message names it."""


def write_failure(exc: OSError, *, path: str | Path, fix: str | None = None) -> WriteFailedError | None:
    """One sentence for a write that failed for lack of space or permission (``None`` for other errors).

    ``path`` is named when the error carries no file name of its own; ``fix`` replaces the
    default advice (free space, or choose a writable run folder).

    >>> import errno
    >>> full = OSError(errno.ENOSPC, "No space left on device", "/r/summary.json")
    >>> print(write_failure(full, path="/r", fix="free some space"))
    Could not write /r/summary.json: the disk is full (ENOSPC); free some space.
    """
    reason = _REASONS.get(exc.errno or 0)
    if reason is None:
        return None
    name = exc.filename if exc.filename is not None else path
    if fix is None:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            fix = "free some space and run the same command again (it resumes from the last checkpoint)"
        else:
            fix = "choose a folder this user can write (hydra.run.dir=...)"
    code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return WriteFailedError(f"Could not write {name}: {reason} ({code}); {fix}.")


@dataclass
class _Hold:
    handle: IO[str] | None
    free: bool
    claimed: bool = False
    on_writable: list[Callable[[], None]] = field(default_factory=list)


_HELD: dict[str, _Hold] = {}


def _key(folder: str | Path) -> str:
    return str(Path(folder).resolve())


def has_run_outputs(folder: Path) -> list[str]:
    """The :data:`RUN_OUTPUTS` present in ``folder``."""
    return [name for name in RUN_OUTPUTS if (folder / name).exists()]


def make_folder(folder: str | Path) -> Path:
    """``mkdir -p folder``; a folder that cannot be made stops the run with one sentence."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        failure = write_failure(exc, path=folder)
        if failure is None:
            raise
        raise failure from None
    return folder


@contextlib.contextmanager
def hold(folder: str | Path, *, on_writable: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold ``folder`` (``<folder>/.lock``) while the block runs; re-entrant within one process.

    ``on_writable`` is called once the folder is this run's: at once for a folder without run
    outputs, else when :func:`mark_claimed` accepts it.

    Raises:
        RunFolderTakenError: another process holds the folder.
        WriteFailedError: the folder, or a file the block writes, cannot be written (no space,
            read-only, permission); also for such an error raised inside the block.
    """
    folder = Path(folder)
    key = _key(folder)
    held = _HELD.get(key)
    if held is None:
        make_folder(folder)
        handle = _lock(folder)
        held = _HELD[key] = _Hold(handle=handle, free=not has_run_outputs(folder))
        outer = True
    else:
        outer = False
    if on_writable is not None:
        held.on_writable.append(on_writable)
    try:
        if held.free or held.claimed:
            _writable_now(held)
        yield
    except OSError as exc:
        failure = write_failure(exc, path=folder)
        if failure is None:
            raise
        raise failure from exc
    finally:
        if outer:
            del _HELD[key]
            _unlock(folder, held.handle)


def _lock(folder: Path) -> IO[str] | None:
    try:
        import fcntl
    except ImportError:  # no advisory locks on this platform
        return None
    path = folder / LOCK_FILE
    for _ in range(100):
        try:
            handle = path.open("a+")
        except OSError as exc:
            failure = write_failure(exc, path=path)
            if failure is None:
                raise
            raise failure from None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise RunFolderTakenError(
                f"Another run is writing the run folder {folder}; wait for it to finish "
                "or choose another folder (hydra.run.dir=...)."
            ) from None
        try:  # the run that held it may have removed the file before we locked it: lock the new one
            same = os.fstat(handle.fileno()).st_ino == path.stat().st_ino
        except FileNotFoundError:
            same = False
        if same:
            return handle
        handle.close()
    raise RunFolderTakenError(f"Could not take {path}: other runs keep replacing it; run one command per folder.")


def _unlock(folder: Path, handle: IO[str] | None) -> None:
    if handle is None:
        return
    try:
        with contextlib.suppress(OSError):  # a read-only folder keeps it; the lock still ends below
            (folder / LOCK_FILE).unlink()
    finally:
        handle.close()  # releases the lock (so does the end of the process, even by SIGKILL)


def mark_claimed(folder: str | Path) -> None:
    """The held ``folder`` is this run's (its record matches the config): job records may go into it."""
    held = _HELD.get(_key(folder))
    if held is not None and not held.claimed:
        held.claimed = True
        _writable_now(held)


def _writable_now(held: _Hold) -> None:
    while held.on_writable:
        held.on_writable.pop(0)()


def writable(folder: str | Path) -> bool:
    """Whether this process may write its job's records into ``folder``.

    False while it holds a folder of an earlier run that it has not yet claimed; true for a
    folder it holds and owns, or one it does not hold (a caller outside :func:`hold`).
    """
    held = _HELD.get(_key(folder))
    return held is None or held.free or held.claimed


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to a temporary file next to ``path``, flushed to disk, then renamed onto it.

    A write that fails (a kill, a full disk) leaves the previous file whole and no temporary file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("w", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if exc.filename is None or exc.filename == str(tmp):  # name the file the run writes, not the temporary
            exc.filename = str(path)
        raise
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
