"""Errors that reach the user as one clear line and a documented exit code."""

from __future__ import annotations

# Exit codes shared by every command (documented in docs/reference/commands.md).
EXIT_OK = 0
EXIT_FAILED = 1  # the candidate is incorrect, or no correct kernel was found
EXIT_USAGE = 2  # bad input or configuration: missing file, broken problem, bad flag
EXIT_SHORT_OF_TARGET = 3  # `optimize`: correct, but short of the speed target
# `eval`: the problem is too large for this machine (status too_large: its inputs do not fit in
# memory, by an estimate made before anything is allocated). About the machine, not the candidate.
EXIT_TOO_LARGE = 4
# `optimize` (single, search, whole model) and `bench`'s agent mode: the model could not be reached
# or did not answer (its timeout and retries spent) and nothing was judged of a kernel it did not
# write: outcome `model_unavailable`. About the model server, never a candidate.
EXIT_MODEL_UNAVAILABLE = 5
# A bug in kernelagent itself (an exception nobody expected): one line on stderr and the path
# of a file holding the whole traceback. 70 is sysexits' EX_SOFTWARE.
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT), as a shell reports it


class UserError(Exception):
    """Bad input or configuration. The message is shown as is, on one line."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str = "", exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
