"""Errors the runtime raises: one class per status code, all under `Error`.

Like jaxlib's XlaRuntimeError, `Error` is a RuntimeError, so code that catches RuntimeError keeps
working. Each error has `code` (the status code's name, e.g. "RESOURCE_EXHAUSTED") and `message`
(what failed and where: run, program, node, device or host).

    try:
        y = f(x)
    except pathways.errors.ResourceExhausted as e:
        ...  # e.g. a device out of memory, or a controller limit (the message names it)
"""


class Error(RuntimeError):
    """A status from the pathways runtime other than OK."""

    code = "UNKNOWN"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class Cancelled(Error):
    code = "CANCELLED"


class Unknown(Error):
    code = "UNKNOWN"


class InvalidArgument(Error):
    code = "INVALID_ARGUMENT"


class DeadlineExceeded(Error):
    code = "DEADLINE_EXCEEDED"


class NotFound(Error):
    code = "NOT_FOUND"


class AlreadyExists(Error):
    code = "ALREADY_EXISTS"


class PermissionDenied(Error):
    code = "PERMISSION_DENIED"


class ResourceExhausted(Error):
    code = "RESOURCE_EXHAUSTED"


class FailedPrecondition(Error):
    code = "FAILED_PRECONDITION"


class Aborted(Error):
    code = "ABORTED"


class OutOfRange(Error):
    code = "OUT_OF_RANGE"


class Unimplemented(Error):
    code = "UNIMPLEMENTED"


class Internal(Error):
    code = "INTERNAL"


class Unavailable(Error):
    code = "UNAVAILABLE"


class DataLoss(Error):
    code = "DATA_LOSS"


class Unauthenticated(Error):
    code = "UNAUTHENTICATED"


# By absl::StatusCode (= grpc::StatusCode) value.
_BY_CODE = {1: Cancelled, 2: Unknown, 3: InvalidArgument, 4: DeadlineExceeded, 5: NotFound,
            6: AlreadyExists, 7: PermissionDenied, 8: ResourceExhausted, 9: FailedPrecondition,
            10: Aborted, 11: OutOfRange, 12: Unimplemented, 13: Internal, 14: Unavailable,
            15: DataLoss, 16: Unauthenticated}


def _for_code(code: int) -> type:
    """The class of status code `code` (the extension raises through this)."""
    return _BY_CODE.get(code, Unknown)


__all__ = ["Error"] + [c.__name__ for c in _BY_CODE.values()]
