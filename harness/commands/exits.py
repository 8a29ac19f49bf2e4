"""The exit codes of `lockstep` (docs/cli.md lists them): shared by every command and the entry point."""

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE, EXIT_MISSING, EXIT_INCOMPARABLE = 0, 1, 2, 3, 4
EXIT_STDOUT_CLOSED = 141  # 128 + SIGPIPE, what a Unix tool killed by a closed pipe reports
EXIT_INTERRUPTED = 130  # 128 + SIGINT
