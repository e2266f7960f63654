"""The schema's version and the migrations: is it there, which version, which tables are
missing, can this transaction write, one migrator at a time."""

SCHEMA_EXISTS = "SELECT pg_catalog.to_regclass(%(migrations)s) IS NOT NULL"

SCHEMA_VERSION = "SELECT coalesce(pg_catalog.max(version), 0) FROM {migrations}"

# Which of the tables a schema should have are missing (the version row can outlive them).
MISSING_TABLES = """
SELECT t FROM pg_catalog.unnest(%(tables)s::text[]) AS t
 WHERE pg_catalog.to_regclass(
           pg_catalog.quote_ident(%(schema)s) || '.' || pg_catalog.quote_ident(t)) IS NULL
 ORDER BY t
"""

#: Whether a new transaction could write (names no table, so one for every schema).
WRITABLE = (
    "SELECT pg_catalog.pg_is_in_recovery(),"
    " pg_catalog.current_setting('transaction_read_only')::bool"
)

# One migrator per schema at a time, until its transaction ends.
MIGRATE_LOCK = """
SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('trioq.migrate'),
                                        pg_catalog.hashtext(%(schema)s))
"""

# The same lock without waiting; and who holds it (to say whom `migrate` waits for).
MIGRATE_TRY_LOCK = """
SELECT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtext('trioq.migrate'),
                                            pg_catalog.hashtext(%(schema)s))
"""

MIGRATE_LOCK_HOLDER = """
SELECT l.pid, a.application_name, a.client_addr::text,
       extract(epoch FROM pg_catalog.now() - a.xact_start)
  FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
 WHERE l.locktype = 'advisory' AND l.granted
   AND l.classid = pg_catalog.hashtext('trioq.migrate')::oid
   AND l.objid = pg_catalog.hashtext(%(schema)s)::oid AND l.objsubid = 2
 LIMIT 1
"""

CREATE_SCHEMA = "CREATE SCHEMA IF NOT EXISTS {schema}"

CREATE_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS {migrations} (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT pg_catalog.now()
)
"""

# A migration file runs with the schema first on the search_path (its names are unqualified).
MIGRATION_SEARCH_PATH = "SET LOCAL search_path TO {schema}, pg_catalog"

RECORD_MIGRATION = "INSERT INTO {migrations} (version, name) VALUES (%(version)s, %(name)s)"

RESET_SEARCH_PATH = "RESET search_path"
