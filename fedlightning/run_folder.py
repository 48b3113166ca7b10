"""One run folder, one run: the config on record, automatic resume, and CSVs that hold the run once.

A run folder records its config in ``run.json`` (the resolved config without the keys of
:data:`IGNORED_KEYS`, which do not change what is computed). Running again in the same folder:

* with the same config, and ``summary.json`` present: the run is complete; nothing is redone
  and the recorded summary is returned;
* with the same config, and no summary: the run resumes from the latest readable checkpoint in
  ``checkpoints/`` (an unreadable one is reported and the previous one used), or starts again
  from round 0 when there is none; the CSVs are cut back to the rounds the checkpoint holds,
  so the resumed run appends each later round once (``fedlightning.run`` first checks that the
  code still draws the clients and hold-out of the folder's ``partition.json``);
* with another config: the run stops with one sentence naming the folder and the keys that
  differ.

Checkpoints given as ``ckpt_path`` are checked before any compute: readable, a fedlightning
checkpoint of this model and method, and not past ``rounds``.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import pickletools
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from fedlightning.checkpointing import LAST, safe_torch_load
from fedlightning.errors import ConfigError
from fedlightning.folder_lock import RUN_OUTPUTS as RUN_OUTPUTS
from fedlightning.folder_lock import RunFolderTakenError, mark_claimed
from fedlightning.folder_lock import hold as locked  # noqa: F401 (the run folder's lock, used by fedlightning.run)
from fedlightning.folder_lock import write_text_atomic as write_text_atomic

log = logging.getLogger("fedlightning")

RUN_FILE = "run.json"
SUMMARY_FILE = "summary.json"
RECORDS_FILE = "comm_records.csv"
CURVE_FILE = "bits_vs_accuracy.csv"
CHECKPOINTS = "checkpoints"
IGNORED_KEYS = (
    "ckpt_path",
    "threads",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "print_config",
    # How many processes share the work: each round's cohort, random streams and bit counts are
    # those of one process (README "Several processes"), so a run resumes with another count.
    "trainer.devices",
    "trainer.num_nodes",
    "trainer.strategy",
    "trainer.use_distributed_sampler",
)
"""Config keys that do not change what a run computes; a run folder accepts any value for them."""
ADDED_NODES: dict[str, dict[str, Any]] = {
    "early_stopping": {"monitor": None},
    # read only by the methods that declare a report, whose own node changed when it was added
    "reports": {},
}
"""Config nodes added after run folders were first recorded, each with the values under which it
changes nothing: a record made before the node existed matches a config whose node holds them."""


class UnreadableCheckpointError(Exception):
    """A checkpoint file that cannot be used; the message completes "<path> ..."."""


@dataclass
class Resume:
    """Where a run starts: a checkpoint (``None``: round 0) and what it recorded."""

    ckpt_path: Path | None = None
    round: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------------------- the config on record
def run_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config without :data:`IGNORED_KEYS`: what a run folder's ``run.json`` records."""
    config = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(config, dict)
    out: dict[str, Any] = json.loads(json.dumps(config, default=str))  # plain JSON values only
    return _without_ignored(out)


