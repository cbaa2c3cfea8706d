"""The project's user-facing error.

A user's mistake (bad file, missing input, wrong dtype, unknown option value) raises
GraphAuditError with a message that says what was expected and what was found. The CLI
prints it as one line and exits with `exit_code` (1, or 2 for bad usage). Anything else is
a bug and may show its traceback.
"""


class GraphAuditError(Exception):
    """A problem with what the user gave graphaudit, not a bug in graphaudit."""

    exit_code = 1

    def __init__(self, message: str, *, exit_code: int | None = None):
        super().__init__(" ".join(str(message).split()))
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(GraphAuditError):
    """Options that do not make sense together or name things that do not exist."""

    exit_code = 2


def brief(err: BaseException, limit: int = 300) -> str:
    """`err`'s message on one line, cut to `limit` characters: for quoting a library's objection."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
