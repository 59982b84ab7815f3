"""Exit codes of the chaos commands, local and fleet alike."""
EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_ROLLBACK, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_QUARANTINED = 4      # recover: every good journal done, a bad one moved aside
EXIT_ALIVE = 5            # recover: a run is still alive; what it applied is its own to undo
