#!/bin/sh
# Scenario 5: idle connections hold every slot but 6 for 30 s (a server of your own only).
# Extra flags pass through (e.g. --dsn, --json report.json); see docs/faults.md.
exec trioq stress --mode steady --rate 300 --duration 60 --work-ms 50 --starve-at 15 --starve-for 30 "$@"
