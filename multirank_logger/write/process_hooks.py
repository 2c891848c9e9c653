"""Process-wide hooks: SIGTERM, the wakeup-fd listener, the exit flush, fork.

Everything here is per process, not per logger: one SIGTERM handler, one listener thread,
one atexit flush, whatever number of writers are alive. Writers register while their
thread runs (`register`/`unregister`); nothing here knows about SQL or sinks.

SIGTERM (a scheduler's preemption) goes through two doors:

- the wakeup fd: the C-level signal handler writes the signal number into our pipe, so
  the *listener thread* wakes even while the main thread is blocked in a collective (a
  Python handler only runs once the main thread is back in bytecode). The listener does the
  I/O: it flushes every live writer, then keeps their threads draining.
- our Python handler (`_on_sigterm`), outermost on the main thread: it does no I/O. It
  wakes the listener (when the wakeup fd is not ours), waits a bounded time for the
  listener's flush, then chains to the handler that was there before it, once per process.
  It waits only a moment while the main thread is inside a logger's set-up (`guard_setup`):
  the flush may need the set-up's lock, which the interrupted frame holds, so the handler
  must return for the set-up to finish; it never runs set-up code itself (no re-entry).

Lightning's SIGTERM handler broadcasts from inside the signal handler. When every process
of a job is signalled (a scheduler's ``kill -TERM -PGID``), each rank's handler runs at
whatever point its main thread was, for instance rank 0 right after it queued the barrier
of a ``sync_dist`` reduction and rank 1 in its data loader: rank 1's broadcast then pairs
with rank 0's barrier and both ranks wait forever (issue 13 item 5, reproduced: 1 launch in
3 to 8 hung). Lightning's training loop already broadcasts the SIGTERM flag at every batch,
in lockstep, from a safe point. So we do what Lightning's handler does without its
broadcast: signal the launcher's children at once, as it does, before our wait; then, once
the flush is over, log and set ``received_sigterm`` (`_chain`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

from multirank_logger._util.exit_logging import quiet_logging_errors

__all__ = [
    "EXIT_FLUSH_TIMEOUT",
    "after_fork_in_child",
    "before_fork",
    "flush_all",
    "flush_at_exit",
    "guard_setup",
    "outermost_sigterm",
    "register",
    "release_sigterm",
    "sigterm_received",
    "unregister",
]

log = logging.getLogger(__name__)

#: how long SIGTERM and atexit may spend flushing each writer
EXIT_FLUSH_TIMEOUT = 20.0
#: how long the SIGTERM handler waits for the listener's flush before chaining anyway
HANDLER_WAIT_S = 30.0
#: the same while the interrupted frame is inside a set-up (the flush may need its lock)
SETUP_WAIT_S = 1.0
#: seconds between a writer's cycles once SIGTERM arrived
_HURRY_INTERVAL = 0.1


class Flushable(Protocol):
    """What the hooks need from a writer (writer.BackgroundWriter)."""

    flush_interval: float

    def stop(self, timeout: float = ...) -> None: ...

    def flush(self, timeout: float = ...) -> bool: ...

    def report_unwritten(self, at_exit: bool = ...) -> None: ...

    def wake(self) -> None: ...


#: set when this process received SIGTERM (the logger reports the run as interrupted)
sigterm_received = threading.Event()

_WRITERS: weakref.WeakSet[Any] = weakref.WeakSet()
_SETUP_LOCKS: weakref.WeakSet[Any] = weakref.WeakSet()
_UNSET: Any = object()


class _State:
    """What one process holds; rebuilt in a forked child (nothing of it is the child's)."""

    def __init__(self) -> None:
        self.atexit_registered = False
        self.listener: threading.Thread | None = None
        self.pipe: tuple[int, int] | None = None  # (read, write) of the listener's pipe
        self.wakeup_fd_ours = False  # the C handler writes into our pipe
        self.previous: Any = _UNSET  # the handler ours replaced (what we chain to)
        self.base: Any = _UNSET  # the handler before our first install (restored at release)
        self.chained = False  # one preemption, one chain (see _on_sigterm)
        self.forward_lock = threading.Lock()  # taken by the one forward to the launched ranks
        self.flush_lock = threading.Lock()  # taken by the one flush a SIGTERM triggers
        self.flushed = threading.Event()  # set when that flush is over


_state = _State()


# -- writers and exit flush ---------------------------------------------------------------


def register(writer: Flushable) -> None:
    """A writer's thread started: flush it on SIGTERM and at exit."""
    _WRITERS.add(writer)
    io_lock = getattr(writer, "_io_lock", None)
    if io_lock is not None:  # SIGTERM inside `finalize`'s flush: the listener's flush needs this lock
        guard_setup(io_lock)
    if not _state.atexit_registered:
        _state.atexit_registered = True
        atexit.register(quiet_logging_errors(flush_all))  # the streams may be closed by then
    outermost_sigterm()
    _start_listener()


def unregister(writer: Flushable) -> None:
    _WRITERS.discard(writer)


def flush_at_exit(writer: Flushable) -> None:
    """A writer whose thread ended with rows the store refused: the exit flush tries again."""
    _WRITERS.add(writer)


def guard_setup(lock: Any) -> None:
    """Register a lock (an RLock) that a flush needs: a logger's set-up lock, a writer's I/O lock.
    While the interrupted thread holds one, the SIGTERM handler must not wait for the listener's
    flush, which would wait for the lock the interrupted frame holds (until the bound)."""
    _SETUP_LOCKS.add(lock)


def flush_all(at_exit: bool = True) -> None:
    """Flush every live writer of this process (each for EXIT_FLUSH_TIMEOUT at most).

    At exit, each writer's thread is stopped first (its cycle waited for, bounded) and the last
    flush runs here: a daemon thread still inside a driver's C++ call (a DuckDB write, a TCPStore
    `add`) when the interpreter tears down is ended by it as it takes the GIL back, and the
    unwinding through that call's frames aborts the process ("terminate called without an active
    exception", exit 134: a Fabric script without `finalize`, 1 exit in 3)."""
    for writer in list(_WRITERS):
        try:
            if at_exit:
                writer.stop(EXIT_FLUSH_TIMEOUT)
            if not writer.flush(EXIT_FLUSH_TIMEOUT):
                writer.report_unwritten(at_exit)
        except Exception:
            log.exception("multirank_logger: the flush at exit or SIGTERM failed")


def _flush_for_sigterm() -> None:
    """In the listener thread, once per process: flush every writer, then keep them draining."""
    sigterm_received.set()
    if not _state.flush_lock.acquire(blocking=False):
        return  # done, or being done
    try:
        flush_all(at_exit=False)
        for writer in list(_WRITERS):
            # the process may now wait in Lightning's loop until the scheduler's SIGKILL: keep
            # the threads draining meanwhile (rank 0 takes in the rows the others just shipped)
            writer.flush_interval = min(writer.flush_interval, _HURRY_INTERVAL)
            writer.wake()
    finally:
        _state.flushed.set()


# -- the listener thread -------------------------------------------------------------------


def _start_listener() -> None:
    """One thread per process that reads our pipe: a SIGTERM byte means flush."""
    if _state.listener is not None and _state.listener.is_alive():
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    _state.pipe = (read_fd, write_fd)
    _state.wakeup_fd_ours = False
    if threading.current_thread() is threading.main_thread():
        try:
            previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
            if previous != -1:  # someone else (an asyncio loop) owns it: give it back
                signal.set_wakeup_fd(previous)
            else:
                _state.wakeup_fd_ours = True
        except (ValueError, OSError):
            pass
    _state.listener = _SignalListener(read_fd)
    _state.listener.start()


#: the byte `_SignalListener.stop` writes into the pipe: no signal has number 0
_STOP_BYTE = 0


class _SignalListener(threading.Thread):
    """The SIGTERM listener, with the ``stop()`` that test harnesses call on the daemon threads a
    test leaves (Lightning's conftest, and the many copied from it). The next writer to start
    starts a new one."""

    def __init__(self, read_fd: int) -> None:
        super().__init__(target=_listen, args=(read_fd,), name="multirank-sigterm-listener", daemon=True)

    def stop(self, timeout: float = EXIT_FLUSH_TIMEOUT) -> None:
        """Flush every live writer, then end the thread and close its pipe."""
        for writer in list(_WRITERS):
            try:
                writer.flush(timeout)
            except Exception:
                log.exception("multirank_logger: flushing a writer failed")
        state = _state
        if state.listener is not self or state.pipe is None:
            return
        read_fd, write_fd = state.pipe
        close = True
        if state.wakeup_fd_ours:
            try:
                signal.set_wakeup_fd(-1)  # the C handler must not write into a closed pipe
            except (ValueError, OSError):  # not the main thread: the pipe stays open (no fd reused under it)
                close = False
        with contextlib.suppress(OSError):
            os.write(write_fd, bytes([_STOP_BYTE]))
        self.join(timeout)
        state.listener, state.pipe, state.wakeup_fd_ours = None, None, False
        for fd in (read_fd, write_fd) if close else ():
            with contextlib.suppress(OSError):
                os.close(fd)


def _listen(read_fd: int) -> None:
    while True:
        try:
            data = os.read(read_fd, 512)
        except OSError:
            return
        if not data:
            return
        if signal.SIGTERM in data:
            _forward_once(signal.SIGTERM)
            _flush_for_sigterm()
        if _STOP_BYTE in data:
            return


def _wake_listener() -> None:
    pipe = _state.pipe
    if pipe is None or _state.wakeup_fd_ours:
        return  # the C handler wrote the signal number already
    try:
        os.write(pipe[1], bytes([signal.SIGTERM]))
    except OSError:  # full pipe: the listener has a SIGTERM byte to read already
        pass


# -- the SIGTERM handler ------------------------------------------------------------------


def outermost_sigterm() -> None:
    """Make our SIGTERM handler the outermost one, chaining to whatever was there.

    Lightning's handler (installed when fit starts) must run after our flush started. Call
    from the main thread; elsewhere this does nothing (only the main thread sets handlers).
    """
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        current = signal.getsignal(signal.SIGTERM)
        if current is _on_sigterm:
            return
        if _state.base is _UNSET:
            _state.base = current
        _state.previous = current
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # embedded interpreters, restricted environments
        pass


def release_sigterm() -> None:
    """At a logger's `finalize`: once no writer needs our handler, put back the one from before.

    A handler installed on top of ours since (by someone else) stays; we then only stop
    chaining to what was between (Lightning's handler is gone with its fit).
    """
    if _state.base is _UNSET or any(getattr(w, "running", False) for w in list(_WRITERS)):
        return
    _state.previous = _state.base
    _state.chained = False
    _state.forward_lock = threading.Lock()
    if threading.current_thread() is threading.main_thread():
        try:
            if signal.getsignal(signal.SIGTERM) is _on_sigterm:
                signal.signal(signal.SIGTERM, _state.base)
                _state.base = _UNSET
        except (ValueError, OSError):
            pass


def _setup_in_progress() -> bool:
    for lock in list(_SETUP_LOCKS):
        try:
            if lock._is_owned():  # RLock: held by this (the interrupted) thread
                return True
        except AttributeError:
            continue
    return False


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """No I/O here: wake the listener, wait (bounded) for its flush, then chain, once per process.

    A scheduler signals every process of the job, and Lightning's launcher forwards the signal
    to its children, so one preemption arrives twice in ranks > 0: one preemption, one chain.
    """
    sigterm_received.set()
    if _state.chained:
        return
    _state.chained = True
    _forward_once(signum)  # the listener did, unless the wakeup fd is not ours
    _wake_listener()
    listener = _state.listener
    if _WRITERS and listener is not None and listener.is_alive():  # stopped: no flush to wait for
        _state.flushed.wait(SETUP_WAIT_S if _setup_in_progress() else HANDLER_WAIT_S)
    _chain(_state.previous, signum, frame)


def _chain(previous: Any, signum: int, frame: FrameType | None) -> None:
    """Do what SIGTERM would have done without us (Lightning's handler without its broadcast)."""
    if previous is _UNSET or previous is None or previous == signal.SIG_DFL:
        # default action: terminate, as if we had never been installed
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)
        return
    if previous == signal.SIG_IGN:
        return
    for handler in _handlers_in(previous):
        if _is_lightning_notifier(handler):
            _lightning_notify(handler.__self__, signum)
        elif callable(handler):
            handler(signum, frame)


