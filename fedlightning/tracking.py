"""Weights & Biases runs that say what they ran: config, group, tags, name, bit axes, results.

* :func:`run_labels` gives a run its ``group`` (its :func:`setting`: the overrides that change
  it, the seed aside, so a grid's runs of one setting share a group and its other settings do
  not), ``tags`` (``method:<name>``, ``compressor:<name>``, ..., ``experiment:<name>``,
  ``sweep:<date>/<time>``), ``name`` (the overrides of the job, else its choices) and ``job_type``.
* :func:`flat_config` is the resolved config flattened to dotted keys, plus the config-group
  choices under their own names (``method``, ``compressor``, ``partition``, ...), ``seed`` and
  ``setting``.
* :func:`define_bit_axes` declares ``comm/uplink_bits_total`` the x-axis of every ``val/*``,
  ``test/*`` and ``train/*`` metric; ``comm/bits_total`` and ``round`` are logged in the same
  rows, so either can be chosen as x-axis instead.
* :func:`bits_to_target` and :func:`log_results` put the bits-to-target-accuracy table and the
  run's files (``summary.json``, the PNG, the CSVs, ``config.yaml``) into the W&B run.
* :func:`read_offline_run` reads an offline run's ``.wandb`` file (no network, no W&B server),
  for tests and for checking a run before ``wandb sync``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

#: The config groups a run is tagged with, in this order.
TAGGED_GROUPS = ("method", "compressor", "downlink", "sampler", "partition", "data")
#: Config groups whose choice is recorded in the W&B config under the group's own name.
CHOICE_GROUPS = (*TAGGED_GROUPS, "model", "failures", "experiment")
#: Overrides that do not say what a run computes, left out of its name.
UNNAMED_OVERRIDES = ("hydra.", "data.root=", "logger", "threads=", "ckpt_path=", "print_config=", "trainer.enable")
#: Overrides that draw a replicate of a setting rather than choose one: left out of :func:`setting`.
REPLICATE_OVERRIDES = ("seed=",)
#: W&B's longest group name.
MAX_GROUP = 128
#: The x-axis of every accuracy and loss; :data:`OTHER_AXES` are logged in the same rows.
BITS_AXIS = "comm/uplink_bits_total"
OTHER_AXES = ("comm/bits_total", "comm/downlink_bits_total", "round")
AXIS_OF = ("val/*", "test/*", "train/*")
#: The run files logged as the W&B run's artifact (those that exist).
RESULT_FILES = (
    "summary.json",
    "config.yaml",
    "bits_vs_accuracy.png",
    "bits_vs_accuracy.csv",
    "comm_records.csv",
    "csv/metrics.csv",
    "clients.csv",
)


def choice(cfg: DictConfig, choices: Mapping[str, str | None], group: str) -> str:
    """The config-group choice ``group`` of a run (from its constructor's class when unknown).

    ``"none"`` for an empty group (``compressor: {}``).
    """
    chosen = choices.get(group)
    if chosen:
        return str(chosen)
    node = cfg.get(group)
    if isinstance(node, DictConfig) and node.get("_target_"):
        return str(node._target_).rsplit(".", 1)[-1].lower()
    if isinstance(node, DictConfig) and node.get("name"):
        return str(node.name)
    return "none"


def _named(overrides: Sequence[str]) -> list[str]:
    """The overrides that change what a run computes (not ``hydra.*``, ``data.root``, ``threads``, ...)."""
    return [o for o in overrides if not o.lstrip("+~").startswith(UNNAMED_OVERRIDES)]


def setting(cfg: DictConfig, *, choices: Mapping[str, str | None], overrides: Sequence[str] = ()) -> str:
    """What a run computes, its seed aside: the overrides that change it, sorted, else ``<method>-<data>``.

    Runs of one setting under different seeds share it, and runs that differ in anything else
    do not, so grouping by it draws one mean and spread per setting of a grid. A
    ``+experiment=...`` is one of the overrides, so an experiment's settings are its own.

    >>> cfg = OmegaConf.create({"seed": 0, "compressor": {}})
    >>> [setting(cfg, choices={"method": "fedavg"}, overrides=[f"seed={s}", "compressor=top_k", "threads=1"])
    ...  for s in (0, 1)]
    ['compressor=top_k', 'compressor=top_k']
    >>> setting(cfg, choices={"method": "fedavg", "data": "digits"}, overrides=["seed=3"])
    'fedavg-digits'
    """
    kept = sorted(o for o in _named(overrides) if not o.lstrip("+~").startswith(REPLICATE_OVERRIDES))
    if kept:
        return " ".join(kept)
    return f"{choice(cfg, choices, 'method')}-{choice(cfg, choices, 'data')}"


def _bounded(text: str, limit: int) -> str:
    """``text``, or where longer than ``limit`` its start and a hash of the whole (distinct texts stay distinct)."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha1(text.encode()).hexdigest()[:10]
    return f"{text[: limit - 12]} #{digest}"


def run_labels(
    cfg: DictConfig,
    *,
    choices: Mapping[str, str | None],
    overrides: Sequence[str] = (),
    sweep_dir: str | Path | None = None,
) -> dict[str, Any]:
    """``group``, ``tags``, ``name`` and ``job_type`` of a run's W&B run.

    The group is the run's :func:`setting`, so W&B's grouping by group draws, for each setting
    of a grid, the mean over its seeds with their spread; the experiment and the sweep folder
    are tags.

    >>> cfg = OmegaConf.create({"seed": 1, "compressor": {}})
    >>> labels = run_labels(cfg, choices={"method": "fedavg", "data": "digits"}, overrides=["seed=1"])
    >>> labels["group"], labels["name"], labels["tags"][:2], labels["job_type"]
    ('fedavg-digits', 'seed=1', ['method:fedavg', 'compressor:none'], 'train')
    """
    picked = {group: choice(cfg, choices, group) for group in TAGGED_GROUPS}
    tags = [f"{g}:{v}" for g, v in picked.items()]
    experiment = choices.get("experiment")
    if experiment:
        tags.append(f"experiment:{experiment}")
    if sweep_dir is not None:
        tags.append("sweep:" + "/".join(Path(sweep_dir).parts[-2:]))  # multirun/<date>/<time>: "<date>/<time>"
    name = " ".join(_named(overrides)) or f"{picked['method']} {picked['compressor']} seed={cfg.get('seed')}"
    return {
        "group": _bounded(setting(cfg, choices=choices, overrides=overrides), MAX_GROUP),
        "tags": [tag[:64] for tag in tags],
        "name": name[:128],
        "job_type": "sweep" if sweep_dir is not None else "train",
    }


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as ``{"a.b": value}``; lists stay values, empty mappings vanish.

    >>> flatten({"method": {"lr": 0.1, "opt": {"_target_": "SGD"}}, "compressor": {}, "seed": 0})
    {'method.lr': 0.1, 'method.opt._target_': 'SGD', 'seed': 0}
    """
    out: dict[str, Any] = {}
    if isinstance(node, Mapping):
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    out[prefix[:-1]] = node
    return out


def flat_config(cfg: DictConfig, *, choices: Mapping[str, str | None], overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The resolved config flattened, with the group choices under their names (``method: fedavg``)."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    out = flatten(resolved)
    for group in CHOICE_GROUPS:
        if group in TAGGED_GROUPS or choices.get(group):
            out[group] = choice(cfg, choices, group)
    out["seed"] = int(cfg.seed)
    out["setting"] = setting(cfg, choices=choices, overrides=overrides)
    out["overrides"] = " ".join(overrides)
    return out


def define_bit_axes(experiment: Any, *, score: str = "acc") -> None:
    """Declare :data:`BITS_AXIS` the x-axis of every metric of :data:`AXIS_OF`.

    The run's main metrics (``val/<score>``, ``val/<score>_best``, ``val/loss``, ``test/<score>``,
    ``test/loss``, ``train/loss``) are declared by name too: a named definition takes precedence
    over Lightning's ``*`` glob (``trainer/global_step``) whatever the order of glob matching.
    """
    if not hasattr(experiment, "define_metric"):  # W&B disabled: a dummy run
        return
    for axis in (BITS_AXIS, *OTHER_AXES):
        experiment.define_metric(axis)
    named = (f"val/{score}", f"val/{score}_best", "val/loss", f"test/{score}", "test/loss", "train/loss")
    for name in (*named, *AXIS_OF):
        experiment.define_metric(name, step_metric=BITS_AXIS)


def bits_to_target(points: Sequence[Mapping[str, float]], *, metric: str, target: float) -> dict[str, Any]:
    """The first evaluation reaching ``metric >= target``: its round and cumulative bits (``None`` if none does).

    >>> pts = [{"round": 1, "comm/uplink_bits_total": 10, "comm/bits_total": 20, "val/acc": 0.4},
    ...        {"round": 2, "comm/uplink_bits_total": 20, "comm/bits_total": 40, "val/acc": 0.6}]
    >>> bits_to_target(pts, metric="val/acc", target=0.5)
    {'target': 0.5, 'round': 2, 'uplink_bits': 20, 'bits': 40}
    """
    for point in points:
        if metric in point and float(point[metric]) >= target:
            return {
                "target": target,
                "round": int(point["round"]),
                "uplink_bits": int(point.get(BITS_AXIS, 0)),
                "bits": int(point.get("comm/bits_total", 0)),
            }
    return {"target": target, "round": None, "uplink_bits": None, "bits": None}


def log_results(
    experiment: Any,
    *,
    output_dir: Path,
    points: Sequence[Mapping[str, float]],
    metric: str,
    targets: Sequence[float],
) -> None:
    """Log the bits-to-target table and summary keys, and the run's files as an artifact."""
    import wandb

    rows = [bits_to_target(points, metric=metric, target=float(t)) for t in targets]
    table = wandb.Table(columns=["metric", "target", "round", "uplink_bits", "bits"])
    for row in rows:
        table.add_data(metric, row["target"], row["round"], row["uplink_bits"], row["bits"])
        experiment.summary[f"bits_to_target/{metric}>={row['target']:g}"] = row["uplink_bits"]
    experiment.log({"bits_to_target": table})
    artifact = wandb.Artifact(name=f"results-{experiment.id}", type="run-results")
    for name in RESULT_FILES:
        path = output_dir / name
        if path.is_file():
            artifact.add_file(str(path), name=name)
    experiment.log_artifact(artifact)