def _without_ignored(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without :data:`IGNORED_KEYS` (a record written before a key was ignored still holds it)."""
    out: dict[str, Any] = json.loads(json.dumps(config))
    for key in IGNORED_KEYS:
        node: Any = out
        *parents, leaf = key.split(".")
        for name in parents:
            node = node.get(name) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return out


def config_differences(recorded: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "") -> list[str]:
    """``key: recorded -> current`` for every dotted key whose value differs.

    A node of :data:`ADDED_NODES` missing from the record counts as equal while it holds its
    inert values.

    >>> config_differences({"rounds": 10, "method": {"lr": 0.1}}, {"rounds": 20, "method": {"lr": 0.1}})
    ['rounds: 10 -> 20']
    >>> config_differences({}, {"early_stopping": {"monitor": None, "patience": 5}})
    []
    >>> config_differences({}, {"early_stopping": {"monitor": "val/acc", "patience": 5}})
    ["early_stopping: <absent> -> {'monitor': 'val/acc', 'patience': 5}"]
    """
    out: list[str] = []
    for key in sorted(set(recorded) | set(current), key=str):
        name = f"{prefix}{key}"
        a, b = recorded.get(key, "<absent>"), current.get(key, "<absent>")
        if a == "<absent>" and _inert_added_node(name, b):
            continue
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out.extend(config_differences(a, b, prefix=f"{name}."))
        elif a != b:
            out.append(f"{name}: {a} -> {b}")
    return out


def _inert_added_node(name: str, node: Any) -> bool:
    """Whether ``node`` is the added config node ``name`` holding the values under which it changes nothing."""
    inert = ADDED_NODES.get(name)
    return inert is not None and isinstance(node, Mapping) and all(node.get(k) == v for k, v in inert.items())


def claim(output_dir: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """Check ``output_dir`` against ``config``; the recorded summary if the run is already complete.

    A folder without run outputs (:data:`RUN_OUTPUTS`) is free, whatever its ``run.json`` says
    (a run that stopped before training, e.g. on a config error, leaves no outputs). A folder
    that this run may continue becomes its own (:func:`fedlightning.folder_lock.mark_claimed`);
    a complete one stays the earlier run's: nothing is written into it.

    Raises:
        RunFolderTakenError: the folder holds outputs of a run of another config, or outputs
            without a readable ``run.json``.
        ConfigError: its ``summary.json`` is not a fedlightning summary.
    """
    found = [name for name in RUN_OUTPUTS if (output_dir / name).exists()]
    if not found:
        mark_claimed(output_dir)
        return None
    record = output_dir / RUN_FILE
    start_over = f"delete the run folder {output_dir} to start over, or choose another one (hydra.run.dir=...)"
    if not record.exists():
        raise RunFolderTakenError(
            f"The folder {output_dir} holds run outputs ({', '.join(found)}) but no {RUN_FILE} saying which "
            "config made them; choose another folder (hydra.run.dir=...) or delete them to start over."
        )
    recorded = _read_json(record, fix=start_over, error=RunFolderTakenError).get("config")
    if not isinstance(recorded, dict):
        raise RunFolderTakenError(f"{record} is not a fedlightning run record (no 'config' object); {start_over}.")
    differences = config_differences(_without_ignored(recorded), config)
    if differences:
        shown = "; ".join(differences[:4]) + ("; ..." if len(differences) > 4 else "")
        raise RunFolderTakenError(
            f"The run folder {output_dir} holds a run with another config ({shown}); "
            "choose another folder (hydra.run.dir=...) or delete this one to start over."
        )
    summary = output_dir / SUMMARY_FILE
    if summary.exists() and not summary.is_dir():
        try:
            done = json.loads(_read_text(summary, fix=start_over))
        except ValueError:  # a summary cut short: the run resumes and writes it again
            done = None
        if isinstance(done, dict) and done.get("status", "completed") == "completed":
            return done
        if done is not None:
            mark_claimed(output_dir)
            raise ConfigError(
                f"{summary} is not a fedlightning summary (a JSON object of a completed run); delete it to "
                f"resume the run, or {start_over}."
            )
    mark_claimed(output_dir)
    if summary.is_dir():
        raise ConfigError(f"{summary} is a folder, where the run writes its summary; delete it to resume the run.")
    return None


def write_record(output_dir: Path, config: dict[str, Any]) -> None:
    """Record ``config`` in ``<output_dir>/run.json`` (atomically)."""
    write_text_atomic(
        output_dir / RUN_FILE, json.dumps({"format": 1, "ignored": list(IGNORED_KEYS), "config": config}, indent=2)
    )


# ---------------------------------------------------------------------------- reading a folder's files
def _read_text(path: Path, *, fix: str, error: type[ConfigError] = ConfigError) -> str:
    """``path``'s text; a file that cannot be read (a folder, not UTF-8, no permission) is one sentence."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise error(f"{path} is not UTF-8 text (damaged, or not written by fedlightning); {fix}.") from None
    except IsADirectoryError:
        raise error(f"{path} is a folder, not a file; {fix}.") from None
    except OSError as exc:
        raise error(f"{path} cannot be read ({exc.strerror or type(exc).__name__}); {fix}.") from None


def _read_json(path: Path, *, fix: str, error: type[ConfigError] = ConfigError) -> dict[str, Any]:
    """``path``'s JSON object; anything else (not JSON, a list, unreadable) is one sentence."""
    text = _read_text(path, fix=fix, error=error)
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise error(f"{path} is not valid JSON ({exc}); {fix}.") from None
    if not isinstance(value, dict):
        raise error(f"{path} holds a JSON {type(value).__name__}, not the object fedlightning writes; {fix}.")
    return value


def read_partition_record(path: Path, *, fix: str) -> dict[str, Any]:
    """A run folder's ``partition.json`` as written by ``FederatedDataModule.save_partition``, checked as JSON."""
    record = _read_json(path, fix=fix)
    for key in ("clients", "validation"):
        if key in record and not isinstance(record[key], list):
            raise ConfigError(f"{path} holds {key} as a JSON {type(record[key]).__name__}, not a list; {fix}.")
    return record


def read_csv_rows(path: Path, *, fix: str, needs: tuple[str, ...] = ()) -> tuple[list[str], list[list[str]], str]:
    """``path``'s header, rows and text; a last line without its newline (cut short by a kill) is dropped.

    A file that is not CSV text, lacks a column of ``needs`` or holds a row of another length
    than its header stops the run with one sentence naming the file, the line and ``fix``.
    """
    text = _read_text(path, fix=fix)
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise ConfigError(f"{path} is not a CSV file ({exc}); {fix}.") from None
    if not rows:
        return [], [], text
    header, body = rows[0], rows[1:]
    missing = [name for name in needs if name not in header]
    if missing:
        raise ConfigError(f"{path} has no '{missing[0]}' column; {fix}.")
    for line, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise ConfigError(f"{path} line {line} has {len(row)} fields, its header {len(header)}; {fix}.")
    return header, body, text


# ---------------------------------------------------------------------------- checkpoints
def read_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` and check it is a Lightning one.

    Raises:
        UnreadableCheckpointError: missing, empty, truncated, corrupted, holding objects that are
            not tensors or plain containers, or not a Lightning checkpoint.
    """
    if not path.exists():
        raise UnreadableCheckpointError("does not exist")
    if path.is_dir():
        raise UnreadableCheckpointError("is a folder, not a checkpoint file")
    if path.stat().st_size == 0:
        raise UnreadableCheckpointError("is empty (0 bytes)")
    try:
        checkpoint = safe_torch_load(path)
    except Exception as exc:  # torch raises many types for a damaged file
        code = _pickled_calls(path)
        if code:  # refused by the weights-only unpickler, whatever the opcode it stopped at
            raise UnreadableCheckpointError(
                f"holds code (unpickling it would call {code[0]}), not only tensors and plain containers, "
                "and is refused as unsafe"
            ) from None
        text = str(exc)
        if "unsupported global" in text.lower():  # the weights-only unpickler refused to import something
            raise UnreadableCheckpointError(
                "holds objects other than tensors and plain containers, which are not loaded "
                "(unpickling them could run code)"
            ) from None
        text = text.split("WeightsUnpickler error:")[-1].strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        raise UnreadableCheckpointError(f"is truncated or corrupted ({type(exc).__name__}: {first[:100]})") from None
    if not isinstance(checkpoint, dict) or not {"state_dict", "loops", "global_step"} <= set(checkpoint):
        raise UnreadableCheckpointError("is not a Lightning checkpoint (it lacks state_dict, loops or global_step)")
    return checkpoint


SAFE_PICKLE_MODULES = ("torch", "collections", "_codecs", "numpy")
"""Modules whose globals a checkpoint's pickle may name (tensor and storage rebuilders, ``OrderedDict``)."""


def _pickled_calls(path: Path) -> list[str]:
    """``module.name`` of each global outside :data:`SAFE_PICKLE_MODULES` that ``path``'s pickles import.

    Read with :mod:`pickletools` (which decodes opcodes and runs nothing), from the ``data.pkl``
    of a zip checkpoint or the pickles of a plain file. Empty when none is found or the file
    cannot be decoded.
    """
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                names = [n for n in archive.namelist() if n.endswith("data.pkl")]
                data = archive.read(names[0]) if names else b""
        else:
            data = path.read_bytes()
    except (OSError, zipfile.BadZipFile, KeyError):
        return []
    found: list[str] = []
    stream = io.BytesIO(data)
    while stream.tell() < len(data):  # a legacy torch file is several pickles in a row
        strings: list[str] = []
        try:
            for opcode, arg, _ in pickletools.genops(stream):
                if isinstance(arg, str):
                    strings.append(arg)
                if opcode.name in ("GLOBAL", "INST") and isinstance(arg, str):
                    found.append(arg.replace(" ", "."))
                elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                    found.append(f"{strings[-2]}.{strings[-1]}")
        except Exception:  # not a pickle from here on: what was read is all there is
            break
    return [name for name in found if name.split(".")[0] not in SAFE_PICKLE_MODULES]


def checkpoint_round(checkpoint: Mapping[str, Any]) -> int:
    """The number of rounds a checkpoint has completed."""
    return int(checkpoint["global_step"])


def checkpoint_metrics(checkpoint: Mapping[str, Any]) -> dict[str, float]:
    """The scalar metrics a checkpoint recorded (empty for checkpoints of older versions)."""
    meta = checkpoint.get("fedlightning")
    metrics = meta.get("metrics") if isinstance(meta, Mapping) else None
    return {str(k): float(v) for k, v in (metrics or {}).items()}


def latest_good_checkpoint(
    folder: Path, *, accept: Callable[[dict[str, Any]], str | None] = lambda checkpoint: None
) -> tuple[Path, dict[str, Any]] | None:
    """The good checkpoint with the most rounds in ``folder`` (``last.ckpt`` on a tie).

    Good: readable, and ``accept(checkpoint)`` gives no reason against it. A checkpoint that is
    not good is reported in the log and the previous one tried.
    """
    if not folder.is_dir():
        return None
    rounds: list[tuple[int, Path]] = []
    for path in folder.glob("round-*.ckpt"):
        with contextlib.suppress(ValueError):
            rounds.append((int(path.stem.removeprefix("round-")), path))
    rounds.sort(reverse=True)
    last = folder / LAST
    candidates = [last] if last.exists() else []
    candidates += [path for _, path in rounds]
    newest = rounds[0][0] if rounds else -1
    for path in candidates:
        try:
            checkpoint = read_checkpoint(path)
        except UnreadableCheckpointError as exc:
            reason: str | None = str(exc)
        else:
            if path == last and checkpoint_round(checkpoint) < newest:
                continue  # a newer round checkpoint exists (last.ckpt was not yet replaced)
            reason = accept(checkpoint)
            if reason is None:
                return path, checkpoint
        log.warning("Checkpoint %s %s; resuming from the previous good checkpoint instead.", path, reason)
    return None


def missing_rows(metrics_files: list[Path], round_idx: int) -> str | None:
    """Why ``metrics_files`` lack the training row of round ``round_idx`` (``None``: they have it).

    The engine logs a round's training row before the round is checkpointed, but a folder
    written by an earlier version (checkpoint first) and killed in between holds a checkpoint
    whose round the metrics miss; resuming from it would leave a hole in ``metrics.csv``.
    """
    if round_idx == 0:
        return None
    for path in metrics_files:
        found = False
        if path.exists():
            header, body, _ = read_csv_rows(path, fix=_start_over(path.parent.parent), needs=("step",))
            for values in body:
                row = dict(zip(header, values, strict=True))
                if _number(row.get("step")) == round_idx and row.get("train/loss"):
                    found = True
                    break
        if not found:
            return f"is from round {round_idx}, whose training row never reached {path.name} (killed in between)"
    return None


def _start_over(folder: Path) -> str:
    return f"delete the run folder {folder} to start over, or choose another one (hydra.run.dir=...)"


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def check_explicit_checkpoint(path: Path) -> dict[str, Any]:
    """``read_checkpoint`` for ``ckpt_path=...``: failures become one ``ConfigError`` sentence."""
    try:
        return read_checkpoint(path)
    except UnreadableCheckpointError as exc:
        raise ConfigError(
            f"ckpt_path={path} {exc}; point ckpt_path at a checkpoint written by fedlightning "
            "(e.g. <run folder>/checkpoints/last.ckpt) or drop ckpt_path."
        ) from None


def check_fits(
    checkpoint: Mapping[str, Any],
    *,
    path: Path,
    config: Mapping[str, Any],
    state_dict: Mapping[str, Any],
    rounds: int,
) -> None:
    """Refuse a checkpoint of another model or method, or one past ``rounds``, with one sentence."""
    done = checkpoint_round(checkpoint)
    if done > rounds:
        raise ConfigError(
            f"ckpt_path={path} is from round {done}, past rounds={rounds}; set rounds to at least {done} "
            "or point ckpt_path at an earlier checkpoint."
        )
    meta = checkpoint.get("fedlightning")
    recorded = meta.get("config") if isinstance(meta, Mapping) else None
    if isinstance(recorded, Mapping):
        differences = config_differences(recorded, config)
        method = [d for d in differences if d.startswith("method.") and d.split(":")[0].endswith("_target_")]
        if method:
            raise ConfigError(
                f"ckpt_path={path} was written by another method ({method[0]}); point ckpt_path at a "
                "checkpoint of this method or drop ckpt_path."
            )
        model = [d for d in differences if d.startswith("model.")]
        if model:
            raise ConfigError(
                f"ckpt_path={path} holds another model ({model[0]}); point ckpt_path at a checkpoint of "
                "this model or drop ckpt_path."
            )
    saved = checkpoint["state_dict"]
    mismatch = _state_mismatch(saved, state_dict)
    if mismatch:
        raise ConfigError(
            f"ckpt_path={path} holds another model or method ({mismatch}); point ckpt_path at a checkpoint "
            "of this model and method or drop ckpt_path."
        )
    if isinstance(recorded, Mapping):
        other = [d for d in config_differences(recorded, config) if d.split(":")[0] not in ("rounds",)]
        if other:
            log.warning("Resuming from %s, written with another config: %s.", path, "; ".join(other[:6]))
    else:
        log.warning("Resuming from %s, which records no config (written by an older version).", path)


def _state_mismatch(saved: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    missing = sorted(set(current) - set(saved))
    extra = sorted(set(saved) - set(current))
    if missing:
        return f"it lacks {missing[0]}"
    if extra:
        return f"it has {extra[0]}, which this model lacks"
    for name, tensor in current.items():
        shape = tuple(getattr(saved[name], "shape", ()))
        if shape != tuple(getattr(tensor, "shape", ())):
            return f"{name} has shape {list(shape)} there, {list(tensor.shape)} here"
    return None


# ---------------------------------------------------------------------------- CSVs cut back to a round
def cut_csv(path: Path, keep: Callable[[dict[str, str]], bool], *, source: Path | None = None, fix: str = "") -> None:
    """Rewrite ``path`` with the rows of ``source`` (default: itself) for which ``keep(row)`` is true.

    A last line without its newline (a write cut short by a kill) is dropped. The file is replaced
    atomically; without a ``source`` file, ``path`` is removed. A damaged file (not CSV text, a
    row of another length than the header, a value ``keep`` cannot read) stops the run with one
    sentence naming the file and ``fix`` (default: start over in a new folder).
    """
    source = source or path
    fix = fix or _start_over(source.parent)
    if not source.exists():
        path.unlink(missing_ok=True)
        return
    header, body, text = read_csv_rows(source, fix=fix)
    if not header:
        path.unlink(missing_ok=True)
        return
    kept = []
    for line, values in enumerate(body, start=2):
        try:
            if keep(dict(zip(header, values, strict=True))):
                kept.append(values)
        except (KeyError, ValueError) as exc:
            what = f"no '{exc.args[0]}' column" if isinstance(exc, KeyError) else f"a damaged value ({exc})"
            raise ConfigError(f"{source} line {line} has {what}; {fix}.") from None
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n" if "\r\n" in text[:2000] else "\n")
    writer.writerow(header)
    writer.writerows(kept)
    write_text_atomic(path, out.getvalue())


def _no_test_values(row: dict[str, str]) -> bool:
    """A metrics row that is not a test row: the run tests after its final checkpoint, so a resumed
    run writes the test row again (a kill between the test and ``summary.json`` leaves one)."""
    return not any(value for name, value in row.items() if name.startswith("test/"))


def cut_back(output_dir: Path, resume_round: int, metrics_files: list[Path], *, source: Path | None = None) -> None:
    """Cut the run's CSVs back to the first ``resume_round`` rounds (remove them for round 0).

    Temporary files left by a write that a kill cut short are removed too.

    Every file counts rounds from 1 (round k is the k-th round; ``round-000k.ckpt`` holds k
    rounds): ``comm_records.csv`` keeps its rows of rounds ``<= resume_round``, the loggers'
    ``metrics.csv`` its rows at steps ``<= resume_round`` (a row's step is its round, see
    :class:`fedlightning.loggers.CSVLogger`) except test rows, and ``bits_vs_accuracy.csv`` its
    points up to round ``resume_round``. With ``source`` (the folder of a checkpoint given as
    ``ckpt_path``), the rows are taken from that folder's files.
    """

    def from_source(path: Path) -> Path | None:
        return None if source is None else source / path.relative_to(output_dir)

    if source is not None:
        fix = f"the run folder {source} of ckpt_path is damaged: point ckpt_path at another run's checkpoint"
    else:
        fix = _start_over(output_dir)
    for folder in {output_dir, output_dir / CHECKPOINTS, *(path.parent for path in metrics_files)}:
        for stale in folder.glob(".*.tmp-*"):  # a write cut short by a kill
            stale.unlink(missing_ok=True)
    k = resume_round
    if k == 0 and source is None:  # a fresh start: nothing of an earlier attempt stays
        for path in (output_dir / RECORDS_FILE, output_dir / CURVE_FILE, *metrics_files):
            path.unlink(missing_ok=True)
        return
    for name, column in ((RECORDS_FILE, "round"), (CURVE_FILE, "round")):
        path = output_dir / name
        cut_csv(path, lambda r, c=column: float(r[c]) <= k, source=from_source(path), fix=fix)  # type: ignore[misc]
    for path in metrics_files:
        cut_csv(path, lambda r: float(r["step"]) <= k and _no_test_values(r), source=from_source(path), fix=fix)