def _handlers_in(previous: Any) -> list[Any]:
    """The handlers `previous` runs: Lightning's _HandlersCompose holds several (or signal numbers)."""
    handlers = getattr(previous, "signal_handlers", None)
    if not isinstance(handlers, list):
        return [previous]
    return [signal.getsignal(h) if isinstance(h, int) else h for h in handlers]


def _is_lightning_notifier(handler: Any) -> bool:
    owner = getattr(handler, "__self__", None)
    return getattr(handler, "__name__", "") == "_sigterm_notifier_fn" and hasattr(owner, "received_sigterm")


def _lightning_connectors(previous: Any) -> list[Any]:
    """Lightning's signal connectors among the handlers we chain to."""
    if previous is _UNSET or previous is None or previous in (signal.SIG_DFL, signal.SIG_IGN):
        return []
    return [h.__self__ for h in _handlers_in(previous) if _is_lightning_notifier(h)]


def _forward_once(signum: int) -> None:
    """What Lightning's notifier does first: signal the ranks its launcher started. At once, from
    the listener (the main thread may be blocked in a collective) or our handler, whichever comes
    first; never after our wait. A rank that ended meanwhile (its own SIGTERM, its finalize,
    Lightning's teardown back to SIG_DFL) dies of a late forward (-15), and Lightning's child
    observer then SIGKILLs rank 0 before it records the run's end: it stayed "running"."""
    if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        return  # not our chain: Lightning's handler, if it is there, forwards itself
    if not _state.forward_lock.acquire(blocking=False):
        return  # done, or being done
    for connector in _lightning_connectors(_state.previous):
        if not connector.received_sigterm:
            launcher = getattr(connector.trainer.strategy, "launcher", None)
            if launcher is not None:
                launcher.kill(signum)


