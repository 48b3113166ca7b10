"""Pre-flight: every refusal the composed config decides, before any data is read or any folder is made.

:func:`preflight` runs the checks that need nothing but the config, each ending in one sentence
that names the config keys and the fix (:class:`~fedlightning.errors.ConfigError`):

* the schema (:func:`fedlightning.schema.validate_config`) and overrides no node reads
  (:func:`fedlightning.schema.refuse_unread_overrides`);
* the trainer: an accelerator Lightning does not know or this machine lacks, a device count
  of 0 or one the accelerator cannot take (:func:`check_trainer`);
* compression: each ``compressor=``/``downlink=`` operator is built (its constructor checks its
  parameters), then put on a channel of the method's declared payload with the engine's own
  :meth:`fedlightning.federated.channel.Channel.attach`, so a method × compressor pair is
  decided by the code that would refuse it at fit start, not by a second table
  (:func:`check_compression`). A refusal names the configs of the group that would fit;
* the evaluation reports: a ``reports.<name>`` setting other than its default where the method
  does not declare the report ``<name>`` (it would be ignored), and a value the report's
  constructor refuses (:func:`check_reports`).

The command (:func:`fedlightning.cli.main`) runs it on a plain run's config before Hydra makes
the run folder; :func:`fedlightning.run.run` runs it again first thing (tests, notebooks and the
jobs of a multirun call ``run`` directly). A method class whose constructor changes its payload
(Fed-IHT's ``client_threshold=none``, Zampling's ``upload=probabilities``) is checked on its
declared payload here and on the instance's payload when the engine attaches the operator.

The command runs it twice. The first pass reads the targets' records
(:mod:`fedlightning.target_index`, under :func:`fedlightning.schema.reading_records`) and builds
no Lightning object, so it refuses before Lightning is imported: it builds the operators and the
channels as the full pass does, but not the callbacks around them (it runs the downlink scheme's
own check, :func:`~fedlightning.federated.downlink.check_scheme`) nor the reports. Where a
refusal would need them, or a target is not recorded, it raises
:class:`~fedlightning.schema.NotRecordedError` and leaves the config to the second, full pass.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from fedlightning.errors import ConfigError
from fedlightning.federated.channel import Channel, IncompatiblePayloadError
from fedlightning.federated.downlink import AggregateDownlinkChannel, ReplicaDownlinkChannel, check_scheme
from fedlightning.schema import (
    REPORTS_REGISTRY,
    UNRECORDED,
    NotRecordedError,
    _locate,
    _parameters,
    close_match,
    records,
    refuse_unread_overrides,
    validate_config,
)

__all__ = [
    "check_compression",
    "check_reports",
    "check_trainer",
    "constructor_error",
    "declaring_methods",
    "fitting_configs",
    "instantiation_error",
    "preflight",
    "refusal_sentence",
    "refuse_missing_accelerator",
    "refuse_mps",
]

#: The compression groups and the direction of the channel each one attaches to.
COMPRESSION_GROUPS = {"compressor": "uplink", "downlink": "downlink"}
#: Accelerator names the trainer takes besides those of Lightning's registry.
ACCELERATOR_ALIASES = ("auto", "gpu")
#: The callback whose downlink scheme the record pass checks itself (it builds no Lightning callback).
DOWNLINK_CALLBACK = "fedlightning.callbacks.compression.DownlinkCompression"


def preflight(
    cfg: DictConfig, *, choices: Mapping[str, str | None] | None = None, overrides: Sequence[str] = ()
) -> None:
    """Refuse, in one sentence, a config whose problem shows without data; return quietly otherwise.

    Args:
        cfg: a config composed from ``configs/train.yaml`` (without its ``hydra`` node).
        choices: the config-group choices (``{"method": "zampling", "compressor": "top_k"}``), so a
            refusal names ``compressor=top_k`` rather than the operator's own name.
        overrides: the command-line overrides (an override no node reads is refused).
    """
    validate_config(cfg)
    refuse_unread_overrides(cfg, overrides)
    check_trainer(cfg.trainer)
    check_compression(cfg, choices=choices)
    check_reports(cfg, choices=choices)
    refuse_selection_on_test(cfg)


def refuse_selection_on_test(cfg: Mapping[str, Any]) -> None:
    """Refuse early stopping on a validation metric when there is no validation split.

    With ``data.val_fraction=0`` the validation loader serves the test set, so a monitored
    ``val/...`` metric would choose the stopping (and, with ``restore_best``, the scored) round
    on the test data.

    >>> refuse_selection_on_test({"data": {"val_fraction": 0.1}, "early_stopping": {"monitor": "val/acc"}})
    >>> refuse_selection_on_test({"data": {"val_fraction": 0.0}, "early_stopping": {"monitor": None}})
    """
    stopping = cfg.get("early_stopping") or {}
    monitor = stopping.get("monitor")
    data = cfg.get("data") or {}
    if monitor is None or not str(monitor).startswith("val/") or "val_fraction" not in data:
        return
    if float(data["val_fraction"]) == 0.0:
        raise ConfigError(
            f"early_stopping.monitor={monitor} would choose the round on the test set, which serves as validation "
            "when data.val_fraction=0; hold out validation data (e.g. data.val_fraction=0.1) or set "
            "early_stopping.monitor=null."
        )


# --- the trainer --------------------------------------------------------------------------------


def check_trainer(trainer: Mapping[str, Any]) -> None:
    """Refuse an unknown or missing accelerator, and a device or node count the trainer cannot take."""
    held = records()
    if held is None:
        from lightning.pytorch.accelerators import AcceleratorRegistry

        registry: Iterable[str] = AcceleratorRegistry.available_accelerators()
    else:
        registry = held.accelerators
    accelerator = str(trainer.get("accelerator", "auto")).lower()
    known = sorted({*registry, *ACCELERATOR_ALIASES})
    if accelerator not in known:
        match = close_match(accelerator, known)
        hint = f" (did you mean trainer.accelerator={match}?)" if match else ""
        raise ConfigError(
            f"trainer.accelerator={accelerator} is not an accelerator Lightning knows{hint}; "
            f"choose one of {', '.join(known)}."
        )
    refuse_missing_accelerator(trainer)
    refuse_mps(accelerator)
    if accelerator not in ("cpu", "gpu", "cuda", "auto"):
        if held is not None:
            raise NotRecordedError(f"whether trainer.accelerator={accelerator} is available")
        registered = AcceleratorRegistry[accelerator]["accelerator"]
        if not registered.is_available():
            raise ConfigError(
                f"trainer.accelerator={accelerator} is not available on this machine; use trainer.accelerator=cpu."
            )
    nodes = trainer.get("num_nodes", 1)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ConfigError(f"trainer.num_nodes must be a machine count of at least 1 (got {nodes}); set it to 1.")
    _check_devices(trainer.get("devices", "auto"), accelerator)


def _check_devices(devices: Any, accelerator: str) -> None:
    shown = OmegaConf.to_container(devices) if OmegaConf.is_config(devices) else devices
    count = _as_int(devices)
    if count == 0:
        raise ConfigError(
            "trainer.devices=0 asks for no device at all; set trainer.devices=1 (one process) or more, or auto."
        )
    if isinstance(devices, str) and devices.strip().lower() == "auto":
        return
    import torch

    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    if on_cpu and (count is None or count < 1):
        raise ConfigError(
            f"trainer.devices={shown} is not a process count: on the CPU it is a whole number of at least 1 "
            "(or auto); set e.g. trainer.devices=2."
        )
    if count is not None and count < -1:
        raise ConfigError(
            f"trainer.devices={shown} is not a device count; set a count of at least 1, -1 (all) or auto."
        )


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    return None


def refuse_mps(accelerator: str) -> None:
    """Refuse Apple's MPS, named or chosen by ``auto`` (Lightning prefers it to the CPU where there is no CUDA).

    The server's aggregator sums uploads in float64, so that any process count gives the same
    model (:class:`fedlightning.federated.aggregators.WeightedMean`), and MPS has no float64.
    """
    import torch

    if accelerator == "auto" and (torch.cuda.is_available() or not torch.backends.mps.is_available()):
        return
    if accelerator in ("mps", "auto"):
        chosen = "" if accelerator == "mps" else " (auto chooses Apple's MPS on this machine)"
        raise ConfigError(
            f"trainer.accelerator={accelerator}{chosen} cannot hold the server's float64 sums of the uploads, "
            "since MPS has no float64; use trainer.accelerator=cpu."
        )


def refuse_missing_accelerator(trainer: Mapping[str, Any]) -> None:
    """Refuse, in one sentence and before any data is read, a GPU accelerator or GPU count this machine lacks."""
    import torch

    accelerator = str(trainer.get("accelerator", "cpu")).lower()
    if accelerator not in ("gpu", "cuda"):
        return
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    devices = trainer.get("devices", 1)
    wanted = devices if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0 else 1
    if available == 0:
        raise ConfigError(
            f"trainer.accelerator={accelerator} needs a CUDA GPU and this machine has none "
            "(torch.cuda.is_available() is false); use trainer.accelerator=cpu."
        )
    if wanted > available:
        raise ConfigError(
            f"trainer.devices={wanted} asks for more GPUs than this machine's {available}; "
            f"set trainer.devices={available} or fewer."
        )


# --- compression --------------------------------------------------------------------------------


def check_compression(cfg: DictConfig, *, choices: Mapping[str, str | None] | None = None) -> None:
    """Build each ``compressor=``/``downlink=`` operator and refuse it if the method's channel would.

    The channel is the engine's (:class:`~fedlightning.federated.channel.Channel`, or the
    downlink scheme's), made for the payload the method class declares; an
    :class:`~fedlightning.federated.channel.IncompatiblePayloadError` becomes a sentence in
    config names that lists the configs of the group that would fit.
    """
    choices = dict(choices or {})
    method_node = cfg.get("method")
    if not isinstance(method_node, DictConfig) or not isinstance(method_node.get("_target_"), str):
        return
    method = _locate(str(method_node._target_), "method")
    if not hasattr(method, "uplink_payload"):
        return  # not a federated module: nothing declares what crosses the wire
    method_label = _label(method, "method", choices) or method.__name__
    for group in COMPRESSION_GROUPS:
        node = cfg.get(group)
        if not isinstance(node, DictConfig) or "_target_" not in node:
            continue
        try:
            check_pair(method, node, group, method_label=method_label, label=_label(None, group, choices))
        except (IncompatiblePayloadError, MethodNeedsError) as exc:
            raise ConfigError(refusal_sentence(exc, method, group, choices=choices)) from None


def _label(method: type | None, group: str, choices: Mapping[str, str | None]) -> str | None:
    """``group=<choice>`` when the choice is known, else the method's class name (or None)."""
    if choices.get(group):
        return f"{group}={choices[group]}"
    return method.__name__ if method is not None else None


