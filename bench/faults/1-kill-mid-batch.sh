#!/bin/sh
# Scenario 1: SIGKILL one serve process mid-batch (it holds running jobs), restart it.
# Extra flags pass through (e.g. --dsn, --json report.json); see docs/faults.md.
exec trioq stress --mode steady --rate 300 --duration 60 --work-ms 100 --kill-at 20 "$@"
