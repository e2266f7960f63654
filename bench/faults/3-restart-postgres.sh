#!/bin/sh
# Scenario 3: stop and start the embedded Postgres mid-run (embedded only: no --dsn).
# Extra flags pass through (e.g. --dsn, --json report.json); see docs/faults.md.
exec trioq stress --mode steady --rate 300 --duration 60 --work-ms 50 --restart-postgres-at 20 "$@"
