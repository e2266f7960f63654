#!/bin/sh
# Scenario 4: pg_terminate_backend every connection of the workers every 0.5 s.
# Extra flags pass through (e.g. --dsn, --json report.json); see docs/faults.md.
exec trioq stress --mode steady --rate 300 --duration 60 --work-ms 20 --terminate-every 0.5 "$@"
