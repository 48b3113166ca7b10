"""Every method × uplink compressor pair either trains with the bits its payload implies or is refused.

A pair is accepted when the compressor understands the method's uplink payload (model deltas
and gradients for the thesis's operators). Accepted pairs run two rounds on digits and every
upload must have been written by that compressor, with the exact length of the fixed-length
operators; without a compressor the method's own codec writes them. Refused pairs stop with
one sentence before any round, naming the method and the compressor.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from fedlightning.errors import ConfigError
from fedlightning.federated.payloads import DENSE_UPDATES
from fedlightning.run import run

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
METHODS = sorted(p.stem for p in (CONFIGS / "method").glob("*.yaml"))
COMPRESSORS = sorted(p.stem for p in (CONFIGS / "compressor").glob("*.yaml"))
SMALL = [
    "rounds=2",
    "eval_every=2",
    "data.num_clients=3",
    "model=digits_logreg",
    "save_partition=false",
    "checkpoint_every=0",
]
PARAMS = 64 * 10 + 10  # digits_logreg
DIGITS_LOGREG_TENSORS = (64 * 10, 10)
FIXED_LENGTH = {
    "identity": 32 * PARAMS,
    "natural": 9 * PARAMS,
    "natural_deterministic": 9 * PARAMS,
    "sign": PARAMS,
    "scaled_sign": 2 * 32 + PARAMS,
}  # layer-wise: two tensors
DIANA_FAMILY = {"diana", "vr_diana"}
N_ZAMPLING = PARAMS // 32  # method.compression = 32
# Without a compressor: the method's own codec and, where it is fixed-length, its bits per upload.
OWN_CODEC: dict[str, tuple[str, int | None]] = {
    **{
        m: ("float32", 32 * PARAMS)
        for m in (
            *("fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "dcsgd", "diana", "vr_diana", "fedavg_prune"),
            "fedprox",
            *("fedshuffle", "fednova", "fedavg_epochs", "fedavg_min", "fedavg_mean"),
        )
    },
    "zampling": ("bitpack", N_ZAMPLING),  # one bit per trainable coordinate
    "local_zampling": ("float32", 32 * N_ZAMPLING),  # p itself
    "continuous_zampling": ("float32", 32 * N_ZAMPLING),
    "supermask": ("float32", 32 * PARAMS),  # n = m
    "fedpm": ("bitpack", PARAMS),
    **{m: ("eflops_gates", None) for m in ("eflops", "eflops_cnn")},  # index-coded support: data-dependent
    "fediht": ("sparse[float32]", None),
    **{m: ("float32", None) for m in ("fjord", "fjord_smallest", "efd")},  # one slice per tier
}
# Sub-model methods need hidden layers (ordered dropout has nothing to drop in logistic regression);
# their uploads are slices whose length depends on the client's tier.
SLICED = {"fjord": 4810, "fjord_smallest": 4810, "efd": 4810}  # digits_mlp parameters
# Configs that share another config's uplink code path (FjORD's, FedShuffleGen's, FedAvg's with another
# server optimiser) run only their distinct pairs in the default suite (own codec, a layer-wise
# operator, error feedback); their other pairs are marked slow.
SHARED_PATH = (
    "eflops_cnn",
    *("fjord_smallest", "efd"),
    *("fednova", "fedavg_epochs", "fedavg_min", "fedavg_mean"),
    *("fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedprox"),
)
FAST_PAIRS = {m: {"none", "natural", "top_k_ef"} for m in SHARED_PATH}
PAIRS = [
    pytest.param(m, c, id=f"{m}-{c}", marks=[pytest.mark.slow] if m in FAST_PAIRS and c not in FAST_PAIRS[m] else [])
    for m in METHODS
    for c in COMPRESSORS
]


def _uplink_rows(folder: Path) -> list[dict[str, str]]:
    with (folder / "comm_records.csv").open() as handle:
        return [row for row in csv.DictReader(handle) if row["direction"] == "up"]


def _method_payload(method: str) -> str:
    target = OmegaConf.load(CONFIGS / "method" / f"{method}.yaml").get("_target_")
    if target is None:  # a config that only overrides its defaults: resolve through the parent
        parent = OmegaConf.load(CONFIGS / "method" / f"{method}.yaml").defaults[0]
        return _method_payload(str(parent))
    return str(get_class(target).uplink_payload)


@pytest.mark.parametrize(("method", "compressor"), PAIRS)
def test_pair_trains_with_its_payloads_bits_or_is_refused_in_one_sentence(
    method: str, compressor: str, make_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    model = ["model=digits_mlp"] if method in SLICED else []
    cfg = make_config([*SMALL, *model, f"method={method}", f"compressor={compressor}"])
    operator = instantiate(cfg.compressor.compressor) if "compressor" in cfg.compressor else None
    dense_payload = _method_payload(method) in {str(p) for p in DENSE_UPDATES}
    # Refused: an operator on a payload it does not understand, and DIANA's biased operators.
    # eFD's random sub-models change every round, so no error-feedback memory can follow them.
    random_slices = method == "efd" and bool(cfg.compressor.get("error_feedback", False))
    # DCSGD's lr=auto has no step size for a biased operator without a finite δ on some tensor.
    no_step = (
        method == "dcsgd"
        and operator is not None
        and not operator.unbiased
        and any(math.isinf(operator.delta(size)) for size in DIGITS_LOGREG_TENSORS)
    )
    refused = operator is not None and (
        not dense_payload or (method in DIANA_FAMILY and not operator.unbiased) or random_slices or no_step
    )
    if refused:
        assert operator is not None
        with pytest.raises(ConfigError) as caught:
            run(cfg, tmp_path)
        sentence = str(caught.value)
        assert "\n" not in sentence and sentence.endswith("."), sentence
        assert operator.name.split("(")[0] in sentence, sentence
        assert not (tmp_path / "summary.json").exists()
        return
    summary = run(cfg, tmp_path)
    rows = _uplink_rows(tmp_path)
    assert rows and summary["comm/uplink_bits_total"] == sum(int(r["bits"]) for r in rows)
    if operator is None:  # the method's own codec wrote every upload
        codec, bits = OWN_CODEC[method]
        assert {r["codec"] for r in rows} == {codec}
        if bits is not None:
            assert {int(r["bits"]) for r in rows} == {bits}
        return
    assert all(r["codec"].startswith(operator.name) for r in rows), {r["codec"] for r in rows}
    if method in SLICED:  # a slice is at most the whole model
        assert all(0 < int(r["bits"]) < 32 * SLICED[method] + 4096 for r in rows)
        return
    if compressor in FIXED_LENGTH:
        assert {int(r["bits"]) for r in rows} == {FIXED_LENGTH[compressor]}
    assert all(0 < int(r["bits"]) < 32 * PARAMS + 4096 for r in rows)