def check_pair(method: Any, node: DictConfig, group: str, *, method_label: str, label: str | None = None) -> None:
    """Raise the engine's :class:`ConfigError` if the ``group`` node cannot serve ``method``.

    Builds the operator and its callback (their constructors check their own settings), then
    attaches the operator to a channel of the method's declared payload. ``label``
    (``compressor=top_k``) replaces the operator's own name in a constructor's refusal. Reading
    records, it builds no callback (see the module docstring).
    """
    from fedlightning.compression.codecs import Float32Codec

    operator_node = node.get("compressor")
    if not isinstance(operator_node, DictConfig) or "_target_" not in operator_node:
        return  # the callback's own check (schema, constructor) speaks at build time
    operator = _build_operator(operator_node, f"{group}.compressor")
    direction = COMPRESSION_GROUPS[group]
    if records() is None:
        callback = _build_callback(node, group, operator=operator, label=label)
        scheme = getattr(callback, "scheme", "aggregate")
    else:  # the record pass builds no callback; it runs the downlink callback's check of its scheme
        scheme = _recorded_scheme(node, operator, label) if direction == "downlink" else "aggregate"
    granularity = node.get("granularity", "layer")
    if direction == "uplink":
        channel = Channel(direction="uplink", payload=method.uplink_payload, codec=Float32Codec(), method=method_label)
        error_feedback = bool(node.get("error_feedback", False))
        channel.attach(operator, error_feedback=error_feedback, granularity=granularity)
        if getattr(method, "uplink_needs_unbiased", False):  # e.g. DIANA's step rule reads ω
            if not operator.unbiased:
                raise MethodNeedsError(operator=operator.name, need="unbiased")
            if error_feedback:
                raise MethodNeedsError(operator=operator.name, need="no_error_feedback")
        return
    downlink = AggregateDownlinkChannel if scheme == "aggregate" else ReplicaDownlinkChannel
    channel = downlink(
        payload=method.downlink_payload,
        codec=Float32Codec(),
        method=method_label,
        per_client=bool(getattr(method, "per_client_downlink", False)),
    )
    channel.attach(operator, granularity=granularity)


