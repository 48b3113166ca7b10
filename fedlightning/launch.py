"""Early start of the other processes of a ``trainer=ddp`` run, before torch is imported.

Lightning's DDP launcher starts the other processes of a node when ``trainer.fit`` begins, so
each of them then imports torch and Lightning, composes the config and builds the data while
the first process waits: start-up is paid once per process, one after the other. The command
(:mod:`fedlightning.cli`) instead starts them right after composing the config, with the
environment Lightning's launcher would give them (``LOCAL_RANK``, ``WORLD_SIZE``, ``NODE_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``: Lightning then treats the processes as launched externally, as
under ``torchrun``), so the imports of all processes overlap. A started process imports, then
waits until the first process reaches ``trainer.fit`` (:func:`release_workers`) before it reads
the run folder, so it sees the folder exactly as it did when Lightning started it; if the first
process stops before that, the others end without training. As with Lightning's launcher, a
process that fails during training takes the others down, and a first process that fails
stops the others.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

START_FD = "FEDLIGHTNING_START_FD"
"""Environment variable naming the pipe a started process waits on (set for started processes only)."""

#: Set by a launcher that starts processes itself (torchrun, SLURM, LSF, ...): leave it to Lightning.
EXTERNAL_LAUNCH = ("LOCAL_RANK", "RANK", "GROUP_RANK", "SLURM_NTASKS", "TORCHELASTIC_RUN_ID", "LSB_JOBID")


def early_processes(trainer: Mapping[str, Any], env: Mapping[str, str]) -> int:
    """How many processes the command starts itself for ``trainer`` (0: leave it to Lightning).

    Only the plain single-node ``strategy: ddp`` with an integer ``devices`` of at least 2 is
    started early; every other setting (spawn strategies, several nodes, ``devices: auto``,
    a launcher that already started the processes) keeps Lightning's own launch.

    >>> early_processes({"strategy": "ddp", "devices": 2}, {})
    2
    >>> early_processes({"strategy": "ddp", "devices": 2}, {"LOCAL_RANK": "0"})
    0
    >>> early_processes({"strategy": "ddp_spawn", "devices": 2}, {}), early_processes({"devices": "auto"}, {})
    (0, 0)
    """
    if any(key in env for key in EXTERNAL_LAUNCH):
        return 0
    if trainer.get("strategy") != "ddp" or int(trainer.get("num_nodes") or 1) != 1:
        return 0
    devices = trainer.get("devices")
    if isinstance(devices, bool) or not (isinstance(devices, int) or (isinstance(devices, str) and devices.isdigit())):
        return 0
    return int(devices) if int(devices) >= 2 else 0


def free_port() -> int:
    """A TCP port free on this host now (for the processes' rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Workers:
    """The processes started by the first one (ranks 1..n-1 of this node), and their start signal."""

    def __init__(self, procs: list[subprocess.Popen[bytes]], release_fd: int, saved_env: dict[str, str | None]) -> None:
        self.procs = procs
        self._saved_env = saved_env
        self._release_fd: int | None = release_fd
        self._finishing = False
        self._watch = threading.Thread(target=self._observe, daemon=True, name="fedlightning-workers")
        self._watch.start()

    def release(self) -> None:
        """Let every started process go on (the first process has reached ``trainer.fit``)."""
        if self._release_fd is not None:
            os.write(self._release_fd, b"1" * len(self.procs))
            os.close(self._release_fd)
            self._release_fd = None

    def finish(self, *, failed: bool) -> None:
        """After the first process's job: wait for the others, or stop them if it failed."""
        self._finishing = True  # the observer leaves the ends to this call
        if self._release_fd is not None:  # never released: the others see the pipe close and end
            os.close(self._release_fd)
            self._release_fd = None
        for proc in self.procs:
            if failed:
                proc.kill()
            proc.wait()
        for key, value in self._saved_env.items():  # this process's environment as it was
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def _observe(self) -> None:
        """Lightning's rule: a started process that fails takes the whole run down."""
        while not self._finishing:
            time.sleep(1.0)
            codes = [proc.poll() for proc in self.procs]
            if not self._finishing and any(code not in (None, 0) for code in codes):
                for proc in self.procs:
                    proc.kill()
                os.kill(os.getpid(), signal.SIGKILL)
            if all(code is not None for code in codes):
                return


_workers: Workers | None = None


def start_workers(processes: int, *, run_dir: str, cwd: str, argv: Sequence[str]) -> Workers:
    """Start ranks 1..``processes``-1 of this node with ``argv`` (the command's overrides).

    Sets this process's rank environment (rank 0) and gives each started process its own,
    plus ``hydra.run.dir`` pinned to this run's folder (as Lightning's launcher does).
    """
    global _workers
    saved = {
        key: os.environ.get(key) for key in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")
    }
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.update({"NODE_RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(processes)})
    read_fd, write_fd = os.pipe()
    procs = []
    for rank in range(1, processes):
        env = {**os.environ, "LOCAL_RANK": str(rank), START_FD: str(read_fd)}
        command = [
            sys.executable,
            "-m",
            "fedlightning.cli",
            *argv,
            f'hydra.run.dir="{run_dir}"',
            f"hydra.job.name=train_ddp_process_{rank}",
            "hydra.output_subdir=null",
        ]
        procs.append(subprocess.Popen(command, env=env, cwd=cwd, pass_fds=(read_fd,)))
    os.close(read_fd)
    _workers = Workers(procs, write_fd, saved)
    return _workers


def release_workers() -> None:
    """Called by :func:`fedlightning.run.run` just before ``trainer.fit``: the started processes go on."""
    if _workers is not None:
        _workers.release()


def wait_for_release() -> bool:
    """In a started process: wait for the first process's signal; ``False`` if it stopped before training."""
    fd = os.environ.get(START_FD)
    if fd is None:
        return True
    got = os.read(int(fd), 1)
    os.close(int(fd))
    del os.environ[START_FD]
    return got == b"1"
