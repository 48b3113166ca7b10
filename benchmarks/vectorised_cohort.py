"""CPU seconds of one cohort's local work: the vectorised cohort against the sequential loop.

    python benchmarks/vectorised_cohort.py [--clients 50] [--samples 60] [--batch 10] [--momentum 0.0]

S2's shape by default (``mnistfc``, 50 clients of 60 samples, batch 10, 6 SGD steps each, the
share of one of two processes): ``loop`` trains the clients one after another with
``torch.optim.SGD`` (weights copied in, forward, backward, step), ``vectorised`` runs
``fedlightning.federated.local.vectorised.train_stacked`` on the same batches. Random inputs (the
cost does not depend on the values); medians over ``--repeats`` interleaved repetitions.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from fedlightning.federated.local.stacked_optim import StackedSGD
from fedlightning.federated.local.vectorised import plan_steps, train_stacked
from fedlightning.models import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model("mnistfc", input_shape=(1, 28, 28), num_classes=10)
    k, n = args.clients, args.samples
    x, y = torch.randn(k * n, 1, 28, 28), torch.randint(0, 10, (k * n,))
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    schedules = [list(torch.randperm(n).split(args.batch)) for _ in range(k)]
    plan = plan_steps(schedules, [c * n for c in range(k)], args.batch)

    def loop() -> None:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=args.momentum)
        for c in range(k):
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p.copy_(start[name])
            opt.state.clear()
            for idx in schedules[c]:
                opt.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(model(x[idx + c * n]), y[idx + c * n]).backward()
                opt.step()

    def vectorised() -> None:
        train_stacked(
            model=model,
            start=start,
            x=x,
            y=y,
            plan=plan,
            optimizer=StackedSGD(lr=0.05, momentum=args.momentum),
            task="classification",
            max_grad_norm=None,
        )

    arms = {"loop": loop, "vectorised": vectorised}
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.repeats):
        for name, arm in arms.items():
            began = time.process_time()
            arm()
            times[name].append(time.process_time() - began)
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, median in medians.items():
        print(f"{name:11s} {median:.3f} CPU s ({k} clients x {plan.index.shape[1]} steps)")
    print(f"vectorised / loop: {medians['vectorised'] / medians['loop']:.2f}")


if __name__ == "__main__":
    main()
