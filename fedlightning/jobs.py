"""Job records: every run folder says whether its job completed or failed, and why.

A job folder holds ``status.json`` (``{"status": "completed"}`` or ``{"status": "failed",
"error": <one sentence>}``) and, when it failed, ``error.txt`` (the sentence, then the
traceback); the sentence is also logged to the job's ``cli.log``. A failed job never writes
``summary.json``, so nothing that reads results can take it for one; a completed job's
``summary.json`` carries ``"status": "completed"``.

In a multirun, the Hydra sweeper and launcher of ``hydra_plugins/fedlightning_sweep`` (selected in
``configs/train.yaml``) keep going past a failed job, a job whose config does not even compose
(``-m method=fedavgg,fedavg``) included, and end the sweep with :class:`SweepFailedError` listing
the failed jobs, one line each.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import difflib
import json
import logging
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedlightning.errors import FedLightningError
from fedlightning.folder_lock import RunFolderTakenError, writable, write_text_atomic
from fedlightning.schema import TrainSchema, close_match, target_keys

log = logging.getLogger("fedlightning")

STATUS_FILE = "status.json"
ERROR_FILE = "error.txt"
#: Composition errors list a group's options up to this many, else the closest ones.
MAX_OPTIONS = 30


class SweepFailedError(FedLightningError):
    """Some jobs of a multirun failed; the message lists them, one line each."""


def error_sentence(exc: BaseException) -> str:
    """The one sentence that explains ``exc`` to the user (ours, Hydra's, or any other)."""
    if isinstance(exc, FedLightningError):
        return str(exc)
    try:
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException
    except ImportError:  # pragma: no cover - hydra is a dependency
        HydraException = OmegaConfBaseException = ()  # type: ignore[misc,assignment]
    if isinstance(exc, HydraException | OmegaConfBaseException):
        return hydra_error_sentence(exc)
    text = " ".join(str(exc).split()) or "no message"
    return f"{type(exc).__name__}: {text}"


def hydra_error_sentence(exc: BaseException) -> str:
    """One sentence for a Hydra composition or override error (Hydra's are several lines).

    >>> from hydra.errors import MissingConfigException
    >>> hydra_error_sentence(MissingConfigException("...", "method/fedavgg", ["diana", "fedavg"]))
    'method=fedavgg is not a config in configs/method/ (did you mean method=fedavg?); choose one of diana, fedavg.'
    """
    from hydra.errors import MissingConfigException

    missing = getattr(exc, "missing_cfg_file", None)
    if isinstance(exc, MissingConfigException) and missing:
        group, _, name = str(missing).rpartition("/")
        options = list(exc.options or [])
        if not options:
            return f"Could not load the config {missing}; check that configs/{missing}.yaml exists."
        match = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
        hint = f" (did you mean {group}={match[0]}?)" if match else ""
        if len(options) > MAX_OPTIONS:
            closest = difflib.get_close_matches(name, options, n=8, cutoff=0.3) or options[:8]
            listing = f"the closest are {', '.join(closest)} (all {len(options)} in configs/{group}/)"
        else:
            listing = f"choose one of {', '.join(options)}"
        return f"{group}={name} is not a config in configs/{group}/{hint}; {listing}."
    lines = []
    for line in str(exc).splitlines():
        line = line.strip()
        if line.startswith("Config search path"):
            break
        if line and not line.startswith("See https://"):
            lines.append(line.rstrip("."))
    cause = exc.__cause__
    if cause is not None and "not in struct" in str(cause) and lines and lines[0].startswith("Could not override"):
        key = lines[0].split("'")[1] if "'" in lines[0] else "the key"
        return unknown_key_sentence(key, cause)
    if not lines:
        return f"{type(exc).__name__}: {cause or 'no message'}"
    head, rest = lines[0], lines[1:]
    return head + (f" ({'; '.join(rest)})" if rest else "") + "."


def unknown_key_sentence(key: str, cause: BaseException) -> str:
    """The sentence for an override of a key the config lacks (``rouns=3``): the closest existing key.

    ``cause`` is OmegaConf's "not in struct" error, whose ``parent_node`` is the node that lacks
    the key. The candidates are the top-level keys of :class:`~fedlightning.schema.TrainSchema`,
    or a group node's keys, then (when none is close) the keys its ``_target_`` takes.
    """
    full_key = str(getattr(cause, "full_key", "") or key)
    parent_path, _, leaf = full_key.rpartition(".")
    rest = key[len(full_key) :] if key.startswith(full_key) else ""  # below the first missing key
    parent = getattr(cause, "parent_node", None)
    listing = "list the keys with `fedlightning --cfg job`"
    if not parent_path:
        match = close_match(leaf, [f.name for f in dataclasses.fields(TrainSchema)])
        if match:
            return f"{key} is not a key of the config (did you mean {match}{rest}?); {listing}."
        return (
            f"{key} is not a key of the config (a typo?); {listing} "
            f"(a new top-level key is declared in fedlightning/schema.py's TrainSchema first)."
        )
    present = [str(k) for k in parent] if isinstance(parent, Mapping) else []
    match = close_match(leaf, [k for k in present if not k.startswith("_")])
    if match:
        return f"{key} is not a key of the config (did you mean {parent_path}.{match}{rest}?); {listing}."
    match = close_match(leaf, target_keys(parent)) if isinstance(parent, Mapping) else None
    if match:  # a key the component takes that the config leaves at its default
        suggestion = f"{parent_path}.{match}{rest}"
        return f"{key} is not a key of the config (did you mean +{suggestion}=...?); {listing}."
    elsewhere = paths_ending_in(_root(parent), leaf) if isinstance(parent, Mapping) else []
    if elsewhere:  # the key lives in another node (e.g. a setting that moved)
        return f"{key} is not a key of the config (did you mean {' or '.join(elsewhere)}?); {listing}."
    return (
        f"{key} is not a key of the config (a typo?); {listing}, "
        f"or add a new one with +{key}=... if its component takes it."
    )


def paths_ending_in(node: Any, leaf: str, prefix: str = "") -> list[str]:
    """The dotted paths of every key named ``leaf`` in a nested mapping, depth first.

    >>> paths_ending_in({"method": {"lr": 1}, "reports": {"eval": {"test_samples": 3}}}, "test_samples")
    ['reports.eval.test_samples']
    """
    found = []
    for name, value in node.items() if isinstance(node, Mapping) else ():
        path = f"{prefix}{name}"
        if name == leaf:
            found.append(path)
        if isinstance(value, Mapping) and name != "hydra":
            found.extend(paths_ending_in(value, leaf, f"{path}."))
    return found


def _root(node: Any) -> Any:
    """The whole config an OmegaConf node belongs to, as plain containers (interpolations unresolved)."""
    from omegaconf import DictConfig, OmegaConf

    get_root = getattr(node, "_get_root", None)
    root = node if get_root is None else get_root()
    return OmegaConf.to_container(root, resolve=False) if isinstance(root, DictConfig) else root


def _timestamp() -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]


