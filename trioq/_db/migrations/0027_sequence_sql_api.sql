-- trioq schema: the SQL API's enqueue() takes sequence_key (docs/sql-api.md; sequences:
-- docs/flow-control.md, "Sequences"). Runs with search_path set to the target schema; names
-- here are unqualified.

-- enqueue() of migration 22 with sequence_key last (still version 1 of the SQL API:
-- docs/sql-api.md), dropped and created again with the grants the old one had.
DO $$
BEGIN
    PERFORM pg_catalog.set_config('trioq.enqueue_acl', coalesce((
        SELECT p.proacl::text FROM pg_catalog.pg_proc p
         WHERE p.oid = 'enqueue(text, jsonb, text, numeric, timestamptz, interval, numeric, text, '
                       'text, boolean, timestamptz, interval, interval)'::regprocedure), ''), true);
END
$$;
DROP FUNCTION enqueue(text, jsonb, text, numeric, timestamptz, interval, numeric, text, text,
                      boolean, timestamptz, interval, interval);
-- Pinned as migration 17 pinned it: this schema, pg_catalog, then pg_temp.
SELECT pg_catalog.set_config('search_path',
                             pg_catalog.current_setting('search_path') || ', pg_temp', true);

-- trioq.enqueue(conn, task, args, ...) in SQL (trioq/_queue.py, Queue.enqueue): the job's id,
-- or the id of the live job of the same task that holds dedup_key (its twin; no job is
-- inserted then). The checks run in the order of the Python API's (JobSpec's converters,
-- then its validators in field order, then run_at with delay, then the payload's size), so
-- the first refusal is the same one. Not in version 1: unique=, after= and
-- on_dependency_failure= (docs/sql-api.md). Migration 21 added start_by (after notify, so
-- every version 1 call means what it meant: still version 1), a time only (Python's
-- timedelta form is `start_by => now() + interval '...'` here). Migration 22 added debounce
-- and debounce_max_wait (Python's Debounce(period, max_wait=...)), after start_by.
-- Migration 27 added sequence_key (Python's sequence_key=: docs/flow-control.md,
-- "Sequences"), after debounce_max_wait; migration 26's trigger does the rest.
CREATE FUNCTION enqueue(
    task            text,
    args            jsonb       DEFAULT NULL,
    queue           text        DEFAULT 'default',
    priority        numeric     DEFAULT 0,
    run_at          timestamptz DEFAULT NULL,
    delay           interval    DEFAULT NULL,
    max_attempts    numeric     DEFAULT NULL,
    dedup_key       text        DEFAULT NULL,
    concurrency_key text        DEFAULT NULL,
    notify          boolean     DEFAULT true,
    start_by        timestamptz DEFAULT NULL,
    debounce        interval    DEFAULT NULL,
    debounce_max_wait interval  DEFAULT NULL,
    sequence_key    text        DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    t       timestamptz := coalesce(nullif(current_setting('trioq.now', true), '')::timestamptz,
                                    now());
    a       jsonb := CASE WHEN enqueue.args IS NULL OR enqueue.args = 'null'::jsonb
                          THEN '{}'::jsonb ELSE enqueue.args END;  -- None is {}
    v       text := a::text;
    seconds numeric := extract(epoch FROM enqueue.delay)::numeric;
    period  numeric := extract(epoch FROM enqueue.debounce)::numeric;
    waits   numeric := extract(epoch FROM enqueue.debounce_max_wait)::numeric;
    st      text;
    refusal text[];  -- the Python error's kind, the parameter, the message
    k       text;
    due     timestamptz;
    new_id  bigint;
    twin    bigint;
BEGIN
    refusal := CASE
        -- JobSpec's converters: delay (to_delay), start_by (to_start_by), then args
        -- (encode_args).
        WHEN NOT isfinite(enqueue.delay) THEN ARRAY['ValueError', 'delay',
            'delay must be a finite number of seconds, got '
            || CASE WHEN enqueue.delay > interval '0' THEN 'inf' ELSE '-inf' END]
        WHEN seconds < 0 THEN ARRAY['ValueError', 'delay',
            'delay must not be negative, got ' || py_format_g(seconds) || ' s']
        WHEN seconds > 3153600000 THEN ARRAY['ValueError', 'delay',
            'delay must be at most 36500 days, got ' || py_format_g(seconds) || ' s']
        WHEN NOT enqueue.start_by BETWEEN '0001-01-01 00:00:00+00'
                                      AND '9999-12-31 23:59:59.999999+00' THEN ARRAY['ValueError',
            'start_by', 'start_by ' || py_isoformat(enqueue.start_by) || ' is outside the years 1 '
            || 'to 9999 in UTC (the times the schema holds)']
        -- debounce (to_debounce: Debounce's converters, then its check)
        WHEN enqueue.debounce_max_wait IS NOT NULL AND enqueue.debounce IS NULL THEN
            ARRAY['ValueError', 'debounce_max_wait', 'debounce_max_wait needs a debounce']
        WHEN NOT isfinite(enqueue.debounce) THEN ARRAY['ValueError', 'debounce',
            'debounce period must be a finite number of seconds, got '
            || CASE WHEN enqueue.debounce > interval '0' THEN 'inf' ELSE '-inf' END]
        WHEN NOT period BETWEEN 0.001 AND 31622400 THEN ARRAY['ValueError', 'debounce',
            'debounce period must be between 1 ms and 366 days, got '
            || py_timedelta(enqueue.debounce)]
        WHEN NOT isfinite(enqueue.debounce_max_wait) THEN ARRAY['ValueError',
            'debounce_max_wait', 'debounce max_wait must be a finite number of seconds, got '
            || CASE WHEN enqueue.debounce_max_wait > interval '0' THEN 'inf' ELSE '-inf' END]
        WHEN NOT waits BETWEEN 0.001 AND 31622400 THEN ARRAY['ValueError', 'debounce_max_wait',
            'debounce max_wait must be between 1 ms and 366 days, got '
            || py_timedelta(enqueue.debounce_max_wait)]
        WHEN waits < period THEN ARRAY['ValueError', 'debounce_max_wait',
            'debounce max_wait (' || py_timedelta(enqueue.debounce_max_wait)
            || ') must be at least its period (' || py_timedelta(enqueue.debounce) || ')']
        WHEN length(v) > 2000 AND api_json_refusal(a, v) IS NOT NULL THEN ARRAY['ValueError', 'args',
            'args must be JSON (dicts, lists, str, int, float, bool, None): '
            || api_json_refusal(a, v)]
        -- Its validators, in field order.
        WHEN enqueue.task IS NULL THEN ARRAY['TypeError', 'task', 'task must be a string, got None']
        WHEN enqueue.task = '' THEN ARRAY['ValueError', 'task',
            'task must be a non-empty string, got ''''']
        WHEN enqueue.task !~ '^[A-Za-z_][A-Za-z0-9_.:-]{0,199}$' THEN ARRAY['ValueError', 'task',
            'task ' || py_repr(enqueue.task) || ' is invalid: use up to 200 letters, digits, '
            || '''_'', ''.'', '':'' or ''-'', starting with a letter or ''_''']
        WHEN enqueue.queue IS NULL THEN ARRAY['TypeError', 'queue',
            'queue must be a string, got None']
        WHEN enqueue.queue !~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}$' THEN ARRAY['ValueError', 'queue',
            'queue ' || py_repr(enqueue.queue) || ' is invalid: use 1-64 letters, digits, '
            || '''_'', ''.'', '':'' or ''-'', not starting with a punctuation mark']
        WHEN NOT api_is_int(enqueue.priority) THEN ARRAY['TypeError', 'priority',
            'priority must be an int, got ' || coalesce(py_number(enqueue.priority), 'None')]
        WHEN NOT enqueue.priority BETWEEN -100 AND 100 THEN ARRAY['ValueError', 'priority',
            'priority must be between -100 and 100 (lower runs first), got '
            || enqueue.priority::text]
        WHEN NOT enqueue.run_at BETWEEN '0001-01-01 00:00:00+00'
                                    AND '9999-12-31 23:59:59.999999+00' THEN ARRAY['ValueError',
            'run_at', 'run_at ' || py_isoformat(enqueue.run_at) || ' is outside the years 1 to '
            || '9999 in UTC (the times the schema holds)']
        WHEN enqueue.max_attempts IS NOT NULL AND NOT api_is_int(enqueue.max_attempts) THEN
            ARRAY['TypeError', 'max_attempts',
                  'max_attempts must be an int, got ' || py_number(enqueue.max_attempts)]
        WHEN NOT enqueue.max_attempts BETWEEN 1 AND 10000 THEN ARRAY['ValueError',
            'max_attempts', 'max_attempts must be between 1 and 10000, got '
            || enqueue.max_attempts::text]
        WHEN enqueue.dedup_key = '' OR length(enqueue.dedup_key) > 500 THEN ARRAY['ValueError',
            'dedup_key', 'dedup_key must be a non-empty string of at most 500 characters']
        WHEN enqueue.concurrency_key = '' OR length(enqueue.concurrency_key) > 500 THEN
            ARRAY['ValueError', 'concurrency_key',
                  'concurrency_key must be a non-empty string of at most 500 characters']
        -- sequences (migration 27): the last field, the rule of keys (check_dedup_key)
        WHEN enqueue.sequence_key = '' OR length(enqueue.sequence_key) > 500 THEN
            ARRAY['ValueError', 'sequence_key',
                  'sequence_key must be a non-empty string of at most 500 characters']
        -- Then JobSpec.__attrs_post_init__ (a zero delay is no delay), then Queue.enqueue's
        -- payload limit.
        WHEN enqueue.run_at IS NOT NULL AND seconds <> 0 THEN ARRAY['ValueError', 'delay',
            'give run_at or delay, not both']
        -- (a time against a time: JobSpec; against now + delay: the insert, after the payload)
        WHEN enqueue.start_by < enqueue.run_at THEN ARRAY['ValueError', 'start_by',
            'start_by must not be before run_at (the job could never start in time)']
        WHEN enqueue.debounce IS NOT NULL AND enqueue.dedup_key IS NULL THEN ARRAY['ValueError',
            'debounce', 'debounce needs a dedup_key (or unique= without a period): the key '
            || 'says which enqueues are one burst']
        WHEN enqueue.debounce IS NOT NULL AND (enqueue.run_at IS NOT NULL OR seconds <> 0) THEN
            ARRAY['ValueError', 'debounce', 'debounce sets the run time (the period after the '
                  || 'last enqueue): give no run_at or delay']
        WHEN enqueue.debounce IS NOT NULL AND enqueue.start_by IS NOT NULL THEN ARRAY['ValueError',
            'debounce', 'give start_by or debounce, not both (debounce moves the run time)']
        -- sequences (migration 27): JobSpec's SEQUENTIAL_ALONE (a dedup_key is the SQL API's
        -- only uniqueness, and it has no after=)
        WHEN enqueue.sequence_key IS NOT NULL AND enqueue.dedup_key IS NOT NULL THEN
            ARRAY['ValueError', 'sequence_key', 'a job of a sequence (sequence_key) cannot have '
                  || 'dependencies (after=), a dedup_key, be unique or debounced, or be in a '
                  || 'workflow or batch: its sequence decides when it runs '
                  || '(docs/flow-control.md, "Sequences")']
        WHEN octet_length(v) > api_max_payload() AND api_json_size(a, v) > api_max_payload()
        THEN ARRAY['PayloadTooLargeError', 'args', 'args of task ' || py_repr(enqueue.task)
            || ' are ' || api_json_size(a, v) || ' bytes of JSON, over the limit of '
            || api_max_payload() || ' (max_payload_bytes)']
        WHEN enqueue.start_by < t + coalesce(enqueue.delay, interval '0') THEN ARRAY['ValueError',
            'start_by', 'start_by must not be before run_at (the job could never start in time)']
    END;
    IF refusal IS NOT NULL THEN
        RAISE EXCEPTION USING MESSAGE = refusal[3], COLUMN = refusal[2],
                              ERRCODE = api_sqlstate(refusal[1]);
    END IF;

    k := 'task:' || enqueue.task || '|' || enqueue.dedup_key;
    IF enqueue.debounce IS NOT NULL THEN
        -- The upsert of trioq/_db/sql/enqueue.py (DEBOUNCE).
        INSERT INTO jobs AS j (queue, task, args, priority, run_at, state, max_attempts,
                               max_attempts_unset, concurrency_key, debounce_key,
                               debounce_deadline)
        VALUES (enqueue.queue, enqueue.task, a, enqueue.priority, t + enqueue.debounce,
                'scheduled', coalesce(enqueue.max_attempts, 25), enqueue.max_attempts IS NULL,
                enqueue.concurrency_key, k, t + enqueue.debounce_max_wait)
        ON CONFLICT (debounce_key) WHERE debounce_key IS NOT NULL
                                     AND state IN ('scheduled', 'available')
        DO UPDATE SET
            args = excluded.args,
            run_at = least(t + enqueue.debounce, j.debounce_deadline),
            state = CASE WHEN least(t + enqueue.debounce, j.debounce_deadline) > t
                         THEN 'scheduled' ELSE 'available' END
        RETURNING j.id, j.state INTO new_id, st;
        IF enqueue.notify THEN
            PERFORM pg_notify('trioq_' || current_schema(),
                              CASE WHEN st = 'scheduled' THEN '@scheduled' ELSE enqueue.queue END);
        END IF;
        RETURN new_id;
    END IF;

    -- The insert of trioq/_db/sql/enqueue.py (INSERT), and its twin lookup
    -- (trioq/_db/insert.py, one): a twin that ends between the two is tried again.
    due := coalesce(enqueue.run_at, t + coalesce(enqueue.delay, interval '0'));
    FOR tries IN 1..5 LOOP
        INSERT INTO jobs (queue, task, args, priority, run_at, state, max_attempts,
                          max_attempts_unset, dedup_key, concurrency_key, start_by,
                          sequence_key)
        VALUES (enqueue.queue, enqueue.task, a, enqueue.priority, due,
                CASE WHEN due > t THEN 'scheduled' ELSE 'available' END,
                coalesce(enqueue.max_attempts, 25), enqueue.max_attempts IS NULL, k,
                enqueue.concurrency_key, enqueue.start_by, enqueue.sequence_key)
        ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL
                                  AND state IN ('scheduled', 'available', 'running') DO NOTHING
        RETURNING id INTO new_id;
        IF new_id IS NOT NULL THEN
            IF enqueue.notify THEN
                PERFORM pg_notify('trioq_' || current_schema(),
                                  CASE WHEN due > t THEN '@scheduled' ELSE enqueue.queue END);
            END IF;
            RETURN new_id;
        END IF;
        SELECT j.id INTO twin FROM jobs j
         WHERE j.dedup_key = k AND j.state IN ('scheduled', 'available', 'running');
        IF twin IS NOT NULL THEN
            RETURN twin;
        END IF;
    END LOOP;
    RAISE EXCEPTION USING COLUMN = 'dedup_key', ERRCODE = api_sqlstate('RuntimeError'),
        MESSAGE = 'dedup key ' || py_repr(k) || ' keeps conflicting with jobs that finish at once';
END
$$;

DO $$
DECLARE
    acl  text := pg_catalog.current_setting('trioq.enqueue_acl', true);
    item record;
    fn   text := 'enqueue(text, jsonb, text, numeric, timestamptz, interval, numeric, text, '
                 'text, boolean, timestamptz, interval, interval, text)';
BEGIN
    IF coalesce(acl, '') = '' THEN
        RETURN;
    END IF;
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', fn);
    FOR item IN SELECT x.grantee, x.is_grantable
                  FROM pg_catalog.aclexplode(acl::aclitem[]) AS x
                 WHERE x.privilege_type = 'EXECUTE'
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s', fn,
            CASE WHEN item.grantee = 0 THEN 'PUBLIC'
                 ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(item.grantee)) END,
            CASE WHEN item.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
    PERFORM pg_catalog.set_config('trioq.enqueue_acl', '', true);
END
$$;
