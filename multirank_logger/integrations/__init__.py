"""Front-ends for trainers other than Lightning, over the same run as `MultiRankLogger`'s.

- plain.py: `init` and `Run`, for any torch.distributed script (torchrun, ``mp.spawn``, Slurm's
  ``srun``): a run for every rank, ``run.log(metrics, step)``, ``run.finish()``.

Each builds a `MultiRankLogger` (logger/) and calls its public methods, so every front-end gets
the same transports, the same watch on rank 0 and the same end (finalize) as Lightning's.
"""