class MethodNeedsError(ConfigError):
    """A method's own requirement on its uplink operator (``uplink_needs_unbiased``: DIANA's ω)."""

    def __init__(self, *, operator: str, need: str) -> None:
        self.operator, self.need = operator, need
        super().__init__(f"the method needs an unbiased uplink operator without error feedback ({operator})")


def refusal_sentence(
    exc: IncompatiblePayloadError | MethodNeedsError,
    method: type,
    group: str,
    *,
    choices: Mapping[str, str | None] | None = None,
) -> str:
    """The sentence of a refused method × ``group`` pair, in config names, with the configs of ``group`` that fit."""
    choices = dict(choices or {})
    method_label = _label(method, "method", choices) or method.__name__
    label = _label(None, group, choices)
    if isinstance(exc, MethodNeedsError):
        if exc.need == "no_error_feedback":
            return f"{method_label}'s shifts replace error feedback; set {group}.error_feedback=false."
        fitting = fitting_configs(method, group)
        options = f"set {group}= to one of {', '.join(fitting)}" if fitting else f"use {group}=none"
        what = label or f"the uplink compressor {exc.operator}"
        return f"{method_label} needs an unbiased uplink compressor and {what} is biased; {options}."
    fitting = fitting_configs(method, group)
    what = label or f"the {exc.direction} compressor {exc.compressor}"
    verb = "uploads" if exc.direction == "uplink" else "broadcasts"
    takes = " and ".join(sorted(f"{p}s" for p in exc.accepts)) or "nothing"
    if fitting:
        fix = f"use {group}=none (the method's own codec) or set {group}= to one of {', '.join(fitting)}"
    else:
        fix = f"use {group}=none (the method's own codec; no {group}= config compresses a {exc.payload})"
    return f"{method_label} {verb} a {exc.payload}, which {what} does not compress (it takes {takes}); {fix}."


