"""Measurements of a running process tree: PSS, CPU time, the load of other processes, the floor.

PSS (proportional set size) is summed over the whole tree from ``/proc/<pid>/smaps_rollup``:
RSS would count torch's shared libraries once per worker process. Foreign load is the CPU the
rest of the machine used while a run was going (``/proc/stat`` busy time minus the tree's own),
in cores.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(name))
    return kids


def _own_children(pid: int) -> list[int] | None:
    """Children of ``pid`` from ``/proc/<pid>/task/*/children`` (``None`` where the kernel has no such file)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(k) for k in f.read().split())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            continue
    return kids


def tree_pids(root: int) -> list[int]:
    """``root`` and all its descendants alive now.

    Walks the tree from ``root`` through each process's ``children`` files (a few reads per
    process of the tree); scans every process of the machine only where those files are missing.
    """
    out, todo = [], [root]
    scanned: dict[int, list[int]] | None = None
    while todo:
        pid = todo.pop()
        if pid in out:  # a process listed by two threads' files while it changed hands
            continue
        out.append(pid)
        kids = _own_children(pid)
        if kids is None:
            scanned = scanned if scanned is not None else _children()
            kids = scanned.get(pid, [])
        todo.extend(kids)
    return out


def pss_mb(pid: int) -> float:
    """The process's PSS in MiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of the process itself (not its children: they are sampled themselves)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(v) for v in fields[11:13]) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all cores)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / CLK_TCK


def foreign_load(seconds: float) -> float:
    """Cores used by the whole machine over ``seconds`` (nothing of ours runs meanwhile)."""
    start, t0 = machine_busy_s(), time.monotonic()
    time.sleep(seconds)
    return (machine_busy_s() - start) / (time.monotonic() - t0)


def wait_for_quiet(*, max_load: float, timeout_s: float, probe_s: float = 2.0) -> tuple[bool, float]:
    """Wait until the foreign load is at most ``max_load`` cores, at most ``timeout_s``.

    Returns ``(quiet, last measured load)``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        load = foreign_load(probe_s)
        if load <= max_load or time.monotonic() >= deadline:
            return load <= max_load, load


@dataclass
class TreeSample:
    """What :class:`TreeMonitor` saw of one run."""

    peak_pss_mb: float = 0.0
    peak_processes: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    foreign_load: float = 0.0
    cpu_timeline: list[tuple[float, float]] = field(default_factory=list)  # (unix time, tree CPU s)


class TreeMonitor:
    """Samples a process tree's CPU every ``interval_s`` and its PSS every ``pss_every`` samples.

    Reading ``smaps_rollup`` walks a process's whole memory map, which for a process of a gigabyte
    is costly (see ``benchmarks/results/performance.md``), so PSS is sampled less often than CPU:
    at the defaults, once a second. A peak shorter than that can be missed (a run's memory grows
    while it loads data, then stays).
    """

    def __init__(self, proc: subprocess.Popen[bytes], *, interval_s: float = 0.1, pss_every: int = 10) -> None:
        self.proc = proc
        self.interval_s = interval_s
        self.pss_every = max(1, int(pss_every))
        self.sample = TreeSample()
        self._cpu: dict[int, float] = {}
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> TreeMonitor:
        self._t0, self._busy0 = time.monotonic(), machine_busy_s()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join()
        s = self.sample
        s.wall_s = time.monotonic() - self._t0
        s.cpu_s = sum(self._cpu.values())
        s.foreign_load = max(0.0, (machine_busy_s() - self._busy0 - s.cpu_s) / max(s.wall_s, 1e-9))

    def _loop(self) -> None:
        tick = 0
        while self.proc.poll() is None:
            pids = tree_pids(self.proc.pid)
            if tick % self.pss_every == 0:
                self.sample.peak_pss_mb = max(self.sample.peak_pss_mb, sum(pss_mb(p) for p in pids))
            tick += 1
            for p in pids:  # a counter only grows: keep its last value once the process is gone
                self._cpu[p] = max(self._cpu.get(p, 0.0), cpu_s(p))
            self.sample.peak_processes = max(self.sample.peak_processes, len(pids))
            self.sample.cpu_timeline.append((time.time(), sum(self._cpu.values())))
            time.sleep(self.interval_s)


def matmul_gflops(m: int, k: int, n: int, *, seconds: float = 1.0) -> float:
    """Single-thread float32 ``torch.mm`` rate at ``(m x k) @ (k x n)``, GFLOP/s (median of 5)."""
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(10):
        a @ b
    rates = []
    for _ in range(5):
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds / 5:
            a @ b
            reps += 1
        rates.append(2 * m * k * n * reps / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rates)
