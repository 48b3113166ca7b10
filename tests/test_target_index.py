"""The target index: a recorded target reads as its class, and the record pass refuses as the full pass does.

The command's first pre-flight pass reads the targets from their records
(:mod:`fedlightning.target_index`) so that a refusal needs no Lightning; it must never refuse a
config the full pass accepts, nor word a refusal differently. These tests compare the two passes
on every target of ``configs/``, on every method × compressor and method × downlink pair of the
configs, and on every case of the refusal catalogue.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from fedlightning import target_index
from fedlightning.errors import ConfigError
from fedlightning.preflight import _plain, check_pair, preflight
from fedlightning.schema import (
    DECLARATIONS,
    REPORTS_REGISTRY,
    UNRECORDED,
    NotRecordedError,
    RecordedTarget,
    Records,
    _default_hint,
    _describe,
    _locate,
    _matches,
    _parameters,
    reading_records,
)

from .conftest import CONFIG_DIR, REPO_ROOT, compose_config
from .test_refusal_catalogue import CATALOGUE


@pytest.fixture(scope="module")
def records() -> Records:
    """The index built from the classes, read back from its JSON as a command reads it."""
    return target_index.records_from_json(json.loads(json.dumps(target_index.to_json(target_index.build()))))


def _pairs(records: Records) -> list[tuple[str, RecordedTarget]]:
    found = []
    for path, target in records.targets.items():
        entries = target.items() if isinstance(target, dict) else [("", target)]
        found.extend((f"{path}[{name}]" if name else path, t) for name, t in entries)
    return found


def _live(path: str) -> Any:
    if "[" in path:
        registry, name = path.rstrip("]").split("[")
        return _locate(registry, "test")[name]
    return _locate(path, "test")


def _samples(hint: Any) -> list[Any]:
    """A value of each kind a config holds, and each value of each Literal of ``hint``'s recording."""
    values: list[Any] = [None, True, False, 0, 3, -1, 0.5, "x", "auto", OmegaConf.create({}), OmegaConf.create([1])]
    for member in getattr(hint, "members", ()):
        if isinstance(member, tuple):
            values.extend(member)
    return values


def test_every_target_of_the_configs_and_each_report_is_recorded(records: Records) -> None:
    missing = [path for path in target_index.config_targets() if path not in records.targets]
    assert "fedlightning.compression.sparse.TopK" in records.targets  # as a constructor's error names it
    assert missing == []
    assert set(records.targets[REPORTS_REGISTRY]) == {"sparse_report", "zampling_evaluation"}
    assert {"cpu", "cuda"} <= set(records.accelerators)


def test_a_recorded_target_reads_as_its_class_in_every_check(records: Records) -> None:
    checked = 0
    for path, recorded in _pairs(records):
        live = _live(path)
        params, hints, accepts_any = _parameters(live)
        r_params, r_hints, r_accepts_any = _parameters(recorded)
        assert list(r_params) == list(params), path
        assert r_accepts_any == accepts_any, path
        assert (recorded.__name__, recorded.__module__) == (live.__name__, live.__module__), path
        for name, parameter in params.items():
            r_default = r_params[name].default
            assert _default_hint(f"x.{name}", r_params[name]) == _default_hint(f"x.{name}", parameter), (path, name)
            if r_default is UNRECORDED:  # only a default that is not plain data goes unrecorded
                assert not isinstance(parameter.default, str | int | float | bool | None), (path, name)
            else:
                assert _plain(r_default) == _plain(parameter.default), (path, name)
        assert set(r_hints) == set(hints), path
        for name, hint in hints.items():
            assert _describe(r_hints[name]) == _describe(hint), (path, name)
            for value in _samples(r_hints[name]):
                assert _matches(value, r_hints[name]) == _matches(value, hint), (path, name, value)
        for name in DECLARATIONS:
            assert hasattr(recorded, name) == hasattr(live, name), (path, name)
            if hasattr(live, name):
                assert getattr(recorded, name) == getattr(live, name), (path, name)
        checked += 1
    assert checked >= 80


def _outcome(check: Any, *args: Any, **kwargs: Any) -> str:
    """What ``check(*args, **kwargs)`` decided: accepted, refused (with its sentence), or not recorded."""
    try:
        check(*args, **kwargs)
    except NotRecordedError as exc:
        return f"not recorded: {exc}"
    except ConfigError as exc:
        return f"refused: {exc}"
    return "accepted"


@pytest.mark.parametrize("group", ["compressor", "downlink"])
def test_the_record_pass_decides_every_method_and_operator_pair_as_the_classes_do(group: str, records: Records) -> None:
    methods = sorted(path.stem for path in (CONFIG_DIR / "method").glob("*.yaml"))
    nodes = {path.stem: OmegaConf.load(path) for path in sorted((CONFIG_DIR / group).glob("*.yaml"))}
    decided = 0
    for method_name in methods:
        target = compose_config([f"method={method_name}"]).method._target_
        method = _locate(target, "method")
        if not hasattr(method, "uplink_payload"):
            continue
        for name, node in nodes.items():
            if "_target_" not in node:
                continue
            label = f"{group}={name}"
            live = _outcome(check_pair, method, node, group, method_label=method_name, label=label)
            with reading_records(records):
                held = _locate(target, "method")
                recorded = _outcome(check_pair, held, node, group, method_label=method_name, label=label)
            assert recorded == live, (method_name, name)
            decided += 1
    assert decided >= 100


