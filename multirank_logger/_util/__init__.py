"""Small helpers several layers share: best-effort calls, the launch's rank and world size,
atomic file replacement, quiet logging at exit, the torch version check. Imports nothing of the package
but errors."""
