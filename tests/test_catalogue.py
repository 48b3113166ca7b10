"""docs/catalogue.md lists every config of every group, cites only checked papers, and its commands compose.

A config added under ``configs/<group>/`` without a row here, or a row left behind when a config
is renamed, fails; so does a command whose config names or keys do not exist, or one that
does not select the config of its row.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
PAGE = REPO / "docs" / "catalogue.md"
GROUPS = ("method", "compressor", "downlink", "sampler", "partition", "data", "model", "failures", "divergence")
ALL_GROUPS = (*GROUPS, "experiment")
# Ids not cited in this repository's source, checked against the papers' arXiv pages.
CHECKED_ELSEWHERE = {
    "1610.02132": "Alistarh et al., QSGD: Communication-Efficient SGD via Gradient Quantization and Encoding",
    "1705.07878": "Wen et al., TernGrad: Ternary Gradients to Reduce Communication in Distributed Deep Learning",
    "1901.09269": "Mishchenko et al., Distributed Learning with Compressed Gradient Differences (DIANA)",
}


def _section(text: str, group: str) -> str:
    """The text under the heading that names ``(`group=`)`` (``+experiment=`` for experiments)."""
    key = f"(`+{group}=`)" if group == "experiment" else f"(`{group}=`)"
    parts = re.split(r"^## ", text, flags=re.M)
    found = [p for p in parts if p.splitlines()[0].endswith(key)]
    assert len(found) == 1, f"docs/catalogue.md needs exactly one section headed '... {key}'"
    return found[0]


def _rows(text: str, group: str) -> list[tuple[list[str], str]]:
    """``(config names, command)`` of each table row of the group's section."""
    rows = []
    for line in _section(text, group).splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        names = re.findall(r"`([^`]+)`", cells[0])
        command = re.fullmatch(r"`fedlightning (.*)`", cells[-1])
        assert command, f"the last cell of the row of {names} must be one `fedlightning ...` command"
        rows.append((names, command.group(1)))
    return rows


def _stems(group: str) -> set[str]:
    return {p.stem for p in (CONFIGS / group).glob("*.yaml")}


@pytest.mark.parametrize("group", ALL_GROUPS)
def test_every_config_of_the_group_has_one_row_and_no_row_is_stale(group: str) -> None:
    listed = [n for names, _ in _rows(PAGE.read_text(), group) for n in names]
    assert len(listed) == len(set(listed)), f"{group}: a config is listed twice"
    missing = sorted(_stems(group) - set(listed))
    stale = sorted(set(listed) - _stems(group))
    assert not missing, f"docs/catalogue.md lacks {group} configs: {missing}"
    assert not stale, f"docs/catalogue.md lists {group} configs that do not exist: {stale}"


def test_every_arxiv_id_on_the_page_is_cited_by_the_code_or_checked() -> None:
    page_ids = set(re.findall(r"arXiv (\d{4}\.\d{4,5})", PAGE.read_text()))
    source = " ".join(
        p.read_text(errors="ignore")
        for folder in ("fedlightning", "configs")
        for p in (REPO / folder).rglob("*")
        if p.suffix in {".py", ".yaml"}
    )
    cited = set(re.findall(r"arXiv[: ]?(\d{4}\.\d{4,5})", source))
    unchecked = sorted(page_ids - cited - set(CHECKED_ELSEWHERE))
    assert not unchecked, f"arXiv ids on docs/catalogue.md found neither in the code nor checked: {unchecked}"
    assert "2207.00392" in page_ids and "2503.14246" in page_ids


def _selected(command: str, group: str) -> str | None:
    """The ``group`` config a command selects: its own ``group=name``, else its experiment's override."""
    tokens = dict(t.split("=", 1) for t in command.split())
    if group == "experiment":
        return tokens.get("+experiment")
    if group in tokens:
        return tokens[group]
    if "+experiment" in tokens:
        node = OmegaConf.load(CONFIGS / "experiment" / f"{tokens['+experiment']}.yaml")
        defaults = list(OmegaConf.to_container(node).get("defaults", []))  # type: ignore[union-attr]
        for entry in defaults:
            if not isinstance(entry, str) and f"override /{group}" in entry:
                return str(entry[f"override /{group}"])
        for entry in defaults:
            if isinstance(entry, str) and entry != "_self_":  # the experiment it extends
                return _selected(f"+experiment={entry}", group)
    train = OmegaConf.load(CONFIGS / "train.yaml").defaults
    return next(str(entry[group]) for entry in train if not isinstance(entry, str) and group in entry)


def test_every_command_names_existing_configs_and_selects_its_row() -> None:
    text = PAGE.read_text()
    for group in ALL_GROUPS:
        for names, command in _rows(text, group):
            for token in command.split():
                key, _, value = token.lstrip("+").partition("=")
                if key in ALL_GROUPS:
                    assert (CONFIGS / key / f"{value}.yaml").is_file(), f"`fedlightning {command}`: no {key}={value}"
            chosen = _selected(command, group)
            assert chosen in names, f"`fedlightning {command}` selects {group}={chosen}, not {names}"


@pytest.mark.slow
def test_every_command_composes_and_selects_its_config() -> None:
    text = PAGE.read_text()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        for group in ALL_GROUPS:
            for names, command in _rows(text, group):
                overrides = command.replace("=DATA", "=/data").split()
                cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
                chosen = cfg.hydra.runtime.choices.get(group)
                assert chosen in names, f"`fedlightning {command}` selects {group}={chosen}, not {names}"