def record_failure(
    job_dir: str | Path, exc: BaseException, *, overrides: Sequence[str] = (), log_file: str | None = None
) -> str:
    """Write ``error.txt`` and ``status.json`` into ``job_dir`` and log the sentence; return it.

    ``log_file`` (e.g. ``cli.log``) is appended to directly, for a job whose logging Hydra never
    configured (its config did not compose); otherwise the ``fedlightning`` logger carries the
    error into the job's log.
    """
    sentence = error_sentence(exc)
    job_dir = Path(job_dir)
    # A folder that another run holds, or that holds another run, keeps its records (its log
    # included): nothing is written, and the command tells the sentence on stderr.
    if isinstance(exc, RunFolderTakenError) or not writable(job_dir):
        return sentence
    trace = "".join(traceback.format_exception(exc))
    status = {"status": "failed", "error": sentence, "error_type": type(exc).__name__, "overrides": list(overrides)}
    where = f"{sentence} (traceback in {job_dir / ERROR_FILE})"
    try:  # atomic writes: a full disk leaves the previous status whole, never a 0-byte file
        job_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(job_dir / ERROR_FILE, f"{sentence}\n\n{trace}")
        write_text_atomic(job_dir / STATUS_FILE, json.dumps(status, indent=2) + "\n")
    except OSError as failure:  # the job's own error says more than this one
        where = f"{sentence} (not recorded in {job_dir}: {failure.strerror or failure})"
    # The log gets the sentence only: Hydra's console handler shows the log too, and the user
    # sees no traceback for an error they can fix (it is in error.txt).
    if log_file is not None:
        with contextlib.suppress(OSError), (job_dir / log_file).open("a") as handle:
            handle.write(f"[{_timestamp()}][fedlightning][ERROR] - {where}\n")
    else:
        log.error("%s", where)
    return sentence


