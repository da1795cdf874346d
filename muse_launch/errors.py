"""The error family. The CLI maps each class to an exit code; none shows a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Something the user can fix; printed without a traceback."""

    exit_code = 1


class UsageError(UserError):
    """Bad command-line usage."""

    exit_code = 2


class TopologyError(UserError):
    """The topology file does not parse or does not fit the schema.

    Carries every problem found, each already formatted as `FILE:LINE: PATH: message`.
    """

    exit_code = 2

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class CheckFailed(UserError):
    """The file is well-formed but a check of SPEC section 3 failed."""

    exit_code = 1

    def __init__(self, report: str):
        super().__init__(report)


class RuntimeFailure(UserError):
    """A role failed to start, or a deployment could not be stopped cleanly."""

    exit_code = 1
