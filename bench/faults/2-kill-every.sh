#!/bin/sh
# Scenario 2: SIGKILL and restart a serve process every 3 s for two minutes.
# Extra flags pass through (e.g. --dsn, --json report.json); see docs/faults.md.
exec trioq stress --mode steady --rate 300 --duration 120 --work-ms 100 --kill-every 3 "$@"
