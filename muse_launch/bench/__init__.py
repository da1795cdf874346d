"""`bench`, `bench compare` and `sweep`: measure a deployment through its entry URL, judge the run valid,
compare runs. docs/bench.md is the user's reference (record format included).

target.py finds what to measure (the seam to a deployment's backend: its entry URL), aiperf.py runs one
point of the load generator and reads its export, gate.py judges validity, record.py writes the run,
report.py draws the charts and the HTML page, compare.py and sweep.py work across runs. The commands are
muse_launch/commands/bench.py.
"""