def fitting_configs(method: Any, group: str) -> list[str]:
    """Names of the configs under ``configs/<group>/`` that :func:`check_pair` accepts for ``method``.

    ``none`` (the method's own codec) is not listed: it always fits.

    >>> from fedlightning.methods.diana import DIANA
    >>> fits = fitting_configs(DIANA, "compressor")
    >>> "rand_k" in fits, "top_k" in fits, "top_k_ef" in fits
    (True, False, False)
    """
    from fedlightning.paths import config_dir

    names = []
    for path in sorted((Path(config_dir()) / group).glob("*.yaml")):
        node = OmegaConf.load(path)
        if not isinstance(node, DictConfig) or "_target_" not in node:
            continue
        try:
            check_pair(method, node, group, method_label=method.__name__)
        except ConfigError:
            continue
        names.append(path.stem)
    return names


# --- the evaluation reports ---------------------------------------------------------------------


def check_reports(cfg: DictConfig, *, choices: Mapping[str, str | None] | None = None) -> None:
    """Refuse a ``reports.<name>`` setting the method would ignore, then build the reports it declares.

    A report's settings are read only where the method names the report in ``needed_callbacks``
    (:mod:`fedlightning.callbacks.declared`); a value other than the default of the report's
    constructor under any other method (from the command line or an experiment config) would
    change nothing, so it is refused naming the method configs that declare the report. The
    declared reports are then built from their settings, so a value their constructor refuses
    (``reports.zampling_evaluation.test_samples=0``) stops the run before any data is read.
    """
    reports = cfg.get("reports")
    method_node = cfg.get("method")
    if not isinstance(reports, DictConfig) or not isinstance(method_node, DictConfig):
        return
    target = method_node.get("_target_")
    if not isinstance(target, str):
        return
    method = _locate(target, "method")
    declarable = _locate(REPORTS_REGISTRY, "reports")
    declared = tuple(getattr(method, "needed_callbacks", ()))
    held = records()
    if held is None:
        from fedlightning.callbacks.declared import declared_reports

        declared = declared_reports(method)  # refuses a name no report has
    elif any(name not in declarable for name in declared):
        raise NotRecordedError(f"the reports of {method.__name__}")
    for name in map(str, reports):
        settings = reports.get(name)
        if name in declared or name not in declarable or not isinstance(settings, DictConfig):
            continue
        params, _, _ = _parameters(declarable[name])
        for key in map(str, settings):
            default = params[key].default if key in params else None
            if default is UNRECORDED:
                raise NotRecordedError(f"the default of reports.{name}.{key}")
            if _plain(settings[key]) == _plain(default):
                continue
            label = _label(method, "method", dict(choices or {})) or method.__name__
            users = ", ".join(declaring_methods(name)) or "none"
            raise ConfigError(
                f"reports.{name}.{key} is read only by methods that declare the {name} report ({users}); "
                f"{label} ignores it: drop the override or choose one of those methods."
            )
    if held is not None:  # the record holds no constructor: it answers only for the defaults, which build
        _refuse_unrecorded_settings(reports, declared, declarable)
        return
    from fedlightning.callbacks.declared import declared_callbacks

    try:
        declared_callbacks(method, settings=reports)
    except (ValueError, TypeError) as exc:
        raise constructor_error(exc, "reports", None) from None