# ---------------------------------------------------------------------------- offline run files
@dataclass
class OfflineRun:
    """What an offline W&B run recorded, read from its ``.wandb`` file."""

    config: dict[str, Any] = field(default_factory=dict)
    group: str = ""
    tags: list[str] = field(default_factory=list)
    name: str = ""
    job_type: str = ""
    step_metrics: dict[str, str] = field(default_factory=dict)
    """Metric name or glob (``val/*``) -> its step metric."""
    history: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def step_metric(self, name: str) -> str | None:
        """The x-axis of metric ``name``: its own definition, else that of the longest glob it matches."""
        if name in self.step_metrics:
            return self.step_metrics[name]
        globs = [p for p in self.step_metrics if "*" in p and fnmatch.fnmatchcase(name, p)]
        return self.step_metrics[max(globs, key=len)] if globs else None


_BLOCK = 32768
_HEADER = 7  # ":W&B", a 2-byte magic and a version byte; then LevelDB-log records
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _chunks(data: bytes) -> Iterator[bytes]:
    """The records of a W&B transaction log: LevelDB log format (32 KiB blocks, 7-byte headers)."""
    pos, pending = _HEADER, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk
            pending = b""


def read_offline_run(run_dir: str | Path) -> OfflineRun:
    """Read ``<run_dir>/run-<id>.wandb`` (``run_dir``: a ``wandb/offline-run-*`` folder)."""
    from wandb.proto import wandb_internal_pb2 as pb

    files = sorted(Path(run_dir).glob("run-*.wandb"))
    if not files:
        raise FileNotFoundError(f"no run-*.wandb file in {run_dir}")
    out = OfflineRun()
    metric_names: list[str] = []
    for chunk in _chunks(files[0].read_bytes()):
        record = pb.Record()  # type: ignore[attr-defined]
        record.ParseFromString(chunk)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            out.group, out.tags, out.name, out.job_type = run.run_group, list(run.tags), run.display_name, run.job_type
            out.config.update(_items(run.config.update))
        elif kind == "config":
            out.config.update(_items(record.config.update))
        elif kind == "metric":
            metric = record.metric
            name = metric.name or metric.glob_name
            metric_names.append(name)
            index = metric.step_metric_index  # 1-based position among the run's metric records, 0: none
            axis = metric.step_metric or (metric_names[index - 1] if 0 < index <= len(metric_names) else "")
            if axis:
                out.step_metrics[name] = axis
        elif kind == "history":
            out.history.append(_items(record.history.item))
        elif kind == "summary":
            out.summary.update(_items(record.summary.update))
        elif kind == "artifact":
            entries = [entry.path for entry in record.artifact.manifest.contents]
            out.artifacts.append({"type": record.artifact.type, "name": record.artifact.name, "files": entries})
    return out


def _items(items: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key = item.key or "/".join(item.nested_key)
        value = json.loads(item.value_json)
        out[key] = value.get("value", value) if isinstance(value, dict) and set(value) <= {"value", "desc"} else value
    return out
