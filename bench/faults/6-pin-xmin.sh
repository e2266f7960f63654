#!/bin/sh
# Scenario 6: an idle-in-transaction session pins the xmin horizon for 60 s.
# Extra flags pass through (e.g. --dsn, --json report.json); see docs/faults.md.
exec trioq stress --mode steady --rate 300 --duration 120 --work-ms 20 --pin-xmin-at 20 --pin-xmin-for 60 "$@"
