"""Errors raised by the tandem client."""


class TandemError(Exception):
    """An error from the coordinator, or from checking a request locally.

    ``message`` is the text to show a user: for a rejected job spec it is the
    coordinator's field-level message, e.g. ``invalid job spec:
    parallel.world_size must be >= 1 and <= 4096, got 0``. ``code`` is the
    ``grpc.StatusCode`` of the failed call (``None`` for errors found before
    any call). ``code_name`` is its name, e.g. ``"INVALID_ARGUMENT"``.
    """

    def __init__(self, message, code=None, address=None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.address = address

    @property
    def code_name(self):
        if self.code is None:
            return None
        return getattr(self.code, "name", str(self.code))

    def __str__(self):
        return self.message


class SpecError(TandemError, ValueError):
    """A job spec that cannot become a ``tandem.v1.JobSpec``: an unknown key,
    a value of the wrong type, unreadable YAML. ``path`` is the dotted key
    path (``"batch.seq_len"``), empty for the document as a whole."""

    def __init__(self, message, path="", source=None):
        text = message
        if source:
            text = "%s: %s" % (source, message)
        super().__init__(text)
        self.path = path
        self.source = source