def _lightning_notify(connector: Any, signum: int) -> None:
    """The rest of `_SignalConnector._sigterm_notifier_fn` (`_on_sigterm` forwarded the signal
    already), minus its `dist.broadcast`: the training loop broadcasts ``received_sigterm`` at
    every batch from a point all ranks reach in order."""
    trainer = connector.trainer
    log.info("[rank: %s] Received SIGTERM: %s", getattr(trainer, "local_rank", "?"), signum)
    connector.received_sigterm = True


# -- fork ---------------------------------------------------------------------------------

_AFTER_FORK: list[Callable[[], None]] = []
_BEFORE_FORK: list[Callable[[], None]] = []


def before_fork(fn: Callable[[], None]) -> None:
    """Run `fn` in the parent, on the forking thread, before each fork (its errors are logged)."""
    _BEFORE_FORK.append(fn)


def _before_fork() -> None:
    for fn in _BEFORE_FORK:
        try:
            fn()
        except Exception:
            log.exception("multirank_logger: preparing for a fork failed")


def after_fork_in_child(fn: Callable[[], None]) -> None:
    """Run `fn` in a forked child, after the hooks reset themselves."""
    _AFTER_FORK.append(fn)


def _reset_in_child() -> None:
    """A forked child (ddp_notebook) inherits the parent's writers, pipe and wakeup fd, but none
    of its threads: locks held by those threads stay held forever. Start from nothing; the
    child's own writers register again when their threads start."""
    global _state
    old = _state
    _state = _State()
    _state.atexit_registered = old.atexit_registered  # atexit callbacks survive a fork
    _WRITERS.clear()  # the parent's: flushing them here would write the parent's rows twice
    _SETUP_LOCKS.clear()  # the parent's, possibly held forever; the child's loggers register anew
    sigterm_received.clear()
    if old.wakeup_fd_ours and threading.current_thread() is threading.main_thread():
        try:
            signal.set_wakeup_fd(-1)  # else our SIGTERMs would wake the parent's listener
        except (ValueError, OSError):
            pass
    if old.pipe is not None:
        for fd in old.pipe:
            try:
                os.close(fd)
            except OSError:
                pass
    if threading.current_thread() is threading.main_thread():
        try:
            if signal.getsignal(signal.SIGTERM) is _on_sigterm:
                _state.base = old.base  # keep chaining where the parent's handler did
                _state.previous = old.previous
        except (ValueError, OSError):
            pass
    for fn in _AFTER_FORK:
        try:
            fn()
        except Exception:
            log.exception("multirank_logger: resetting after fork failed")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_reset_in_child)
