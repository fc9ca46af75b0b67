"""The exceptions conflux raises. Each carries the Rust error's message and, where the error
blames a rank, that rank (global, as in the job) in ``.rank``."""


class ConfluxError(RuntimeError):
    """Any failure of a conflux call."""

    def __init__(self, message, rank=None):
        super().__init__(message)
        self.rank = rank


class InvalidArgument(ConfluxError, ValueError):
    """A wrong length, dtype, root, peer or option; no rank is to blame."""


class PeerError(ConfluxError):
    """Another rank died, closed its link or failed; ``.rank`` names it."""


class CommTimeout(PeerError, TimeoutError):
    """A deadline passed; ``.rank`` names a rank that never arrived (the message names all)."""


class MismatchError(ConfluxError):
    """Ranks made different calls where they must make the same one."""


class ClosedError(ConfluxError):
    """The communicator was shut down or aborted."""


__all__ = ["ConfluxError", "InvalidArgument", "PeerError", "CommTimeout", "MismatchError", "ClosedError"]
