"""Plain PyTorch FedAvg loop: the reference a framework's overhead is measured against.

One reused ``nn.Module``: the global weights are copied in for every client, the client's result is
summed in place into preallocated buffers, ``torch.optim.SGD`` without momentum, FedAvg weighted by
examples, then one central evaluation on the test set per round.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from args import cohort, parse
from common import Clock, evaluate, iid_clients, load_mnist, mlp, one_thread, shuffle_seed


def main() -> None:
    a = parse()
    one_thread()
    clock = Clock()
    x, y, xt, yt = load_mnist(a.root)
    parts = iid_clients(len(y), a.clients, a.per_client, a.seed)
    model = mlp(a.seed)
    params = list(model.parameters())
    global_w = [p.detach().clone() for p in params]
    acc_w = [torch.zeros_like(p) for p in params]
    loss_fn = torch.nn.CrossEntropyLoss()
    for rnd in range(1, a.rounds + 1):
        clock.first_round()
        for buf in acc_w:
            buf.zero_()
        total = 0
        for cid in cohort(rnd, a.clients, a.per_round, a.seed):
            with torch.no_grad():
                for p, g in zip(params, global_w, strict=True):
                    p.copy_(g)
            opt = torch.optim.SGD(params, lr=a.lr)
            idx = parts[cid]
            order = idx[torch.randperm(len(idx), generator=torch.Generator().manual_seed(shuffle_seed(rnd, cid)))]
            for start in range(0, len(order), a.batch):
                b = order[start : start + a.batch]
                opt.zero_grad(set_to_none=True)
                loss_fn(model(x[b]), y[b]).backward()
                opt.step()
            with torch.no_grad():
                for buf, p in zip(acc_w, params, strict=True):
                    buf.add_(p, alpha=len(idx))
            total += len(idx)
        with torch.no_grad():
            for g, buf, p in zip(global_w, acc_w, params, strict=True):
                g.copy_(buf / total)
                p.copy_(g)
        clock.evaluated(evaluate(model, xt, yt))
    clock.emit()


if __name__ == "__main__":
    main()
