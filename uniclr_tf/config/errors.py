"""The errors the entry points tell apart by type.

:class:`UsageError` is a bad flag or value: the entry points print it as one line (``error: ...``)
and exit 1, with no traceback; any other ``ValueError`` is a bug and keeps its traceback. It
subclasses ``ValueError``, so code (and tests) that catch ``ValueError`` still catch it.
"""


class UsageError(ValueError):
    """A bad flag or value, named in the message (``--flag=value: expected ...``)."""
