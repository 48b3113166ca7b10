"""Config schemas, checked before anything is built: wrong types, unknown keys and bad ranges.

Two layers, one rule: every problem stops with one sentence naming the key and the fix
(:class:`~fedlightning.errors.ConfigError`).

* The top-level keys of ``configs/train.yaml`` have a typed dataclass schema, :class:`TrainSchema`
  (the structured-config pattern of Hydra/OmegaConf: field types, defaults, and here also a
  range per field). A key the schema does not declare (``+foo=1``) is refused with the closest
  declared key.
* Each group node (``method``, ``data``, ``partition``, ``sampler``, ``compressor``, ``downlink``,
  ``failures``, ``divergence``, ``trainer``, ``logger.*``, ``callbacks.*``, and nested nodes such as
  ``method.client_optimizer``) is a ``_target_`` node: it is checked against the signature of its
  target (:func:`inspect.signature`), so a key the constructor does not take is refused listing
  the keys it does take, and a value is checked against simple annotations (``int``, ``float``,
  ``bool``, ``str``, ``Literal``, ``Optional`` and unions of them). A target of this package
  whose ``__init__`` takes ``**kwargs`` passes them to the next ``__init__`` of its MRO (the
  convention of every method and data module here), so those keys are valid too; a third-party
  target with ``**kwargs`` (``WandbLogger``) accepts any key.
* The ``reports`` node holds, per report a method can declare (``needed_callbacks``,
  :data:`fedlightning.callbacks.declared.DECLARABLE`), the keyword arguments of that report's
  class: ``reports.<name>`` is checked against the class's signature by the same code as a
  ``_target_`` node (:func:`check_node_keys`), the class found by its dotted path
  (:data:`REPORTS_REGISTRY`) as a ``_target_`` is.

Why the signatures rather than one dataclass per target: the constructors already are the
schema (their keyword-only, typed arguments), so a second copy would drift from them; a new
method or compressor is covered the moment its config exists. Why the check runs after
composition (:func:`validate_config`, called first thing by :func:`fedlightning.run.run`) rather
than as a ConfigStore entry in the defaults list: every composer of ``train.yaml`` (tests,
benchmarks, notebooks, each multirun job) gets it without registering anything first, and its
errors surface in one place as a sentence, inside the job whose folder records them. The cost is
what ``run`` pays anyway: the targets' modules are imported (``run`` imports them next to build
them) and a signature is read per node; no object is built.

The command's pre-flight may read the targets from a record instead (:func:`reading_records`):
what this module reads of each target (its keyword parameters, their defaults and annotations
reduced to the verdicts :func:`_matches` gives, its declarations) is kept by
:mod:`fedlightning.target_index`, so a refusal needs no import of Lightning. A target or a setting
the record cannot answer for raises :class:`NotRecordedError`, and the live pass decides it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
import importlib
import inspect
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

from fedlightning.errors import ConfigError

__all__ = [
    "DECLARATIONS",
    "GROUPS",
    "REPORTS_REGISTRY",
    "UNRECORDED",
    "NotRecordedError",
    "RecordedHint",
    "RecordedTarget",
    "Records",
    "TrainSchema",
    "check_node_keys",
    "check_target_node",
    "close_match",
    "reading_records",
    "record_target",
    "records",
    "refuse_unread_overrides",
    "target_keys",
    "validate_config",
    "validate_top_level",
]

#: Config groups whose node is one ``_target_`` node.
GROUPS = ("method", "data", "partition", "sampler", "compressor", "downlink", "failures", "divergence", "trainer")
#: Config groups whose node maps names to ``_target_`` nodes.
NAMED_GROUPS = ("logger", "callbacks")
#: The dotted path of the report name → callback class mapping whose classes take the ``reports.<name>``
#: settings; located as a ``_target_`` is, so the schema imports nothing of the layers above it.
REPORTS_REGISTRY = "fedlightning.callbacks.declared.DECLARABLE"
#: Keys Hydra's ``instantiate`` reads itself.
HYDRA_KEYS = frozenset({"_target_", "_partial_", "_recursive_", "_convert_", "_args_"})


def _spec(example: str, meaning: str = "", minimum: int | None = None) -> dict[str, Any]:
    return {"example": example, "meaning": meaning, "min": minimum}


@dataclass
class TrainSchema:
    """The top-level keys of ``configs/train.yaml``: type, least value, an example, what it means.

    A new top-level key of ``train.yaml`` is declared here too, else every run refuses it.
    """

    seed: int = field(default=0, metadata=_spec("seed=0", "the run seed", 0))
    rounds: int = field(default=50, metadata=_spec("rounds=50", "the number of federated rounds", 1))
    clients_per_round: int | None = field(
        default=10, metadata=_spec("clients_per_round=10", "the cohort size of partial-participation samplers", 1)
    )
    eval_every: int = field(default=1, metadata=_spec("eval_every=1", "validation every k rounds", 1))
    checkpoint_every: int = field(
        default=10, metadata=_spec("checkpoint_every=10", "a checkpoint every k rounds, 0 for last.ckpt only", 0)
    )
    threads: int | Literal["auto"] | None = field(
        default="auto",
        metadata=_spec("threads=auto", "torch threads per process", 1),
    )
    local_execution: Literal["auto", "loop", "fused", "vectorised"] = field(
        default="auto",
        metadata=_spec(
            "local_execution=auto",
            "how clients train: loop, fused (hand-taken MLP steps), vectorised (stacked clients); auto picks per round",
        ),
    )
    ckpt_path: str | None = field(default=None, metadata=_spec("ckpt_path=null", "a checkpoint file to resume from"))
    save_partition: bool = field(default=True, metadata=_spec("save_partition=true", "whether to write partition.json"))
    client_state_memory_mb: float | None = field(
        default=None,
        metadata=_spec(
            "client_state_memory_mb=512",
            "per-client state kept in memory between rounds, the rest on disk; null: all",
            0,
        ),
    )
    print_config: bool = field(
        default=False, metadata=_spec("print_config=true", "print the resolved config (always in config.yaml)")
    )
    callbacks: dict[str, Any] = field(default_factory=dict, metadata=_spec("callbacks={}", "named callback nodes"))
    early_stopping: dict[str, Any] = field(
        default_factory=dict,
        metadata=_spec(
            "early_stopping.monitor=val/acc",
            "stop once a validation metric stops improving and test the best round (monitor null: off)",
        ),
    )
    reports: dict[str, Any] = field(
        default_factory=dict,
        metadata=_spec(
            "reports.zampling_evaluation.test_samples=100",
            "the settings of each evaluation report a method declares, by report name",
        ),
    )
    method: Any = None
    model: Any = None
    data: Any = None
    partition: Any = None
    sampler: Any = None
    compressor: Any = None
    downlink: Any = None
    failures: Any = None
    divergence: Any = None
    logger: Any = None
    trainer: Any = None


REQUIRED = ("method", "model", "data", "partition", "sampler", "trainer", "rounds", "seed")

#: Unknown-key messages list the valid keys up to this many.
MAX_LISTED = 16
#: Cheap range rules by key name, applied to numbers anywhere in a group node.
POSITIVE_KEYS = frozenset({"lr"})
AT_LEAST_ONE_KEYS = frozenset(
    {
        "batch_size",
        "num_clients",
        "local_epochs",
        "local_steps",
        # sampled-network counts (Zampling's evaluation report and local validation)
        "val_samples",
        "test_samples",
        "local_val_samples",
        "networks_per_forward",
        "sensitivity_perturbations",
        "sensitivity_samples",
    }
)
NON_NEGATIVE_KEYS = frozenset({"weight_decay", "momentum"})
#: Keys that name a file to read: it must exist when set.
FILE_KEYS = frozenset({"partition_file"})


def close_match(word: str, choices: Iterable[str]) -> str | None:
    """The closest of ``choices`` to ``word`` (``difflib``), if any is close.

    >>> close_match("fedavgg", ["fedavg", "diana"])
    'fedavg'
    """
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    match = close_match(word, choices)
    return f" (did you mean {match}?)" if match else ""


def validate_config(cfg: DictConfig) -> None:
    """Check a composed ``train.yaml`` config; raise :class:`ConfigError` at its first problem.

    Order: required keys, top-level keys against :class:`TrainSchema`, the model node against its
    builder, each report's settings against its class's signature, then each group node against
    its target's signature.
    """
    validate_top_level(cfg)
    _check_model(cfg.get("model"))
    _check_reports(cfg)
    for group in GROUPS:
        node = _get(cfg, group, group)
        if node is not None:
            if not isinstance(node, DictConfig):
                raise ConfigError(f"{group} must be a config node (got {node!r}); select one with {group}=<name>.")
            if "_target_" in node:
                check_target_node(node, group)
    for group in NAMED_GROUPS:
        node = _get(cfg, group, group)
        if node is None:
            continue
        if not isinstance(node, DictConfig):
            raise ConfigError(f"{group} must map names to config nodes (got {node!r}); see configs/{group}/.")
        for name in map(str, node):
            child = _get(node, name, f"{group}.{name}")
            if isinstance(child, DictConfig) and "_target_" in child:
                check_target_node(child, f"{group}.{name}")


def refuse_unread_overrides(cfg: DictConfig, overrides: Sequence[str]) -> None:
    """Refuse a command-line ``clients_per_round=...`` that no node of ``cfg`` reads.

    The key acts only through an interpolation (``${clients_per_round}``) in the sampler's node:
    under the default ``sampler=full`` (or an experiment's) nothing reads it, so
    ``clients_per_round=4`` alone would train every client each round without a word. Where the
    overrides choose the sampler themselves (``sampler=full``, or a sweep over
    ``sampler=full,uniform``) the key is meant for the samplers that take it and passes. A default
    left as it is never counts.

    >>> cfg = OmegaConf.create({"clients_per_round": 4, "sampler": {"_target_": "a.Full"}})
    >>> refuse_unread_overrides(cfg, ["seed=1"])
    >>> refuse_unread_overrides(cfg, ["sampler=full", "clients_per_round=4"])
    >>> try:
    ...     refuse_unread_overrides(cfg, ["clients_per_round=4"])
    ... except ConfigError as exc:
    ...     print(str(exc)[:74])
    clients_per_round=4 would change nothing: no node of this config uses ${cl
    """
    parsed = [o.lstrip("+").partition("=")[::2] for o in overrides]
    value = next((v for k, v in parsed if k == "clients_per_round"), None)
    if value is None or any(k == "sampler" for k, _ in parsed):
        return
    raw = repr(OmegaConf.to_container(cfg, resolve=False))
    if re.search(r"\$\{[^}]*\bclients_per_round\b", raw) is None:  # ${clients_per_round}, ${oc.select:...}
        sampler = cfg.get("sampler")
        target = str(sampler.get("_target_", "?")).rsplit(".", 1)[-1] if isinstance(sampler, DictConfig) else "?"
        raise ConfigError(
            f"clients_per_round={value} would change nothing: no node of this config uses ${{clients_per_round}} "
            f"(the sampler is {target}); choose a sampler that takes it, e.g. sampler=uniform, or drop the override."
        )


def validate_top_level(cfg: DictConfig) -> None:
    """The top-level part of :func:`validate_config`: no import beyond OmegaConf (the CLI runs it first)."""
    missing = [k for k in REQUIRED if k not in cfg]
    if missing:
        raise ConfigError(f"The config lacks {', '.join(missing)}; compose it from configs/train.yaml.")
    _check_top_level(cfg)


def _get(node: DictConfig, key: str, path: str) -> Any:
    """``node[key]`` resolved; a missing ``???`` or a broken ``${...}`` becomes one sentence."""
    try:
        return node[key]
    except MissingMandatoryValue:
        raise ConfigError(f"{path} has no value (???); set it on the command line, e.g. {path}=...") from None
    except InterpolationResolutionError as exc:
        detail = str(exc).splitlines()[0]
        raise ConfigError(f"{path} refers to a value that cannot be resolved ({detail}); fix the ${{...}}.") from None


def _check_top_level(cfg: DictConfig) -> None:
    fields = {f.name: f for f in dataclasses.fields(TrainSchema)}
    for key in cfg:
        key = str(key)
        if key not in fields:
            raise ConfigError(
                f"{key} is not a top-level key of configs/train.yaml{_did_you_mean(key, fields)}; "
                f"remove +{key}=... or put it under its group (e.g. method.{key}=...)."
            )
    hints = typing.get_type_hints(TrainSchema)
    for name, spec in fields.items():
        if name not in cfg or hints[name] is Any:
            continue
        value = _get(cfg, name, name)
        example, meaning, minimum = spec.metadata["example"], spec.metadata["meaning"], spec.metadata["min"]
        if not _matches(value, hints[name]):
            kind = _describe(hints[name])
            raise ConfigError(f"{name} ({meaning}) must be {kind} (got {_show(value)}); set e.g. {example}.")
        if minimum is not None and isinstance(value, int) and value < minimum:
            raise ConfigError(f"{name} ({meaning}) must be at least {minimum} (got {value}); set e.g. {example}.")


def _check_model(node: Any) -> None:
    """The model node against its builder (``inputs`` comes from the data, not the config)."""
    if isinstance(node, DictConfig) and "_target_" in node:
        if "inputs" in node:
            raise ConfigError("model.inputs comes from the data; remove it from the model config.")
        check_target_node(node, "model")


def _check_reports(cfg: DictConfig) -> None:
    """Each ``reports.<name>`` node against the keyword arguments of the report class called ``name``.

    >>> from omegaconf import OmegaConf
    >>> _check_reports(OmegaConf.create({"reports": {"zampling_evaluation": {"tst_samples": 3}}}))
    Traceback (most recent call last):
    ...
    fedlightning.errors.ConfigError: reports.zampling_evaluation has no key tst_samples (did you mean test_samples?)...
    """
    node = _get(cfg, "reports", "reports") if "reports" in cfg else None
    if node is None:
        return
    if not isinstance(node, DictConfig):
        raise ConfigError(
            f"reports must map report names to their settings (got {_show(node)}); see configs/reports/default.yaml."
        )
    declarable = _locate(REPORTS_REGISTRY, "reports")
    for name in map(str, node):
        if name not in declarable:
            raise ConfigError(
                f"reports has no key {name}{_did_you_mean(name, declarable)}; "
                f"the reports a method can declare are {', '.join(sorted(declarable))}."
            )
        settings = _get(node, name, f"reports.{name}")
        if settings is None:
            continue
        if not isinstance(settings, DictConfig):
            raise ConfigError(
                f"reports.{name} must hold the report's settings by key (got {_show(settings)}); "
                f"see configs/reports/default.yaml."
            )
        check_node_keys(settings, f"reports.{name}", declarable[name])


def _locate(path: str, where: str) -> Any:
    """The object at a dotted ``_target_`` path (the longest importable module, then attributes).

    While :func:`reading_records` is active, the recorded target instead (or :class:`NotRecordedError`).
    """
    held = _RECORDS.get()
    if held is not None:
        if path not in held.targets:
            raise NotRecordedError(path)
        return held.targets[path]
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module)
        except ImportError as exc:
            missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
            if missing is not None and (module == missing or module.startswith(missing + ".")):
                continue  # no such module: try a shorter prefix
            raise ConfigError(  # the module exists; an import inside it failed
                f"{where}._target_={path}: importing {module} failed ({exc}); install what it needs, "
                "or reinstall fedlightning if the missing module is its own."
            ) from exc
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            break
        return obj
    raise ConfigError(f"{where}._target_={path} cannot be imported; check its spelling.")


def _takes_kwargs(fn: Callable[..., Any]) -> bool:
    try:
        return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True


def _parameters(target: Any) -> tuple[dict[str, inspect.Parameter], dict[str, Any], bool]:
    """The keyword parameters of ``target``, their type hints, and whether any key is accepted.

    A class contributes the ``__init__`` of each class of its MRO for as long as they take
    ``**kwargs`` and belong to this package (they forward them to the next ``__init__``).
    """
    if isinstance(target, RecordedTarget):
        return dict(target.parameters), dict(target.hints), target.accepts_any
    functions: list[Callable[..., Any]] = []
    accepts_any = False
    if inspect.isclass(target):
        for klass in target.__mro__:
            init = klass.__dict__.get("__init__")
            if init is None:
                continue
            if klass is object:
                break
            functions.append(init)
            if not _takes_kwargs(init):
                break
            if not klass.__module__.startswith("fedlightning."):
                accepts_any = True  # a third-party **kwargs: any key may be valid
                break
    else:
        functions.append(target)
        accepts_any = _takes_kwargs(target) and not getattr(target, "__module__", "").startswith("fedlightning.")
    params: dict[str, inspect.Parameter] = {}
    hints: dict[str, Any] = {}
    for fn in functions:
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):
            return params, hints, True
        try:
            fn_hints = typing.get_type_hints(fn)
        except Exception:  # an annotation that cannot be evaluated: check the keys only
            fn_hints = {}
        for name, parameter in signature.parameters.items():
            if parameter.kind in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL):
                continue
            if name == "self" or name in params:
                continue
            params[name] = parameter
            if name in fn_hints:
                # A subclass may intercept an inherited key from **kwargs and take null for it
                # (FedPM fixes Zampling's d): null is let through for inherited keys.
                hints[name] = fn_hints[name] if fn is functions[0] else typing.Optional[fn_hints[name]]  # noqa: UP045
    return params, hints, accepts_any


def target_keys(node: Mapping[Any, Any]) -> list[str]:
    """The keys the ``_target_`` of ``node`` takes (none when it has no importable target).

    >>> target_keys({"_target_": "fedlightning.datamodules.partition.IIDPartition"})
    ['seed', 'min_partition_size']
    """
    target_path = node.get("_target_") if "_target_" in node else None
    if not isinstance(target_path, str):
        return []
    try:
        params, _, _ = _parameters(_locate(target_path, "node"))
    except NotRecordedError:
        raise
    except Exception:  # a target that does not import: its node's own keys are all we know
        return []
    return [name for name in params if name not in ("model", "datamodule", "params", "inputs")]


def check_target_node(node: DictConfig, where: str) -> None:
    """Check one ``_target_`` node (and its nested ones) against its target's signature.

    >>> from omegaconf import OmegaConf
    >>> check_target_node(OmegaConf.create({"_target_": "fedlightning.datamodules.partition.DirichletPartition",
    ...                                      "alfa": 0.5}), "partition")
    Traceback (most recent call last):
    ...
    fedlightning.errors.ConfigError: partition has no key alfa (did you mean alpha?); DirichletPartition takes ...
    """
    target_path = _get(node, "_target_", f"{where}._target_")
    if not isinstance(target_path, str):
        raise ConfigError(f"{where}._target_ must be a dotted class path (got {target_path!r}).")
    check_node_keys(node, where, _locate(target_path, where), target_path=target_path)


def check_node_keys(node: DictConfig, where: str, target: Any, *, target_path: str | None = None) -> None:
    """Check the keys of ``node`` (at ``where``) and their values against the signature of ``target``.

    A key ``target`` does not take is refused with the closest one it takes; a value is checked
    against the key's annotation and the range rules by key name; a nested ``_target_`` node is
    checked against its own target (:func:`check_target_node`). ``target_path`` names the target in
    a long key listing (default: its module and name).
    """
    if target_path is None:
        target_path = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', target)}"
    params, hints, accepts_any = _parameters(target)
    valid = [name for name in params if name not in ("model", "datamodule", "params", "inputs")]
    for key in node:
        key = str(key)
        if key in HYDRA_KEYS:
            continue
        path = f"{where}.{key}"
        if key not in params and not accepts_any:
            if not valid:
                listing = "no keys"
            elif len(valid) <= MAX_LISTED:
                listing = ", ".join(valid)
            else:
                listing = f"{len(valid)} keys (see the arguments of {target_path})"
            raise ConfigError(
                f"{where} has no key {key}{_did_you_mean(key, valid)}; {target.__name__} takes {listing}."
            )
        value = _get(node, key, path)
        if isinstance(value, DictConfig) and "_target_" in value:
            check_target_node(value, path)
            continue
        if key in hints and not _matches(value, hints[key]):
            kind = _describe(hints[key])
            raise ConfigError(f"{path} must be {kind} (got {_show(value)}){_default_hint(path, params[key])}.")
        _check_range(key, value, path)


def _default_hint(path: str, parameter: inspect.Parameter) -> str:
    """``"; its default is path=value"`` when the parameter has a plain default, else nothing."""
    default = parameter.default
    if default is inspect.Parameter.empty or default is None or not isinstance(default, str | int | float | bool):
        return ""
    shown = default if isinstance(default, str) else _show(default)
    return f"; its default is {path}={shown}"


def _check_range(key: str, value: Any, path: str) -> None:
    if key in FILE_KEYS and isinstance(value, str) and value and not Path(value).is_file():
        raise ConfigError(f"{path}={value} does not exist; point it at a saved file (e.g. partition.json) or unset it.")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    if value != value:  # NaN: no setting means "not a number"
        raise ConfigError(f"{path} must be a number (got nan); set a number, or null where the key takes null.")
    if key in POSITIVE_KEYS and not value > 0:
        raise ConfigError(f"{path} must be positive (got {value}); set e.g. {path}=0.01.")
    if key in AT_LEAST_ONE_KEYS and value < 1:
        raise ConfigError(f"{path} must be at least 1 (got {value}).")
    if key in NON_NEGATIVE_KEYS and value < 0:
        raise ConfigError(f"{path} must be non-negative (got {value}).")


# --- annotations -------------------------------------------------------------------------------

_PRIMITIVES = (str, int, float, bool, type(None))
_SIMPLE = {int: "an integer", float: "a number", bool: "true or false", str: "a string", type(None): "null"}


def _members(annotation: Any) -> tuple[Any, ...]:
    origin = typing.get_origin(annotation)
    if origin is Union or isinstance(annotation, types.UnionType):
        return tuple(m for a in typing.get_args(annotation) for m in _members(a))
    return (annotation,)


def _verdict(value: Any, annotation: Any) -> bool | None:
    """True: ``value`` fits; False: it cannot; None: the annotation is not one we check."""
    if annotation is Any or annotation is object:
        return True
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return value in typing.get_args(annotation)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if annotation in (Path, os.PathLike) or (inspect.isclass(annotation) and issubclass(annotation, Path)):
        return isinstance(value, str)
    base = origin or annotation
    if base in (dict, Mapping, typing.MutableMapping):
        return isinstance(value, DictConfig | dict) or None
    if base in (list, tuple, set, frozenset, Sequence, typing.MutableSequence):
        return isinstance(value, ListConfig | list | tuple) or None
    if inspect.isclass(base) and not issubclass(base, enum.Enum) and isinstance(value, _PRIMITIVES):
        return isinstance(value, base)  # a yaml scalar is never e.g. a Tensor; an Enum may be parsed
    return None


def _matches(value: Any, annotation: Any) -> bool:
    """Whether ``value`` may be passed for ``annotation``; unknown annotations never refuse."""
    if isinstance(annotation, RecordedHint):
        return annotation.matches(value)
    verdicts = [_verdict(value, member) for member in _members(annotation)]
    return any(v is None or v for v in verdicts)


def _describe(annotation: Any) -> str:
    if isinstance(annotation, RecordedHint):
        return annotation.description
    parts = []
    for member in _members(annotation):
        if typing.get_origin(member) is Literal:
            parts.append("one of " + ", ".join(repr(a) for a in typing.get_args(member)))
        elif member in _SIMPLE:
            parts.append(_SIMPLE[member])
        else:
            parts.append(getattr(member, "__name__", str(member)))
    return " or ".join(dict.fromkeys(parts))


def _show(value: Any) -> str:
    if isinstance(value, DictConfig | ListConfig):
        return str(OmegaConf.to_container(value))
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return repr(value) if isinstance(value, str) else str(value)


# --- targets read from a record ----------------------------------------------------------------

#: The class attributes the pre-flight reads of a method (:mod:`fedlightning.preflight`), recorded with it.
DECLARATIONS = (
    "uplink_payload",
    "downlink_payload",
    "per_client_downlink",
    "uplink_needs_unbiased",
    "needed_callbacks",
)
#: One config value of each kind: a member's verdict on a value depends only on the value's kind
#: (a ``Literal``'s, which depends on the value, is recorded as its values instead).
_KIND_SAMPLES: dict[str, Callable[[], Any]] = {
    "none": lambda: None,
    "bool": lambda: True,
    "int": lambda: 3,
    "float": lambda: 0.5,
    "str": lambda: "x",
    "mapping": lambda: OmegaConf.create({}),
    "sequence": lambda: OmegaConf.create([]),
}
_PLAIN = (str, int, float, bool, type(None))


class NotRecordedError(Exception):
    """The record cannot answer for a target or a setting: the live pre-flight decides it."""


class _Unrecorded:
    def __repr__(self) -> str:
        return "UNRECORDED"


UNRECORDED: Any = _Unrecorded()
"""The recorded default of a parameter whose default is not plain data (an enum, a tensor, a callable)."""


def _kind(value: Any) -> str:
    """The kind of a config value, as :data:`_KIND_SAMPLES` names it.

    >>> _kind(True), _kind(2), _kind(OmegaConf.create([1]))
    ('bool', 'int', 'sequence')
    """
    if value is None:
        return "none"
    for kind, types_ in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if isinstance(value, types_):
            return kind
    if isinstance(value, DictConfig | dict):
        return "mapping"
    if isinstance(value, ListConfig | list | tuple):
        return "sequence"
    raise NotRecordedError(f"a value of type {type(value).__name__}")


@dataclass(frozen=True)
class RecordedHint:
    """An annotation as :func:`_matches` and :func:`_describe` read it, without the annotation's types.

    ``members`` holds one entry per member of the annotation (each member of a union): a
    ``Literal``'s values as a tuple, else the member's verdict per kind of value (True, False, or
    None for a member the schema does not check).

    >>> hint = RecordedHint.of(Literal["layer", "model"] | None)
    >>> hint.matches("model"), hint.matches("block"), hint.matches(None), hint.description
    (True, False, True, "one of 'layer', 'model' or null")
    """

    description: str
    members: tuple[tuple[Any, ...] | Mapping[str, bool | None], ...]

    @classmethod
    def of(cls, annotation: Any) -> RecordedHint:
        members: list[tuple[Any, ...] | Mapping[str, bool | None]] = []
        for member in _members(annotation):
            if typing.get_origin(member) is Literal:
                values = typing.get_args(member)
                if not all(type(v) in _PLAIN for v in values):
                    raise NotRecordedError(f"a Literal of {values!r}")
                members.append(tuple(values))
            else:
                members.append({kind: _verdict(sample(), member) for kind, sample in _KIND_SAMPLES.items()})
        return cls(_describe(annotation), tuple(members))

    def matches(self, value: Any) -> bool:
        """:func:`_matches` of the recorded annotation."""
        kind = _kind(value)
        verdicts = [value in m if isinstance(m, tuple) else m[kind] for m in self.members]
        return any(v is None or v for v in verdicts)


class RecordedTarget:
    """A ``_target_`` as this module and the pre-flight read it, standing in for the class or function.

    It has the target's ``__name__``, ``__module__`` and ``__qualname__``, the keyword parameters
    :func:`_parameters` gives (defaults as plain data, else :data:`UNRECORDED`; annotations as
    :class:`RecordedHint`), and the :data:`DECLARATIONS` the target has, as attributes.
    """

    def __init__(
        self,
        *,
        name: str,
        module: str,
        qualname: str,
        parameters: Mapping[str, inspect.Parameter],
        hints: Mapping[str, RecordedHint],
        accepts_any: bool,
        declarations: Mapping[str, Any],
    ) -> None:
        self.__name__ = name
        self.__module__ = module
        self.__qualname__ = qualname
        self.parameters = dict(parameters)
        self.hints = dict(hints)
        self.accepts_any = accepts_any
        self.declarations = dict(declarations)

    def __getattr__(self, name: str) -> Any:  # only names the instance lacks: the declarations
        try:
            return self.__dict__["declarations"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __repr__(self) -> str:
        return f"RecordedTarget({self.__module__}.{self.__qualname__})"


def _plain_default(default: Any) -> Any:
    """A default as plain data (tuples as lists), :data:`UNRECORDED` where it is not plain data."""
    if default is inspect.Parameter.empty or type(default) in _PLAIN:
        return default
    if type(default) in (list, tuple):
        items = [_plain_default(d) for d in default]
        return UNRECORDED if any(i is UNRECORDED for i in items) else items
    return UNRECORDED


def record_target(target: Any) -> RecordedTarget:
    """What :func:`check_node_keys` and the pre-flight read of ``target`` (a class or function), held apart from it.

    >>> from fedlightning.datamodules.partition import DirichletPartition
    >>> recorded = record_target(DirichletPartition)
    >>> recorded.__name__, "alpha" in recorded.parameters, recorded.hints["alpha"].matches("a")
    ('DirichletPartition', True, False)
    """
    params, hints, accepts_any = _parameters(target)
    return RecordedTarget(
        name=str(getattr(target, "__name__", target)),
        module=str(getattr(target, "__module__", "")),
        qualname=str(getattr(target, "__qualname__", getattr(target, "__name__", target))),
        parameters={name: p.replace(default=_plain_default(p.default)) for name, p in params.items()},
        hints={name: RecordedHint.of(hint) for name, hint in hints.items()},
        accepts_any=accepts_any,
        declarations={name: getattr(target, name) for name in DECLARATIONS if hasattr(target, name)},
    )


@dataclass(frozen=True)
class Records:
    """What the pre-flight reads without importing the targets.

    Attributes:
        targets: dotted path → :class:`RecordedTarget` (a mapping such as :data:`REPORTS_REGISTRY`:
            name → :class:`RecordedTarget`).
        accelerators: the accelerator names of Lightning's registry.
    """

    targets: Mapping[str, Any]
    accelerators: tuple[str, ...]


_RECORDS: ContextVar[Records | None] = ContextVar("fedlightning_records", default=None)


@contextlib.contextmanager
def reading_records(held: Records) -> Iterator[None]:
    """Within the block, :func:`_locate` answers from ``held`` and raises :class:`NotRecordedError` for other paths."""
    token = _RECORDS.set(held)
    try:
        yield
    finally:
        _RECORDS.reset(token)


def records() -> Records | None:
    """The records :func:`_locate` reads from, while :func:`reading_records` is active; else None."""
    return _RECORDS.get()
