import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import multirank_logger


def main():
    launched = dist.is_torchelastic_launched()  # started by torchrun
    if launched:
        dist.init_process_group("gloo")  # "nccl" on GPUs
    rank = dist.get_rank() if launched else 0
    model = torch.nn.Linear(8, 1)
    if launched:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(rank)  # each rank its own shard

    with multirank_logger.init(db="runs.sqlite", name="plain", config={"lr": 0.05}) as run:
        for step in range(20):
            x = torch.randn(32, 8, generator=data)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            run.log({"train_loss": loss.item()}, step=step)  # this rank's own loss


if __name__ == "__main__":
    main()
