"""The target index: what the pre-flight reads of each ``_target_`` of ``configs/``, kept between commands.

A refusal the config decides (a method × compressor pair, a misspelt key of a method, an
accelerator this machine lacks) needs the targets' signatures and declarations. Reading them
from the classes imports their modules, and every method and callback imports Lightning, which
takes seconds. The index holds what :func:`fedlightning.schema.record_target` reads of each
target, so the command's first pre-flight pass (:func:`fedlightning.cli.preflight_command`)
refuses before Lightning is imported; the full pass, on the classes themselves, still runs
before any job starts.

The index is written by a command that has imported the targets anyway (after its full pass),
as ``target-index-<key>.json`` in the package's cache folder
(:func:`fedlightning.paths.cache_dir`), and read only under the same key: a hash of this
package's source files and configs and of the versions of the libraries whose classes it
records. An edited method or config, or another Lightning, makes a new index. A target the
index lacks (one named outside ``configs/``, or one whose module did not import) is left to the
full pass.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import inspect
import json
import logging
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from fedlightning.errors import ConfigError
from fedlightning.federated.payloads import Payload
from fedlightning.folder_lock import write_text_atomic
from fedlightning.paths import cache_dir, config_dir
from fedlightning.schema import (
    REPORTS_REGISTRY,
    UNRECORDED,
    NotRecordedError,
    RecordedHint,
    RecordedTarget,
    Records,
    _locate,
    reading_records,
    record_target,
)

__all__ = [
    "build",
    "config_targets",
    "ensure",
    "index_key",
    "index_path",
    "load",
    "record_pass",
    "records_from_json",
    "to_json",
]

log = logging.getLogger(__name__)

FORMAT = 1
"""The index format; part of the key, so a new format never reads an old file."""
LIBRARIES = ("lightning", "torch", "torchvision", "torchmetrics", "hydra-core", "omegaconf", "wandb")
"""Distributions whose classes (or whose annotations in ours) the index may record."""
KEPT = 8
"""Index files kept in the cache folder (other checkouts, other versions); the oldest go first."""


def index_key(package: Path | None = None, configs: Path | None = None) -> str:
    """A hash of the package's ``*.py`` files and configs, the :data:`LIBRARIES` versions and Python's."""
    package = package or Path(__file__).resolve().parent
    configs = configs or Path(config_dir())
    digest = hashlib.sha256(f"{FORMAT} {sys.version}".encode())
    for root, pattern in ((package, "*.py"), (configs, "*.yaml")):
        for path in sorted(root.rglob(pattern)):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    for name in LIBRARIES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            digest.update(f"{name}=={importlib.metadata.version(name)}".encode())
    return digest.hexdigest()[:32]


@functools.cache
def _this_key() -> str:
    return index_key()  # the sources do not change under a running command


def index_path(key: str | None = None) -> Path:
    """Where the index of ``key`` (default: this package's) is kept."""
    return cache_dir() / f"target-index-{key or _this_key()}.json"


def config_targets(folder: str | Path | None = None) -> list[str]:
    """Every ``_target_`` path named in the configs under ``folder`` (default: the package's), sorted.

    >>> "fedlightning.methods.zampling.Zampling" in config_targets()
    True
    """
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            target = node.get("_target_")
            if isinstance(target, str) and "${" not in target:
                found.add(target)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for path in sorted(Path(folder or config_dir()).rglob("*.yaml")):
        with contextlib.suppress(Exception):  # a config that does not parse is refused where it is used
            walk(OmegaConf.to_container(OmegaConf.load(path), resolve=False))
    return sorted(found)


def build(targets: list[str] | None = None) -> Records:
    """Record each of ``targets`` (default: :func:`config_targets` and :data:`REPORTS_REGISTRY`) from its class.

    Imports every target; one that does not import, or that the schema cannot record, is left out.
    """
    from lightning.pytorch.accelerators import AcceleratorRegistry

    recorded: dict[str, Any] = {}
    for path in [*(targets if targets is not None else config_targets()), REPORTS_REGISTRY]:
        try:
            target = _locate(path, "index")
            if isinstance(target, Mapping):
                recorded[path] = {str(name): record_target(cls) for name, cls in target.items()}
            else:
                recorded[path] = record_target(target)
                # also under the path a constructor's error names (TopK's module, not its re-export)
                recorded.setdefault(f"{recorded[path].__module__}.{recorded[path].__qualname__}", recorded[path])
        except Exception as exc:  # not recorded: the full pass reads it
            log.debug("target index: %s not recorded (%s)", path, exc)
    return Records(targets=recorded, accelerators=tuple(sorted(AcceleratorRegistry.available_accelerators())))


def load() -> Records | None:
    """The index of this package's key, or None where there is none (one that does not read is removed)."""
    try:
        path = index_path()
        text = path.read_text()
    except (OSError, RuntimeError) as exc:  # none yet, or no home folder to hold the cache
        log.debug("target index not read (%s)", exc)
        return None
    try:
        return records_from_json(json.loads(text))
    except (ValueError, KeyError, TypeError) as exc:  # a damaged file: the next full pass writes it again
        log.debug("target index %s does not read (%s); removed", path, exc)
        with contextlib.suppress(OSError):
            path.unlink()
        return None


def ensure() -> None:
    """Write the index of this package's key unless it exists; a cache that cannot be written is passed over."""
    try:
        path = index_path()
        if path.is_file():
            return
    except (OSError, RuntimeError):  # no home folder to hold the cache
        return
    try:
        write_text_atomic(path, json.dumps(to_json(build())))
        for old in sorted(path.parent.glob("target-index-*.json"), key=lambda p: p.stat().st_mtime)[:-KEPT]:
            old.unlink(missing_ok=True)
    except OSError as exc:
        log.debug("target index not written to %s (%s)", path, exc)


# --- JSON --------------------------------------------------------------------------------------


def to_json(records: Records) -> dict[str, Any]:
    """``records`` as JSON data (:func:`records_from_json` reads it back); a target it cannot hold is left out."""
    targets: dict[str, Any] = {}
    for path, target in records.targets.items():
        with contextlib.suppress(NotRecordedError):
            if isinstance(target, RecordedTarget):
                targets[path] = _target_json(target)
            else:
                targets[path] = {"entries": {name: _target_json(t) for name, t in target.items()}}
    return {"format": FORMAT, "accelerators": list(records.accelerators), "targets": targets}


def records_from_json(data: Mapping[str, Any]) -> Records:
    if data["format"] != FORMAT:
        raise ValueError(f"index format {data['format']}")
    targets: dict[str, Any] = {}
    for path, entry in data["targets"].items():
        if "entries" in entry:
            targets[path] = {name: _target_from(e) for name, e in entry["entries"].items()}
        else:
            targets[path] = _target_from(entry)
    return Records(targets=targets, accelerators=tuple(data["accelerators"]))


def _target_json(target: RecordedTarget) -> dict[str, Any]:
    parameters = []
    for name, parameter in target.parameters.items():
        entry: dict[str, Any] = {"name": name}
        if parameter.default is UNRECORDED:
            entry["unrecorded"] = True
        elif parameter.default is not inspect.Parameter.empty:
            entry["default"] = parameter.default
        parameters.append(entry)
    return {
        "name": target.__name__,
        "module": target.__module__,
        "qualname": target.__qualname__,
        "accepts_any": target.accepts_any,
        "parameters": parameters,
        "hints": {name: _hint_json(hint) for name, hint in target.hints.items()},
        "declarations": {name: _declaration_json(value) for name, value in target.declarations.items()},
    }


def _target_from(entry: Mapping[str, Any]) -> RecordedTarget:
    parameters = {}
    for p in entry["parameters"]:
        default = UNRECORDED if p.get("unrecorded") else p.get("default", inspect.Parameter.empty)
        parameters[p["name"]] = inspect.Parameter(p["name"], inspect.Parameter.KEYWORD_ONLY, default=default)
    return RecordedTarget(
        name=entry["name"],
        module=entry["module"],
        qualname=entry["qualname"],
        parameters=parameters,
        hints={name: _hint_from(h) for name, h in entry["hints"].items()},
        accepts_any=bool(entry["accepts_any"]),
        declarations={name: _declaration_from(d) for name, d in entry["declarations"].items()},
    )


def _hint_json(hint: RecordedHint) -> dict[str, Any]:
    members = [{"literal": list(m)} if isinstance(m, tuple) else {"verdicts": dict(m)} for m in hint.members]
    return {"description": hint.description, "members": members}


def _hint_from(entry: Mapping[str, Any]) -> RecordedHint:
    members = tuple(tuple(m["literal"]) if "literal" in m else dict(m["verdicts"]) for m in entry["members"])
    return RecordedHint(entry["description"], members)


def _declaration_json(value: Any) -> dict[str, Any]:
    if isinstance(value, Payload):
        return {"payload": value.value}
    if value is None or type(value) in (bool, int, str):
        return {"value": value}
    if isinstance(value, tuple | list) and all(type(v) is str for v in value):
        return {"names": list(value)}
    raise NotRecordedError(f"a declaration of type {type(value).__name__}")


def _declaration_from(entry: Mapping[str, Any]) -> Any:
    if "payload" in entry:
        return Payload(entry["payload"])
    if "names" in entry:
        return tuple(entry["names"])
    return entry["value"]


@contextlib.contextmanager
def record_pass(held: Records) -> Iterator[None]:
    """Read ``held`` for the targets within the block; a refusal (:class:`ConfigError`) leaves it, anything else
    ends it quietly, leaving the config to the full pass (a target the index lacks, a check it cannot make)."""
    try:
        with reading_records(held):
            yield
    except ConfigError:
        raise
    except Exception as exc:
        log.debug("the pre-flight on the target index stopped at %r; the full pass decides", exc)