def record_success(job_dir: str | Path, *, overrides: Sequence[str] = ()) -> None:
    """Write ``status.json`` with ``"status": "completed"`` into ``job_dir`` and drop an earlier ``error.txt``.

    A folder this job did not make its own (a complete run returned as it was) is left as it is.
    """
    if not writable(job_dir):
        return
    status = {"status": "completed", "overrides": list(overrides)}
    try:
        write_text_atomic(Path(job_dir, STATUS_FILE), json.dumps(status, indent=2) + "\n")
        Path(job_dir, ERROR_FILE).unlink(missing_ok=True)  # a failed attempt's, now resumed and completed
    except OSError as exc:  # summary.json is written: the result stands without its status
        log.warning("Could not write %s (%s); the run's summary.json holds its result.", exc.filename, exc.strerror)


def read_status(job_dir: str | Path) -> dict[str, Any] | None:
    """The job's ``status.json``, or None when it has none (or an unreadable one)."""
    path = Path(job_dir, STATUS_FILE)
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def job_folders(top: str | Path) -> list[Path]:
    """The job folders under ``top`` (itself included): those holding a status, a summary or ``.hydra``."""
    top = Path(top)
    marks = (STATUS_FILE, "summary.json", ".hydra")
    found = {p.parent for mark in marks for p in top.rglob(mark)}
    if any((top / mark).exists() for mark in marks):
        found.add(top)
    return sorted(found)


def sweep_failed(failures: Sequence[tuple[int, str, Sequence[str], str]], total: int) -> SweepFailedError:
    """The end-of-sweep error: one line per failed job (number, folder, overrides, sentence)."""
    lines = [f"{len(failures)} of {total} jobs failed (error.txt in each folder):"]
    for num, folder, overrides, sentence in failures:
        lines.append(f"  #{num} {folder} [{' '.join(overrides)}]: {sentence}")
    return SweepFailedError("\n".join(lines))


def failed_or_unfinished(dirs: Sequence[str | Path]) -> list[tuple[str, str]]:
    """(folder, reason) for each job folder under ``dirs`` that holds no result.

    A failed job gives its recorded sentence; a folder with neither ``summary.json`` nor a status
    (a job killed or still running) says so.
    """
    found = []
    for top in dirs:
        for folder in job_folders(top):
            if (folder / "summary.json").is_file():
                continue
            status = read_status(folder)
            if status is not None and status.get("status") == "failed":
                found.append((str(folder), f"failed: {status.get('error') or 'no error recorded'}"))
            elif status is None or status.get("status") != "completed":
                found.append((str(folder), "no summary.json and no status: killed or still running"))
    return found


def skipped_report(skipped: Sequence[tuple[str, str]], total: int) -> str:
    """The lines that list the job folders a plot or table left out, with the reason of each.

    >>> print(skipped_report([("sweep/1", "failed: rounds must be at least 1.")], 3))
    left out 1 of 3 job folders:
      sweep/1: failed: rounds must be at least 1.
    """
    lines = [f"left out {len(skipped)} of {total} job folders:"]
    lines += [f"  {folder}: {reason}" for folder, reason in skipped]
    return "\n".join(lines)
