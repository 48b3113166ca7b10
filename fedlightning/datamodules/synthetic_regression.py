"""Synthetic sparse linear regression with heterogeneous clients and a known true support.

Model (the E-FLoPS synthetic benchmark, arXiv 2607.00275; its exact generator is not
published, so this one is documented here): d features, a k-sparse coefficient vector β*
with support S drawn uniformly and entries ±U[0.5, 1.5] (random signs), and

    y = x·β* + ε,   ε ~ N(0, σ²),   σ² = Var(x·β*) / SNR.

Client c draws its features from N(μ_c, I_d) with μ_c ~ N(0, h² I_d) (``heterogeneity`` h;
h = 0 gives IID clients); the test and validation sets are drawn from the mixture of the
clients. The number of training samples is ``samples_per_parameter · |θ|`` with |θ| = d + 1
(a linear model with bias), so ``samples_per_parameter`` is the N/|θ| ratio of the paper:
≤ 0.1 is the data-poor regime. Clients get equal shares (±1). ``true_support`` (feature
indices of S) and ``true_coef`` are kept for support-recovery metrics.

Because the clients are defined by how their data is generated, the partitioner must be the
IID one (``partition=iid``); client skew comes from ``data.heterogeneity``.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch
from torch import Tensor

from fedlightning.datamodules.base import FederatedDataModule
from fedlightning.datamodules.partition import IIDPartition

__all__ = ["SyntheticRegressionDataModule", "make_sparse_regression"]

log = logging.getLogger(__name__)


def make_sparse_regression(
    *,
    num_features: int,
    sparsity: int,
    client_sizes: list[int],
    snr: float,
    heterogeneity: float,
    num_test: int,
    rng: np.random.Generator,
) -> dict[str, np.ndarray | list[np.ndarray] | float]:
    """Draw β*, per-client training data, and mixture test data (see module docstring).

    Returns:
        ``{"coef", "support", "clients_x", "clients_y", "test_x", "test_y", "noise_std"}``.
    """
    d, k = num_features, sparsity
    support = np.sort(rng.choice(d, size=k, replace=False))
    coef = np.zeros(d)
    coef[support] = rng.uniform(0.5, 1.5, size=k) * rng.choice([-1.0, 1.0], size=k)
    means = (
        rng.normal(0.0, heterogeneity, size=(len(client_sizes), d))
        if heterogeneity > 0
        else np.zeros((len(client_sizes), d))
    )
    signal_var = float(coef @ coef)  # Var(x·β*) for x ~ N(μ, I); the mean shift only moves E[y]
    noise_std = float(np.sqrt(signal_var / snr))
    xs, ys = [], []
    for c, n in enumerate(client_sizes):
        x = rng.normal(size=(n, d)) + means[c]
        xs.append(x)
        ys.append(x @ coef + rng.normal(0.0, noise_std, size=n))
    owner = rng.integers(len(client_sizes), size=num_test)
    test_x = rng.normal(size=(num_test, d)) + means[owner]
    test_y = test_x @ coef + rng.normal(0.0, noise_std, size=num_test)
    return {
        "coef": coef,
        "support": support,
        "clients_x": xs,
        "clients_y": ys,
        "test_x": test_x,
        "test_y": test_y,
        "noise_std": noise_std,
    }


class SyntheticRegressionDataModule(FederatedDataModule):
    """k-sparse linear regression, N/|θ| from data-poor to data-rich, heterogeneous clients.

    Args:
        num_features: d (``data.num_features``).
        sparsity: k, non-zeros of β* (``data.sparsity``).
        samples_per_parameter: N/|θ| with |θ| = d + 1 (``data.samples_per_parameter``).
        snr: signal-to-noise ratio Var(x·β*)/σ².
        heterogeneity: h, the spread of the client feature means.
        num_test: test samples (validation gets ``val_fraction · num_test`` more).
        **kwargs: :class:`FederatedDataModule` arguments (``num_clients``, ``seed``, ...).
    """

    name = "synthetic_regression"
    task = "regression"
    num_classes = 1

    def __init__(
        self,
        *,
        num_features: int = 500,
        sparsity: int = 10,
        samples_per_parameter: float = 0.1,
        snr: float = 10.0,
        heterogeneity: float = 0.5,
        num_test: int = 2000,
        **kwargs: object,
    ) -> None:
        partition = kwargs.get("partition")
        if partition is not None and not isinstance(partition, IIDPartition):
            raise ValueError(
                "data=synthetic_regression defines its clients by generation; use partition=iid and set "
                "data.heterogeneity for client skew."
            )
        if kwargs.get("partition_file"):
            raise ValueError(
                "data=synthetic_regression generates its clients from data.seed, so there is no saved split to "
                "reuse; unset data.partition_file."
            )
        if not 0 < sparsity <= num_features:
            raise ValueError(f"data.sparsity must be in [1, data.num_features] (got {sparsity}).")
        if not (samples_per_parameter > 0 and snr > 0 and num_test >= 1):  # written so that nan fails
            raise ValueError("data.samples_per_parameter and data.snr must be > 0 and data.num_test >= 1.")
        if not 0 <= heterogeneity < math.inf:
            raise ValueError(
                f"data.heterogeneity must be a finite number >= 0 (got {heterogeneity}): it is the spread of the "
                "client feature means, and an infinite one makes the features and targets infinite."
            )
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.num_features = int(num_features)
        self.sparsity = int(sparsity)
        self.samples_per_parameter = float(samples_per_parameter)
        self.snr = float(snr)
        self.heterogeneity = float(heterogeneity)
        self.num_test = int(num_test)
        self.input_shape = (self.num_features,)
        self.num_train = max(self.num_clients, round(self.samples_per_parameter * (self.num_features + 1)))
        self.true_support: Tensor | None = None
        self.true_coef: Tensor | None = None

    def setup(self, stage: str | None = None) -> None:
        """Generate the data once (deterministic in ``seed``); clients are the generating groups."""
        if self._train is not None:
            return
        rng = np.random.default_rng([self.seed, 7])
        sizes = [
            self.num_train // self.num_clients + (c < self.num_train % self.num_clients)
            for c in range(self.num_clients)
        ]
        n_val = round(self.val_fraction * self.num_test)
        data = make_sparse_regression(
            num_features=self.num_features,
            sparsity=self.sparsity,
            client_sizes=sizes,
            snr=self.snr,
            heterogeneity=self.heterogeneity,
            num_test=self.num_test + n_val,
            rng=rng,
        )
        f32 = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))  # noqa: E731
        with np.errstate(over="ignore"):  # a value beyond float32 is refused just below, in one sentence
            x = f32(np.concatenate(data["clients_x"]))  # type: ignore[arg-type]
            y = f32(np.concatenate(data["clients_y"]))  # type: ignore[arg-type]
            tx, ty = f32(data["test_x"]), f32(data["test_y"])
        settings = "data.heterogeneity and data.snr (extreme values overflow float32)"
        self.refuse_nonfinite(settings, training_features=x, training_targets=y, test_features=tx, test_targets=ty)
        self._test = (tx[n_val:].contiguous(), ty[n_val:].contiguous())
        self._val = (tx[:n_val].contiguous(), ty[:n_val].contiguous()) if n_val else None
        offsets = np.cumsum([0, *sizes])
        self._parts = [np.arange(offsets[c], offsets[c + 1], dtype=np.int64) for c in range(self.num_clients)]
        self._check_partition(len(y))
        # Generated, not loaded: the data set's own indices are the training rows; validation
        # comes from the generated test pool, not from the training split.
        self.train_index = self.train_dataset_index = np.arange(len(y), dtype=np.int64)
        self.val_dataset_index = np.empty(0, dtype=np.int64)
        self._num_dataset_samples = len(y)
        self._train = (x, y)
        self.true_support = torch.from_numpy(np.asarray(data["support"], dtype=np.int64))
        self.true_coef = f32(data["coef"])
        log.info(
            "synthetic_regression: d=%d, k=%d, N=%d (N/|theta| = %.3g), %d clients, h=%g, SNR=%g",
            self.num_features,
            self.sparsity,
            self.num_train,
            self.num_train / (self.num_features + 1),
            self.num_clients,
            self.heterogeneity,
            self.snr,
        )