@pytest.mark.parametrize(("overrides", "fragments"), CATALOGUE.values(), ids=CATALOGUE)
def test_the_record_pass_refuses_each_catalogue_case_in_the_full_pass_words(
    overrides: list[str], fragments: list[str], records: Records
) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import open_dict

    from .conftest import QUIET

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        try:
            cfg = compose(config_name="train", overrides=[*QUIET, *overrides], return_hydra_config=True)
        except HydraException:  # a misspelt key or group: refused by the composition, before either pass
            return
    choices = {str(k): v for k, v in cfg.hydra.runtime.choices.items()}
    cli_overrides = [str(o) for o in cfg.hydra.overrides.task]
    with open_dict(cfg):
        del cfg["hydra"]

    live = _outcome(preflight, cfg, choices=choices, overrides=cli_overrides)
    with reading_records(records):
        recorded = _outcome(preflight, cfg, choices=choices, overrides=cli_overrides)
    assert live.startswith("refused: ")
    assert recorded == live


def test_an_edited_source_file_or_config_gives_another_key(tmp_path: Path) -> None:
    package, configs = tmp_path / "fedlightning", tmp_path / "configs"
    shutil.copytree(REPO_ROOT / "fedlightning", package, ignore=shutil.ignore_patterns("__pycache__", "configs"))
    shutil.copytree(CONFIG_DIR, configs)
    key = target_index.index_key(package, configs)
    assert target_index.index_key(package, configs) == key
    schema = package / "schema.py"
    schema.write_text(schema.read_text() + "\n# an edit\n")
    edited = target_index.index_key(package, configs)
    assert edited != key
    (configs / "method" / "mine.yaml").write_text("_target_: mypackage.Mine\n")
    assert target_index.index_key(package, configs) not in (key, edited)


def test_an_index_of_another_key_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDLIGHTNING_CACHE", str(tmp_path))
    monkeypatch.setattr(target_index, "build", lambda: Records(targets={}, accelerators=("cpu",)))
    target_index.ensure()
    assert target_index.load() == Records(targets={}, accelerators=("cpu",))
    monkeypatch.setattr(target_index, "_this_key", lambda: "another")
    assert target_index.load() is None


def test_a_damaged_index_is_removed_and_written_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDLIGHTNING_CACHE", str(tmp_path))
    monkeypatch.setattr(target_index, "build", lambda: Records(targets={}, accelerators=("cpu",)))
    target_index.index_path().write_text('{"format": 1, "targets"')  # cut short by a full disk
    assert target_index.load() is None
    assert not target_index.index_path().exists()
    target_index.ensure()
    assert target_index.load() == Records(targets={}, accelerators=("cpu",))


def test_a_refusal_from_the_index_imports_no_lightning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDLIGHTNING_CACHE", str(tmp_path))
    target_index.ensure()
    cases = [
        ["method=zampling", "compressor=top_k"],
        ["method=fjord", "downlink=qsgd"],
        ["trainer.devices=0"],
        ["method=fedavg", "reports.zampling_evaluation.test_samples=5"],
        ["+partition.alfa=1"],
    ]
    script = textwrap.dedent(f"""
        import sys
        from fedlightning import cli
        for case in {cases!r}:
            sys.argv = ["fedlightning", *case]
            try:
                cli.main()
            except SystemExit as exc:
                assert exc.code == 1, case
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("lightning", "pytorch_lightning", "torchmetrics")))
    """)
    env = {**os.environ, "FEDLIGHTNING_CACHE": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
    assert len(result.stderr.strip().splitlines()) == 5  # one sentence per case


def test_a_config_the_index_cannot_answer_for_is_left_to_the_full_pass(records: Records) -> None:
    cfg = compose_config(["method=zampling", "reports.zampling_evaluation.sensitivity_taus=[-1.0]"])
    with reading_records(records), pytest.raises(NotRecordedError, match="only the report's constructor checks"):
        preflight(cfg)
    with pytest.raises(ConfigError, match="sensitivity_taus"):
        preflight(cfg)
    unknown = Records(targets={}, accelerators=records.accelerators)
    with reading_records(unknown), pytest.raises(NotRecordedError):
        preflight(compose_config([]))


def test_parameters_of_a_recorded_target_keep_their_defaults(records: Records) -> None:
    recorded = records.targets["fedlightning.callbacks.compression.DownlinkCompression"]
    params, _, _ = _parameters(recorded)
    assert params["scheme"].default == "aggregate"
    assert params["compressor"].default is inspect.Parameter.empty
