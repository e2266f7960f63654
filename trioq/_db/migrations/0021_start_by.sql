-- trioq schema: deadlines to start (docs/flow-control.md, "Deadlines to start"). Runs with
-- search_path set to the target schema; names here are unqualified.
--
-- `enqueue(..., start_by=...)`: a job not started by then is moved to dead_jobs by the
-- sweeper (reason 'not started by its start_by deadline'), never run late. The deadline is
-- for the first start only: the claim that starts the job clears it, so a retry, a snooze
-- or a durable sleep (which refund or keep the attempt, and move run_at) is never judged by
-- it. NULL (the default) is no deadline.
ALTER TABLE jobs ADD COLUMN start_by timestamptz;
ALTER TABLE jobs
    ADD CONSTRAINT jobs_start_by_check
        CHECK (start_by BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00'),
    -- A deadline before the job may run could never be met: refused (the Python API and
    -- enqueue() below refuse it first, with the words of START_BY_BEFORE_RUN_AT).
    ADD CONSTRAINT jobs_start_by_after_run_at CHECK (start_by >= run_at);
-- What the deadline was, for the jobs that died of it (NULL for every other death).
ALTER TABLE dead_jobs ADD COLUMN start_by timestamptz;

-- The sweeper's expiry (trioq/_db/sql/maintenance.py, EXPIRE_START_BY): pending jobs whose
-- deadline passed, earliest first. Only rows with a deadline that have not started are in it,
-- so it costs nothing to the queues that never use one.
CREATE INDEX jobs_start_by_idx ON jobs (start_by)
    WHERE start_by IS NOT NULL AND state IN ('waiting', 'scheduled', 'available');

-- The claim of a controlled queue (migration 20's: migration 12's with the timed pause),
-- unchanged but for the deadline: a job past its start_by is never taken (the plain claim
-- has the same condition, trioq/_db/sql/leases.py), and the claim clears start_by (met).
CREATE OR REPLACE FUNCTION claim_limited(p_queue text, p_owner text, p_limit integer, p_lease interval)
RETURNS TABLE (id bigint, queue text, task text, args text, priority smallint,
               run_at bigint, attempt integer, max_attempts integer, enqueued_at bigint,
               lease_expires_at bigint, reason text, retry_in double precision)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    q            queues%ROWTYPE;
    t            timestamptz;
    room         integer := greatest(p_limit, 0);
    why          text;
    opens        timestamptz;
    n            integer;
    keyed        boolean;
    default_a    integer;
    base_keys    text[] := '{}';
    base_allow   integer[] := '{}';
    chosen       bigint[] := '{}';
    chosen_keys  text[] := '{}';
    new_ids      bigint[];
    new_keys     text[];
    scanned      integer;
    scan         integer;
    passes       integer := 0;
    claimed      integer;
    full_keys    text[];
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'trioq: a limited claim needs READ COMMITTED, not %',
            current_setting('transaction_isolation') USING ERRCODE = '0A000';
    END IF;
    SELECT * INTO q FROM queues qs WHERE qs.name = p_queue FOR UPDATE;
    -- The limiter's clock, read once the lock is held: the starts it records are in the
    -- order the claims ran.
    t := coalesce(nullif(current_setting('trioq.now', true), '')::timestamptz,
                  clock_timestamp());
    -- A timed pause whose time has come is no pause, whether or not a governor has
    -- tidied the row yet; until then the claim says when it ends (retry_in) (migration 20).
    IF q.paused AND (q.paused_until IS NULL OR q.paused_until > t) THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::smallint,
            NULL::bigint, NULL::integer, NULL::integer, NULL::bigint, NULL::bigint,
            'paused'::text,
            CASE WHEN q.paused_until IS NOT NULL
                 THEN greatest(extract(epoch FROM least(q.paused_until,
                         '9999-12-31 23:59:59+00'::timestamptz) - t), 0) END
                ::double precision;
        RETURN;
    END IF;
    IF q.global_concurrency IS NOT NULL THEN
        -- jobs_lease_idx holds the running jobs ('running' <=> a lease, by a CHECK).
        SELECT count(*) INTO n FROM jobs j
         WHERE j.lease_expires_at IS NOT NULL AND j.queue = p_queue AND j.state = 'running';
        IF q.global_concurrency - n < room THEN
            room := greatest(q.global_concurrency - n, 0);
            why := 'concurrency';
        END IF;
    END IF;
    IF room > 0 AND q.rate_limit IS NOT NULL THEN
        SELECT coalesce(sum(r.n), 0) INTO n FROM rate_starts r
         WHERE r.queue = p_queue AND r.key = '' AND r.started_at > t - q.rate_period;
        IF q.rate_limit - n < room THEN
            room := greatest(q.rate_limit - n, 0);
            why := 'rate';
            IF room = 0 THEN
                opens := rate_opening(p_queue, '', q.rate_limit, q.rate_period, t);
            END IF;
        END IF;
    END IF;
    IF room = 0 THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::smallint,
            NULL::bigint, NULL::integer, NULL::integer, NULL::bigint, NULL::bigint, why,
            CASE WHEN opens IS NOT NULL THEN greatest(extract(epoch FROM opens - t), 0) END
                ::double precision;
        RETURN;
    END IF;

    keyed := q.key_concurrency IS NOT NULL OR q.key_rate_limit IS NOT NULL;
    IF keyed THEN
        -- What each key may still start: its concurrency limit less its running jobs, its
        -- rate limit less its starts in the window; a key in neither has default_a.
        default_a := least(coalesce(q.key_concurrency, 2147483647),
                           coalesce(q.key_rate_limit, 2147483647));
        SELECT coalesce(array_agg(u.k), '{}'), coalesce(array_agg(u.a), '{}')
          INTO base_keys, base_allow
          FROM (SELECT z.k, least(coalesce(q.key_concurrency - sum(z.r), 2147483647),
                                  coalesce(q.key_rate_limit - sum(z.s), 2147483647))::integer AS a
                  FROM (SELECT j.concurrency_key AS k, count(*) AS r, 0 AS s FROM jobs j
                         WHERE q.key_concurrency IS NOT NULL AND j.queue = p_queue
                           AND j.state = 'running' AND j.concurrency_key IS NOT NULL
                         GROUP BY j.concurrency_key
                        UNION ALL
                        SELECT r.key, 0, sum(r.n) FROM rate_starts r
                         WHERE q.key_rate_limit IS NOT NULL AND r.queue = p_queue
                           AND r.key <> '' AND r.started_at > t - q.key_rate_period
                         GROUP BY r.key) AS z
                 GROUP BY z.k) AS u;
        -- Candidates in claim order, skipping keys with nothing left; each key keeps its
        -- first jobs up to what it may start. A pass that scanned `scan` rows without
        -- filling the room leaves the keys it used up for the next pass to skip.
        LOOP
            passes := passes + 1;
            scan := greatest((room - cardinality(chosen)) * 4, 100);
            WITH allow AS (
                SELECT a.k, min(a.a) - sum(a.c)::integer AS allowance
                  FROM (SELECT b.k, b.a, 0 AS c FROM unnest(base_keys, base_allow) AS b(k, a)
                        UNION ALL
                        SELECT ck, default_a, 1 FROM unnest(chosen_keys) AS ck
                         WHERE ck IS NOT NULL) AS a
                 GROUP BY a.k
            ), cand AS (
                SELECT j.id, j.priority, j.run_at, j.concurrency_key FROM jobs j
                 WHERE j.queue = p_queue AND j.state = 'available' AND j.run_at <= t
                   AND (j.start_by IS NULL OR j.start_by >= t)
                   AND (j.concurrency_key = ANY(ARRAY(SELECT al.k FROM allow al
                                                        WHERE al.allowance <= 0)))
                       IS NOT TRUE
                   AND NOT j.id = ANY(chosen)
                 ORDER BY j.priority, j.run_at, j.id
                 LIMIT scan
            ), ranked AS (
                SELECT c.*, row_number() OVER (PARTITION BY c.concurrency_key
                                               ORDER BY c.priority, c.run_at, c.id) AS rn
                  FROM cand c
            ), picked AS (
                SELECT r.id, r.priority, r.run_at, r.concurrency_key FROM ranked r
                  LEFT JOIN allow al ON al.k = r.concurrency_key
                 WHERE r.concurrency_key IS NULL OR r.rn <= coalesce(al.allowance, default_a)
                 ORDER BY r.priority, r.run_at, r.id
                 LIMIT room - cardinality(chosen)
            )
            SELECT coalesce((SELECT array_agg(p.id ORDER BY p.priority, p.run_at, p.id)
                               FROM picked p), '{}'),
                   coalesce((SELECT array_agg(p.concurrency_key
                                              ORDER BY p.priority, p.run_at, p.id)
                               FROM picked p), '{}'),
                   (SELECT count(*) FROM cand)
              INTO new_ids, new_keys, scanned;
            chosen := chosen || new_ids;
            chosen_keys := chosen_keys || new_keys;
            EXIT WHEN cardinality(chosen) >= room OR scanned < scan OR passes >= 4
                   OR cardinality(new_ids) = 0;
        END LOOP;
    END IF;

    -- Lock the jobs to take (a chosen one may have been cancelled meanwhile: re-checked),
    -- then take them and count them as started, per queue and per key, in one statement.
    IF keyed THEN
        chosen := ARRAY(SELECT j.id FROM jobs j
                         WHERE j.id = ANY(chosen) AND j.state = 'available'
                           AND (j.start_by IS NULL OR j.start_by >= t)
                           FOR UPDATE SKIP LOCKED);
    ELSE
        chosen := ARRAY(SELECT j.id FROM jobs j
                         WHERE j.queue = p_queue AND j.state = 'available' AND j.run_at <= t
                   AND (j.start_by IS NULL OR j.start_by >= t)
                         ORDER BY j.priority, j.run_at, j.id
                         LIMIT room
                           FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN QUERY
    WITH upd AS (
        UPDATE jobs j
           SET state = 'running', attempt = j.attempt + 1,
               lease_owner = p_owner, lease_expires_at = t + p_lease, start_by = NULL
         WHERE j.id = ANY(chosen)
        RETURNING j.*
    ), rated AS (
        INSERT INTO rate_starts (queue, key, started_at, n)
        SELECT p_queue, '', t, count(*) FROM upd
         WHERE q.rate_limit IS NOT NULL
        HAVING count(*) > 0
    ), key_rated AS (
        INSERT INTO rate_starts (queue, key, started_at, n)
        SELECT p_queue, u.concurrency_key, t, count(*) FROM upd u
         WHERE q.key_rate_limit IS NOT NULL AND u.concurrency_key IS NOT NULL
         GROUP BY u.concurrency_key
    )
    SELECT u.id, u.queue, u.task, u.args::text, u.priority,
           epoch_us(u.run_at), u.attempt, u.max_attempts,
           epoch_us(u.enqueued_at),
           epoch_us(u.lease_expires_at),
           NULL::text, NULL::double precision
      FROM upd u;
    GET DIAGNOSTICS claimed = ROW_COUNT;

    IF q.rate_limit IS NOT NULL OR q.key_rate_limit IS NOT NULL THEN
        DELETE FROM rate_starts r
         WHERE r.queue = p_queue
           AND r.started_at <= t - greatest(coalesce(q.rate_period, interval '0'),
                                            coalesce(q.key_rate_period, interval '0'));
    END IF;

    IF claimed >= p_limit THEN
        RETURN;
    END IF;
    IF claimed < room AND keyed THEN
        -- Keys with nothing left that still have due jobs held back: the claim was cut
        -- by per-key limits. Their earliest rate window is when one may start again.
        SELECT array_agg(a.k) INTO full_keys
          FROM (SELECT b.k, min(b.a) - sum(b.c) AS allowance
                  FROM (SELECT x.k, x.a, 0 AS c FROM unnest(base_keys, base_allow) AS x(k, a)
                        UNION ALL
                        SELECT y, default_a, 1 FROM unnest(chosen_keys) AS y
                         WHERE y IS NOT NULL) AS b
                 GROUP BY b.k) AS a
         WHERE a.allowance <= 0
           AND EXISTS (SELECT 1 FROM jobs j
                        WHERE j.queue = p_queue AND j.concurrency_key = a.k
                          AND j.state = 'available' AND j.run_at <= t
                          AND (j.start_by IS NULL OR j.start_by >= t));
        IF full_keys IS NOT NULL THEN
            why := 'keys';
            IF q.key_rate_limit IS NOT NULL THEN
                SELECT min(rate_opening(p_queue, fk, q.key_rate_limit, q.key_rate_period, t))
                  INTO opens FROM unnest(full_keys) AS fk;
            END IF;
        ELSIF scanned >= scan THEN
            why := 'more';
        ELSE
            why := NULL;
        END IF;
    ELSIF claimed < room THEN
        why := NULL;  -- drained
    ELSIF why = 'rate' THEN
        -- This claim filled the window: when it opens again (this claim's starts included).
        opens := rate_opening(p_queue, '', q.rate_limit, q.rate_period, t);
    END IF;
    RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::smallint,
        NULL::bigint, NULL::integer, NULL::integer, NULL::bigint, NULL::bigint, why,
        CASE WHEN opens IS NOT NULL THEN greatest(extract(epoch FROM opens - t), 0) END
            ::double precision;
END
$$;

-- enqueue() of migration 17 with start_by last. A function's parameters cannot change in
-- place: dropped and created again, with the privileges the old one had been given.
DO $$
BEGIN
    PERFORM pg_catalog.set_config('trioq.enqueue_acl', coalesce((
        SELECT p.proacl::text FROM pg_catalog.pg_proc p
         WHERE p.oid = 'enqueue(text, jsonb, text, numeric, timestamptz, interval, numeric, text, '
                       'text, boolean)'::regprocedure), ''), true);
END
$$;
DROP FUNCTION enqueue(text, jsonb, text, numeric, timestamptz, interval, numeric, text, text,
                      boolean);
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
-- timedelta form is `start_by => now() + interval '...'` here).
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
    start_by        timestamptz DEFAULT NULL)
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
        -- Then JobSpec.__attrs_post_init__ (a zero delay is no delay), then Queue.enqueue's
        -- payload limit.
        WHEN enqueue.run_at IS NOT NULL AND seconds <> 0 THEN ARRAY['ValueError', 'delay',
            'give run_at or delay, not both']
        WHEN enqueue.start_by < coalesce(enqueue.run_at, t + coalesce(enqueue.delay, interval '0'))
        THEN ARRAY['ValueError', 'start_by',
            'start_by must not be before run_at (the job could never start in time)']
        WHEN octet_length(v) > api_max_payload() AND api_json_size(a, v) > api_max_payload()
        THEN ARRAY['PayloadTooLargeError', 'args', 'args of task ' || py_repr(enqueue.task)
            || ' are ' || api_json_size(a, v) || ' bytes of JSON, over the limit of '
            || api_max_payload() || ' (max_payload_bytes)']
    END;
    IF refusal IS NOT NULL THEN
        RAISE EXCEPTION USING MESSAGE = refusal[3], COLUMN = refusal[2],
                              ERRCODE = api_sqlstate(refusal[1]);
    END IF;

    -- The insert of trioq/_db/sql/enqueue.py (INSERT), and its twin lookup
    -- (trioq/_db/insert.py, one): a twin that ends between the two is tried again.
    k := 'task:' || enqueue.task || '|' || enqueue.dedup_key;
    due := coalesce(enqueue.run_at, t + coalesce(enqueue.delay, interval '0'));
    FOR tries IN 1..5 LOOP
        INSERT INTO jobs (queue, task, args, priority, run_at, state, max_attempts,
                          max_attempts_unset, dedup_key, concurrency_key, start_by)
        VALUES (enqueue.queue, enqueue.task, a, enqueue.priority, due,
                CASE WHEN due > t THEN 'scheduled' ELSE 'available' END,
                coalesce(enqueue.max_attempts, 25), enqueue.max_attempts IS NULL, k,
                enqueue.concurrency_key, enqueue.start_by)
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

-- The old function's grants (none: the default, EXECUTE for PUBLIC, which the new one has).
DO $$
DECLARE
    acl  text := pg_catalog.current_setting('trioq.enqueue_acl', true);
    item record;
    fn   text := 'enqueue(text, jsonb, text, numeric, timestamptz, interval, numeric, text, '
                 'text, boolean, timestamptz)';
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
