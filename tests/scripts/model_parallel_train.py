"""A Lightning training under ``ModelParallelStrategy`` (2 data-parallel x 2 tensor-parallel ranks,
gloo on CPU), launched by tests/runs/test_mesh_places.py as ``python tests/scripts/model_parallel_train.py --db DB
--transport T`` (Lightning starts the other three processes itself).

The strategy builds its device mesh after the logger registered each rank (Lightning touches
``logger.experiment`` in its set-up hook) and hands the module, mesh set, to ``log_graph``: each
rank's coordinates must still reach its ``ranks`` row. The linear layer is split column-wise over
the tensor-parallel dimension (the strategy refuses a model with nothing parallelized).
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from multirank_logger import MultiRankLogger


class TwoWay(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def configure_model(self) -> None:
        from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

        parallelize_module(self.layer, self.device_mesh["tensor_parallel"], ColwiseParallel())

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    # --db and --transport may repeat, paired in order: a logger each, one launch for every variant
    parser.add_argument("--db", required=True, action="append")
    parser.add_argument("--transport", action="append")
    args = parser.parse_args()
    data = torch.utils.data.TensorDataset(torch.randn(64, 4))
    trainer = L.Trainer(accelerator="cpu", devices=4, strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2),
                        max_steps=4, log_every_n_steps=1, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, logger=[MultiRankLogger(db=db, name="tp", transport=transport)
                                                for db, transport in zip(args.db, args.transport or ["auto"] * len(args.db), strict=True)])
    trainer.fit(TwoWay(), torch.utils.data.DataLoader(data, batch_size=4))


if __name__ == "__main__":
    main()
