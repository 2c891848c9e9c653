"""One process logging through MultiRankLogger while the test makes the store fail (tests/runs/test_faults.py).

Logs ``--calls`` calls of ``--keys`` keys (value = seq * keys + k), in two halves: between them
it writes the first half through, touches ``--ready``, waits for ``--go`` (the test has started
its fault by then), and can delete the store itself (``--delete``). Then it finalizes.

``--interrupt-flush``: the writer thread is never woken (the main thread writes), and after the
second half the script prints FLUSHING and flushes (``experiment.save()``), which the test
interrupts with SIGINT: INTERRUPTED says the KeyboardInterrupt reached the caller.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from multirank_logger import MultiRankLogger
from tests.helpers.internals import writer_of


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--spill-dir", required=True)
    p.add_argument("--calls", type=int, default=2_000)
    p.add_argument("--keys", type=int, default=10)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--max-held", type=int, default=None)
    p.add_argument("--ready", default=None)
    p.add_argument("--go", default=None)
    p.add_argument("--delete", action="store_true")
    p.add_argument("--status", default="success")
    p.add_argument("--save-dir", default=None, help="where metrics.csv goes (default: the store's directory)")
    p.add_argument("--version", type=int, default=None, help="an existing run's version: this launch resumes it")
    p.add_argument("--finalize-timeout", type=float, default=None)
    p.add_argument("--interrupt-flush", action="store_true")
    p.add_argument("--no-finalize", action="store_true", help="end the script without finalize: the exit hooks end the run")
    p.add_argument("--exit-flush-timeout", type=float, default=None, help="process_hooks.EXIT_FLUSH_TIMEOUT (20 s)")
    args = p.parse_args()
    if args.exit_flush_timeout is not None:
        from multirank_logger.write import process_hooks

        process_hooks.EXIT_FLUSH_TIMEOUT = args.exit_flush_timeout  # read at exit: the bound under test, shorter

    quiet = args.interrupt_flush  # the writer thread never wakes on its own: the flushes are the main thread's
    logger = MultiRankLogger(args.save_dir, version=args.version, db=args.db, spill_dir=args.spill_dir,
                             timeout=args.timeout, flush_interval=1e6 if quiet else 0.2,
                             flush_logs_every_n_steps=10**9 if quiet else 100,
                             **({"finalize_timeout": args.finalize_timeout} if args.finalize_timeout else {}))
    if args.max_held is not None:
        writer_of(logger).max_held_values = args.max_held
    keys = [f"k{k}" for k in range(args.keys)]
    half = args.calls // 2
    for seq in range(args.calls):
        logger.log_metrics({key: float(seq * args.keys + k) for k, key in enumerate(keys)}, step=seq)
        logger.save()
        if seq == half - 1 and (args.ready or args.delete):
            # the first half stored before the test's fault (a full disk needs no such point: it
            # fills as the run goes, and waiting here on it would only burn the 30 s)
            written = logger.flush(30) if not quiet else logger.experiment.save() or True
            assert written, "the first half was not written before the fault"
            if args.delete:
                for suffix in ("", "-wal", "-shm", ".wal"):
                    if os.path.exists(args.db + suffix):
                        os.remove(args.db + suffix)
            if args.ready:
                Path(args.ready).touch()
            deadline = time.monotonic() + 60
            while args.go and not os.path.exists(args.go) and time.monotonic() < deadline:
                time.sleep(0.01)
        if seq % 500 == 0 and not quiet:
            time.sleep(0.05)  # let the writer meet the fault during training, not only at the end
    if args.interrupt_flush:
        print("FLUSHING", flush=True)
        try:
            logger.experiment.save()
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
    if args.no_finalize:
        print("EXITING", flush=True)
        return
    logger.finalize(args.status)
    print("FINALIZED", flush=True)


if __name__ == "__main__":
    main()
