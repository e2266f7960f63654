#!/bin/sh
# Scenario 7: SIGTERM every worker under load (grace 5 s), time the exits, restart.
# Extra flags pass through (e.g. --dsn, --json report.json); see docs/faults.md.
exec trioq stress --mode steady --rate 300 --duration 60 --work-ms 100 --sigterm-at 30 --grace 5 "$@"
