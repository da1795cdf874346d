"""Defaults and limits of the topology's runtime keys, in a module without pydantic: the schema (model.py),
the
plan's value objects (plan/spec.py) and the runtime read them from here."""

RESET_AFTER = 300.0  # seconds of health after which a role's restart count starts again from 0
# A ready engine worker that gives no sign of life (stopped by SIGSTOP, or its /metrics unanswered) this
# long leaves every router that lists it; still silent at HUNG_AFTER it is stopped and restarted as hung. An
# engine's HTTP front answers /metrics during a long prefill (its scheduler is another process).
# Long enough that a healthy worker on a loaded host (its /metrics answered in seconds) is not taken out;
# SIGSTOP is seen at once, whatever these say.
UNRESPONSIVE_AFTER = 10.0
HUNG_AFTER = 60.0
# ...or it answers, holds running requests, and its token counters have not moved this long: a stuck
# collective or KV transfer. Long enough for the longest prefill chunk of a real model.
STALLED_AFTER = 120.0
LOG_MAX_SIZE_DEFAULT = 100 * 1024**2  # a role's log is rotated past this many bytes...
LOG_KEEP_DEFAULT = 2  # ...keeping this many rotated files: at most 300 MiB per role
LOG_MAX_KEEP = 100  # rotated files a role may keep: ROLE.log.1 .. ROLE.log.100

METRICS_PORT_OFFSET = (
    21000  # router on 8000 -> Prometheus on 29000, the routers' own default (engines/router.py)
)

# The longest a routed worker waits for its own requests in flight when it leaves (Kubernetes: its preStop
# hook, before the SIGTERM and the stop grace).
DRAIN = 120.0
MAX_GRACE = 3600.0  # seconds `down` waits for a role before SIGKILL; `.inf` would hang `down` forever
# Signals `down` may stop a role with: ones that end a process by default. SIGSTOP, SIGCONT, SIGCHLD and
# the handler constants SIG_DFL, SIG_IGN, SIG_BLOCK... are not signals that stop anything.
STOP_SIGNALS = (
    "SIGTERM",
    "SIGINT",
    "SIGQUIT",
    "SIGHUP",
    "SIGKILL",
    "SIGUSR1",
    "SIGUSR2",
    "SIGABRT",
    "SIGALRM",
    "SIGPIPE",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGVTALRM",
    "SIGPROF",
)
