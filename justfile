# trioq development recipes. `just --list` shows them with these comments.

venv := ".venv"
py := venv / "bin/python"

# List the recipes
default:
    @just --list

# Create the virtualenv and install trioq with its test dependencies
install:
    python3 -m venv {{venv}}
    {{venv}}/bin/pip install -e '.[test]'

# Run the whole test suite (starts its own throwaway Postgres)
test *args:
    {{venv}}/bin/pytest {{args}}

# Lint and type-check: ruff and mypy --strict on the package, tests, benchmarks and examples
check:
    {{venv}}/bin/ruff check trioq tests bench examples
    {{venv}}/bin/mypy --strict trioq tests bench
    {{venv}}/bin/mypy --strict examples/shop
    DATABASE_URL=dbname=unused {{venv}}/bin/mypy --config-file examples/django_shop/mypy.ini examples/django_shop

# Everything CI runs, exactly as CI runs it
ci:
    bash .ci/run

# Benchmark trioq.pg against psycopg on asyncio and sync psycopg (prints numbers)
bench *args:
    {{py}} bench/bench_pg.py {{args}}

# Benchmark the queue API: enqueue_many, claim+complete at batch 1/10/100 vs pgbench
bench-queue *args:
    {{py}} bench/bench_queue.py {{args}}

# Load test against Postgres (embedded by default); see docs/benchmarks.md
stress *args:
    {{venv}}/bin/trioq stress {{args}}

# List the documentation pages
docs:
    @ls docs/*.md

# The documentation site: `just site serve` to read it live, `just site` to build it as CI does
site *args="build --strict":
    {{venv}}/bin/pip install -q -e '.[docs]'
    {{venv}}/bin/mkdocs {{args}}

# Long run of the queue's Hypothesis state machine (5,000 machines of up to 100 steps)
prove:
    TRIOQ_HYPOTHESIS=long {{venv}}/bin/pytest tests/test_queue_state_machine.py -x

# Compare trioq with pgqueuer and procrastinate on the same burn-down (throwaway venvs)
bench-peers *args:
    {{py}} bench/bench_peers.py {{args}}

# Page load times of trioq web against 1.3M jobs (--browser, --screenshots docs/images)
bench-web *args:
    {{py}} bench/bench_web.py {{args}}
