"""Signal dispositions a muse-launch process inherits, put back to what its commands rely on.

A process may be started with signals ignored or blocked: a shell's `cmd &` starts it with SIGINT
and SIGQUIT ignored, and a parent that ignored or blocked a signal passes that on through fork and
exec. Python then leaves SIGINT ignored (it installs its KeyboardInterrupt handler only where SIGINT
is at its default), so Ctrl-C would not stop `logs -f` or a foreground `up`; and whatever runs under
it (the supervisor, each role) would inherit the same, so a role would ignore the stop signal `down`
sends it. Every muse-launch process therefore starts from: no signal blocked, SIGINT raising
KeyboardInterrupt, and the other stop signals at their defaults.

SIGHUP is left as it came: `nohup muse-launch ...` ignores it on purpose (a foreground `up` catches it
anyway: a closed terminal stops the deployment). SIGPIPE and SIGXFSZ are Python's own (ignored by the
interpreter, put back to their defaults for every child by subprocess).
"""

from __future__ import annotations

import signal

# The signals a role's stop signal can be (topology/model.py STOP_SIGNALS) but SIGINT (above), SIGHUP
# (nohup), SIGKILL (never ignored), SIGPIPE and SIGXFSZ (Python's own).
RESET_TO_DEFAULT = (
    "SIGTERM",
    "SIGQUIT",
    "SIGUSR1",
    "SIGUSR2",
    "SIGABRT",
    "SIGALRM",
    "SIGXCPU",
    "SIGVTALRM",
    "SIGPROF",
)


def reset_inherited() -> list[str]:
    """Unblock every signal and restore the stop signals ignored on the way in; the names restored."""
    restored = []
    if signal.pthread_sigmask(signal.SIG_SETMASK, ()):
        restored.append("mask")
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        restored.append("SIGINT")
    for name in RESET_TO_DEFAULT:
        number = getattr(signal, name, None)
        if number is not None and signal.getsignal(number) is signal.SIG_IGN:
            signal.signal(number, signal.SIG_DFL)
            restored.append(name)
    return restored
