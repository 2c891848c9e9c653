"""The Lightning front-end (MultiRankLogger) and what one rank does behind it: the buffer, the writer
thread, the sinks, finalize, the process-wide hooks (SIGTERM, exit, fork), CSVLogger's files."""