def _refuse_unrecorded_settings(reports: DictConfig, declared: Sequence[str], declarable: Mapping[str, Any]) -> None:
    """Raise :class:`NotRecordedError` where a declared report has a setting other than its default."""
    for name in declared:
        settings = reports.get(name)
        if not isinstance(settings, DictConfig):
            continue
        params, _, _ = _parameters(declarable[name])
        for key in map(str, settings):
            default = params[key].default if key in params else UNRECORDED
            if default is UNRECORDED or _plain(settings[key]) != _plain(default):
                raise NotRecordedError(f"reports.{name}.{key}, which only the report's constructor checks")


def _plain(value: Any) -> Any:
    """A config value as plain data, sequences as lists, for comparing a setting with a default.

    >>> _plain(OmegaConf.create({"taus": [0.1]}).taus), _plain(())
    ([0.1], [])
    """
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def declaring_methods(report: str) -> list[str]:
    """Names of the configs under ``configs/method/`` whose method declares ``report`` in ``needed_callbacks``.

    >>> names = declaring_methods("zampling_evaluation")
    >>> "zampling" in names and "fedpm" in names and "fedavg" not in names
    True
    """
    from fedlightning.paths import config_dir

    folder = Path(config_dir()) / "method"
    names = []
    for path in sorted(folder.glob("*.yaml")):
        target = _config_target(folder, path.stem)
        if target is None:
            continue
        try:
            method = _locate(target, "method")
        except ConfigError:
            continue
        if report in getattr(method, "needed_callbacks", ()):
            names.append(path.stem)
    return names


