"""How SIGTERM and SIGINT are read, by a training process (:class:`uniclr_tf.training.backup.Interrupts`) and by
the launcher (:class:`uniclr_tf.training.launch.Job`), which must not import Keras.

The first signal asks to stop at a step boundary with a backup. A SIGINT more than :data:`REPEAT_S`
after it is a second Ctrl-C: stop at once. Anything else, a SIGINT sooner or a SIGTERM at any time, is
the first signal delivered again (``timeout`` and schedulers send theirs to the process and to its
process group) and changes nothing.
"""

import signal
import time

#: A SIGINT this long after the first signal is a second Ctrl-C; sooner, it is the first one again.
REPEAT_S = 0.1


class FirstSignal:
    """The first stop signal (``signum``) and its ``time.monotonic()`` (``at``); both None before it."""

    def __init__(self):
        self.signum = self.at = None

    def receive(self, signum):
        """``"first"`` for the first signal, ``"again"`` for a second Ctrl-C, None for a repeat."""
        now = time.monotonic()
        if self.signum is None:
            self.signum, self.at = signum, now
            return "first"
        if signum == signal.SIGINT and now - self.at > REPEAT_S:
            return "again"
        return None
