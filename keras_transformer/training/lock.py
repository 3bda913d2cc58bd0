"""One training process per run directory: an advisory lock on `RUN_DIR/.lock`, held for the run's life.

`fcntl.flock` locks belong to the open file: the kernel releases them when
the process ends, however it ends (even SIGKILL), so a lock is never left
behind. The file holds the pid of the process holding it, which a refused
process names. Standard library only: a process can take or test the lock
without loading TensorFlow.
"""

from __future__ import annotations

import fcntl
import os

LOCK_FILENAME = ".lock"


class RunInUseError(ValueError):
    """Another process holds the run directory's lock: the message names its pid."""


class RunLock:
    """The lock of one run directory (`directory/.lock`).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     lock = RunLock(directory).acquire()
        ...     try:
        ...         RunLock(directory).acquire()
        ...     except RunInUseError as error:
        ...         print("refused:", f"(pid {os.getpid()})" in str(error))
        ...     lock.release()
        refused: True
    """

    def __init__(self, directory):
        self.directory = os.path.abspath(directory)
        self.path = os.path.join(self.directory, LOCK_FILENAME)
        self._fd = None

    def acquire(self):
        """Takes the lock at once (no waiting) and writes this process's pid into it; returns self.

        Raises:
            RunInUseError: another process holds it.
        """
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise RunInUseError(
                f"{self.directory} is in use by another training process (pid {holder}): wait for it to end "
                "or stop it, or train into another output directory."
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        self._fd = fd
        return self

    def release(self):
        """Gives the lock up (the file stays: removing it would race with a process taking it)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