def _config_target(folder: Path, name: str, seen: tuple[str, ...] = ()) -> str | None:
    """The ``_target_`` of ``folder/<name>.yaml``: its own, else that of the first config of its group it extends."""
    node = OmegaConf.load(folder / f"{name}.yaml")
    if not isinstance(node, DictConfig):
        return None
    target = node.get("_target_")
    if isinstance(target, str):
        return target
    for entry in node.get("defaults") or []:
        if isinstance(entry, str) and entry not in (*seen, name) and (folder / f"{entry}.yaml").is_file():
            found = _config_target(folder, entry, (*seen, name))
            if found is not None:
                return found
    return None


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Silence a logger while a pre-flight object is built (the run builds, and logs, its own)."""
    logger = logging.getLogger(name)
    disabled, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = disabled


def _build_operator(node: DictConfig, where: str) -> Any:
    try:
        return instantiate(node)
    except InstantiationException as exc:
        raise instantiation_error(exc, where) from None


def _build_callback(node: DictConfig, where: str, *, operator: Any, label: str | None) -> Any:
    """The callback of a compression node around ``operator`` (already built, passed as it is)."""
    target = str(node.get("_target_"))
    factory = instantiate(node, _partial_=True, _recursive_=False)
    try:
        with _quiet("fedlightning.callbacks.compression"), _relabelled(operator, label):  # warnings: the run's
            return factory(compressor=operator)
    except (ValueError, TypeError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise constructor_error(exc, where, target) from None


@contextlib.contextmanager
def _relabelled(operator: Any, label: str | None) -> Iterator[None]:
    """A :class:`ConfigError` raised in the block names the operator by ``label`` (``downlink=top_k``)."""
    try:
        yield
    except ConfigError as exc:
        if not label:
            raise
        raise ConfigError(str(exc).replace(operator.name, label)) from None


def _recorded_scheme(node: DictConfig, operator: Any, label: str | None) -> str:
    """The downlink node's scheme (its value, else the recorded default), checked as its callback checks it."""
    if node.get("_target_") != DOWNLINK_CALLBACK:
        raise NotRecordedError(f"the scheme of {node.get('_target_')}")
    if "scheme" in node:
        scheme = node.scheme
    else:
        params, _, _ = _parameters(_locate(DOWNLINK_CALLBACK, "downlink"))
        scheme = params["scheme"].default if "scheme" in params else UNRECORDED
        if scheme is UNRECORDED or scheme is inspect.Parameter.empty:
            raise NotRecordedError("the default of downlink.scheme")
    with _relabelled(operator, label):
        check_scheme(str(scheme), operator)
    return str(scheme)


# --- constructor errors in config names ---------------------------------------------------------


def instantiation_error(exc: InstantiationException, where: str) -> ConfigError:
    """One sentence for a constructor that refused its config: its message, keys named in full.

    Hydra wraps a constructor's error and names the node (``full_key``); see :func:`constructor_error`.

    >>> from omegaconf import OmegaConf
    >>> node = OmegaConf.create({"compressor": {"_target_": "fedlightning.compression.TopK", "fraction": 0}})
    >>> try:
    ...     instantiate(node.compressor)
    ... except InstantiationException as exc:
    ...     print(instantiation_error(exc, "compressor"))
    compressor.fraction must lie in (0, 1] (got 0); set e.g. compressor.fraction=0.01 (1% of the coordinates).
    """
    found = re.search(r"full_key: (\S+)", str(exc))
    target = re.search(r"call to target '([^']+)'", str(exc))
    cause = exc.__cause__
    if isinstance(cause, ValueError | TypeError):
        return constructor_error(cause, found.group(1) if found else where, target.group(1) if target else None)
    text = " ".join(str(exc).split())
    return ConfigError(f"Could not build {where} ({text}); check {where}._target_.")


def constructor_error(cause: Exception, path: str, target: str | None) -> ConfigError:
    """A constructor's refusal of the node at ``path`` as one sentence in config names.

    A :class:`ConfigError` already speaks in config names; another ``ValueError`` (a bad setting)
    is told with each of the target's argument names it mentions prefixed by ``path``
    (``fraction`` becomes ``compressor.compressor.fraction``); a ``TypeError`` points at the
    node's keys.
    """
    if isinstance(cause, ConfigError):
        return cause
    if isinstance(cause, ValueError):
        return ConfigError(_qualified(str(cause), path, _argument_names(target)))
    return ConfigError(f"Could not build {path}: {cause}; check the keys under {path}.")


def _argument_names(target: str | None) -> list[str]:
    if target is None:
        return []
    try:
        params, _, _ = _parameters(_locate(target, "node"))
    except NotRecordedError:
        raise
    except Exception:  # not importable: no names to qualify
        return []
    return list(params)


def _qualified(message: str, path: str, names: Sequence[str]) -> str:
    """``message`` with each whole-word argument name written as ``path.name``.

    >>> _qualified("k must be at least 1 (got k=0); it's not fraction.", "top", ["k", "fraction"])
    "top.k must be at least 1 (got top.k=0); it's not top.fraction."
    """
    if not names:
        return message
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.sub(rf"(?<![\w.'`])(?:{alternatives})(?![\w'`])", lambda m: f"{path}.{m.group(0)}", message)
