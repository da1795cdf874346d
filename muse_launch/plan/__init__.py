"""The pure planning core: a checked Topology in, a Plan of frozen LaunchSpecs in waves out (no environment,
clock
or files); the rehearsal is a transformation of a Plan."""
