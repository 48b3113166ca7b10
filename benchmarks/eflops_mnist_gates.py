"""Per-layer diagnosis of E-FLoPS on the MNIST CNN: gates, weights, gradients, round by round.

    python benchmarks/eflops_mnist_gates.py [--rounds 3] [--clients 10] [--data-root /path/to/data]
        [--override method.log_alpha_init=3 ...]

Builds the module of ``+experiment=eflops_mnist_cnn method=eflops`` on the 10,000-image subset
(``data.max_train_samples=10000``) as ``fedlightning.run`` does (same seeds, same initial model)
and drives the rounds through the method's own hooks (``broadcast_state`` → ``client_update`` →
``GatedUploadSums`` → ``set_server_state``; the codec is lossless, so the decoded messages equal
these tensors). Before each round it checks that the model a client rebuilds from the broadcast
is the server's state on the support and probes that model on 256 images of client 0 (logits'
spread, data loss, ‖∂ℓ/∂θ‖ and ‖∂ℓ/∂log α‖ per tensor, one gate sample); after each round it
prints per tensor the gates with P(z ≠ 0) > 0.5, the mean |θ̃ E[z]| and largest |θ̃| among them
and their mean P(z ≠ 0); at the end the validation accuracy. Slow on a CPU (a round of 10
clients is about a minute on one core).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from eflops_common import REPO, compose_cfg
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch.func import functional_call

from fedlightning.federated.params import flat_parameters
from fedlightning.federated.rng import SERVER, stream_seed
from fedlightning.methods.eflops import EFLoPS, unpack_gate_state
from fedlightning.models import build_model
from fedlightning.models.hard_concrete import uniform_noise


def build(overrides: list[str]) -> EFLoPS:
    """The E-FLoPS module of the run ``overrides`` describe, built as ``fedlightning.run`` builds it."""
    cfg = compose_cfg(overrides)
    partition = instantiate(cfg.partition, _partial_=True)()
    dm = instantiate(cfg.data, _partial_=True)(partition=partition, seed=int(cfg.seed))
    dm.prepare_data()
    dm.setup("fit")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(stream_seed(seed=int(cfg.seed), round_idx=0, client_id=SERVER, purpose="model_init"))
        model_cfg = {str(k): v for k, v in dict(OmegaConf.to_container(cfg.model, resolve=True)).items()}  # type: ignore[arg-type]
        model = build_model(
            **model_cfg, input_shape=tuple(dm.input_shape), num_classes=dm.num_classes, data_name="mnist"
        )
    module = instantiate(cfg.method, _partial_=True)(model=model, datamodule=dm, seed=int(cfg.seed))
    assert isinstance(module, EFLoPS)
    return module


def probe(module: EFLoPS, theta: torch.Tensor, log_alpha: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> str:
    """Logits' sd, data loss and per-tensor gradient norms of the gated model (θ̃, log α), one gate sample."""
    sizes = [p.numel() for p in module.model.parameters()]
    names = [n for n, _ in module.model.named_parameters()]
    la, th = log_alpha.clone().requires_grad_(True), theta.clone().requires_grad_(True)
    z = module.hc.sample(la, uniform_noise((module.dim,), torch.Generator().manual_seed(1)))
    shapes = [p.shape for p in module.model.parameters()]
    weights = {n: t.view(s) for n, t, s in zip(names, (th * z).split(sizes), shapes, strict=True)}
    out = functional_call(module.model, weights, (x,))
    loss = module.loss_fn(out, y)
    loss.backward()
    assert th.grad is not None and la.grad is not None
    g_theta = " ".join(f"{float(g.norm()):.1e}" for g in th.grad.split(sizes))
    g_alpha = " ".join(f"{float(g.norm()):.1e}" for g in la.grad.split(sizes))
    return (
        f"  logits sd {float(out.detach().std()):.4f}, loss {float(loss.detach()):.4f}\n"
        f"  |grad theta| per tensor: {g_theta}\n  |grad log alpha| per tensor: {g_alpha}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--data-root", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--override", nargs="*", default=[])
    args = parser.parse_args()
    torch.set_num_threads(1)
    module = build(
        [
            "+experiment=eflops_mnist_cnn",
            "method=eflops",
            f"data.root={Path(args.data_root)}",
            "data.max_train_samples=10000",
            f"rounds={args.rounds}",
            *args.override,
        ]
    )
    names = [n for n, _ in module.model.named_parameters()]
    sizes = [p.numel() for p in module.model.parameters()]
    x, y = module.datamodule.client_tensors(0)
    for r in range(args.rounds):
        started = time.time()
        received = module.broadcast_state(r)
        theta_c, log_alpha_c, lam = module._rebuild_client(received, r)
        support = unpack_gate_state(received)[2]
        server_pi = module.hc.prob_nonzero(module.log_alpha.detach())
        same = torch.equal(theta_c[support], flat_parameters(module.model)[support])
        gap = float((module.hc.prob_nonzero(log_alpha_c)[support] - server_pi[support]).abs().max())
        print(
            f"round {r + 1}: support {int(support.sum())}; client theta == server theta on S: {same}; "
            f"max |pi_client - pi_server| on S {gap:.1e}; lambda {lam:.2f}"
        )
        print(probe(module, theta_c, log_alpha_c, x[:256], y[:256]))
        agg = module.make_aggregator(r)
        losses = []
        for k in range(min(args.clients, module.num_clients)):
            res = module.client_update(client_id=k, round_idx=r, received=received)
            agg.accumulate(res.upload, weight=res.num_samples)
            losses.append(float(res.loss))
        module.set_server_state(round_idx=r, aggregator=agg)
        theta = flat_parameters(module.model)
        pi = module.hc.prob_nonzero(module.log_alpha.detach())
        gate = module.hc.expected_gate_tail(module.log_alpha.detach(), nodes=32)
        print(
            f"  after round {r + 1}: clients' mean data loss {sum(losses) / len(losses):.4f}; "
            f"lambda {float(module.lagrange):.2f}; D {float(pi.mean()):.4f}; {time.time() - started:.0f} s"
        )
        for n, p, t, e in zip(names, pi.split(sizes), theta.split(sizes), gate.split(sizes), strict=True):
            open_ = p > 0.5
            if not open_.any():
                print(f"   {n:22s} no gate with P(z != 0) > 0.5 of {p.numel()}")
                continue
            print(
                f"   {n:22s} P(z != 0) > 0.5: {int(open_.sum()):7d} of {p.numel():7d}; on those: "
                f"mean |theta E[z]| {float((t * e).abs()[open_].mean()):.2e}, "
                f"max |theta| {float(t.abs()[open_].max()):.3f}, mean P(z != 0) {float(p[open_].mean()):.3f}"
            )
    module.eval()
    correct = total = 0
    with torch.no_grad():
        for xb, yb in module.datamodule.val_dataloader():
            correct += int((module(xb).argmax(1) == yb).sum())
            total += len(yb)
    print(f"validation accuracy {correct / total:.4f} ({total} images)")


if __name__ == "__main__":
    main()
