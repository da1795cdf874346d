import os
import sys

from .cli import main

rc = main()
# Everything is closed by now (sockets, temp dir); skip the interpreter's ~150 ms module
# teardown so SIGTERM-to-exit stays well under a second even on a busy 2-core host.
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except Exception:
        pass
os._exit(rc)
