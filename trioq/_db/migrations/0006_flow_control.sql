-- trioq flow control: paused queues, limits that hold across processes, unique windows.
-- Runs with search_path set to the target schema; names here are unqualified. Self-contained:
-- it only adds to the tables of 0001 (docs/flow-control.md explains every object).

-- One row per queue that has settings. `controlled` is what the fast claim checks: a queue
-- without a row, or whose row sets nothing, is claimed exactly as before this migration.
CREATE TABLE queues (
    name               text        PRIMARY KEY,
    paused             boolean     NOT NULL DEFAULT false,
    global_concurrency integer     CHECK (global_concurrency >= 1),
    rate_limit         integer     CHECK (rate_limit >= 1),
    rate_period        interval    CHECK (rate_period > interval '0'),
    key_concurrency    integer     CHECK (key_concurrency >= 1),
    key_rate_limit     integer     CHECK (key_rate_limit >= 1),
    key_rate_period    interval    CHECK (key_rate_period > interval '0'),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    controlled         boolean     GENERATED ALWAYS AS (
        paused OR global_concurrency IS NOT NULL OR rate_limit IS NOT NULL
        OR key_concurrency IS NOT NULL OR key_rate_limit IS NOT NULL
    ) STORED,
    CHECK ((rate_limit IS NULL) = (rate_period IS NULL)),
    CHECK ((key_rate_limit IS NULL) = (key_rate_period IS NULL))
);

-- The starts a rate limit has counted: one row per claim (and key), n jobs at started_at
-- on the limiter's clock. key '' is the queue as a whole. Rows older than the longest
-- period are pruned by the claims of the queue.
CREATE TABLE rate_starts (
    queue      text        NOT NULL,
    key        text        NOT NULL,
    started_at timestamptz NOT NULL,
    n          integer     NOT NULL CHECK (n >= 1)
);
CREATE INDEX rate_starts_idx ON rate_starts (queue, key, started_at);

-- A job's concurrency key (per-key limits of its queue). NULL for most jobs: the partial
-- indexes below then hold nothing and cost nothing.
ALTER TABLE jobs ADD COLUMN concurrency_key text;
ALTER TABLE dead_jobs ADD COLUMN concurrency_key text;
CREATE INDEX jobs_key_running_idx ON jobs (queue, concurrency_key)
    WHERE state = 'running' AND concurrency_key IS NOT NULL;
CREATE INDEX jobs_key_available_idx ON jobs (queue, concurrency_key, priority, run_at, id)
    WHERE state = 'available' AND concurrency_key IS NOT NULL;

-- Unique jobs with a window: the job that holds a key for one period, so the key stays
-- taken after the job finished (finished rows are deleted). Pruned after expires_at.
CREATE TABLE unique_keys (
    key        text        PRIMARY KEY,
    job_id     bigint,
    expires_at timestamptz NOT NULL
);
CREATE INDEX unique_keys_expiry_idx ON unique_keys (expires_at);

-- Explicit dedup keys are scoped by task from this version on ('key:K' becomes
-- 'task:<task>|K'); cron ticks keep their global keys ('key:cron:...').
UPDATE jobs SET dedup_key = 'task:' || task || '|' || substr(dedup_key, 5)
 WHERE dedup_key LIKE 'key:%' AND dedup_key NOT LIKE 'key:cron:%';
UPDATE dead_jobs SET dedup_key = 'task:' || task || '|' || substr(dedup_key, 5)
 WHERE dedup_key LIKE 'key:%' AND dedup_key NOT LIKE 'key:cron:%';

-- When a full rate window opens again: the earliest time at which fewer than p_limit of
-- the recorded starts are newer than p_period. NULL: the window is not full at p_now.
CREATE FUNCTION rate_opening(p_queue text, p_key text, p_limit integer, p_period interval,
                             p_now timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT w.started_at + p_period
      FROM (SELECT s.started_at,
                   sum(s.n) OVER (ORDER BY s.started_at DESC
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS newer
              FROM rate_starts s
             WHERE s.queue = p_queue AND s.key = p_key AND s.started_at > p_now - p_period) AS w
     WHERE w.newer >= p_limit
     ORDER BY w.started_at DESC
     LIMIT 1
$$;

-- The claim of a controlled queue (see docs/flow-control.md, "How the claim enforces it").
-- The queue's row is locked first, so the claims of one controlled queue run one at a time
-- across every process; each statement below then takes a fresh snapshot (READ COMMITTED),
-- which sees every claim that held the lock before, and counts what is running now. The
-- counts are never stored, so there is nothing to drift: every path that moves a job out of
-- 'running' (completion, retry, death, release, snooze, cancel, the sweeper, a user's
-- DELETE) frees its slot by that write alone.
-- Returns the claimed jobs (the fast claim's columns), then one row with id NULL: why the
-- claim took fewer than p_limit ('paused', 'concurrency', 'rate', 'keys', 'more' or NULL)
-- and, for a rate limit, in how many seconds its window opens.
CREATE FUNCTION claim_limited(p_queue text, p_owner text, p_limit integer, p_lease interval)
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
    IF q.paused THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::smallint,
            NULL::bigint, NULL::integer, NULL::integer, NULL::bigint, NULL::bigint,
            'paused'::text, NULL::double precision;
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
                           FOR UPDATE SKIP LOCKED);
    ELSE
        chosen := ARRAY(SELECT j.id FROM jobs j
                         WHERE j.queue = p_queue AND j.state = 'available' AND j.run_at <= t
                         ORDER BY j.priority, j.run_at, j.id
                         LIMIT room
                           FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN QUERY
    WITH upd AS (
        UPDATE jobs j
           SET state = 'running', attempt = j.attempt + 1,
               lease_owner = p_owner, lease_expires_at = t + p_lease
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
           (date_part('epoch', u.run_at) * 1000000)::int8, u.attempt, u.max_attempts,
           (date_part('epoch', u.enqueued_at) * 1000000)::int8,
           (date_part('epoch', u.lease_expires_at) * 1000000)::int8,
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
                          AND j.state = 'available' AND j.run_at <= t);
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

-- Enqueue with a unique window (see docs/flow-control.md, "Unique jobs"). The key's record
-- is inserted or locked first, so enqueues of one key run one at a time; the state of the
-- job that holds it is then read by a fresh statement, which sees every commit before.
-- Returns (id, duplicate): the new job, or the job that holds the key.
CREATE FUNCTION enqueue_unique(
    p_key text, p_period interval, p_states text[], p_queue text, p_task text, p_args text,
    p_priority smallint, p_run_at timestamptz, p_delay interval, p_max_attempts integer,
    p_concurrency_key text, p_notify boolean, p_channel text)
RETURNS TABLE (id bigint, duplicate boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    t       timestamptz := coalesce(nullif(current_setting('trioq.now', true), '')::timestamptz,
                                    now());
    k       text := p_key;
    expires timestamptz := 'infinity';
    bucket  double precision;
    holder  bigint;
    st      text;
    due     timestamptz;
    new_id  bigint;
BEGIN
    IF p_period IS NOT NULL THEN
        -- Fixed windows aligned to the Unix epoch (as River's ByPeriod): at most one job
        -- per key in [n * period, (n + 1) * period).
        bucket := floor(extract(epoch FROM t) / extract(epoch FROM p_period));
        k := p_key || '@' || bucket::bigint::text;
        expires := to_timestamp((bucket + 1) * extract(epoch FROM p_period));
    END IF;
    DELETE FROM unique_keys u
     WHERE u.ctid = ANY(ARRAY(SELECT x.ctid FROM unique_keys x WHERE x.expires_at <= t
                               LIMIT 20 FOR UPDATE SKIP LOCKED));
    INSERT INTO unique_keys (key, job_id, expires_at) VALUES (k, NULL, expires)
    ON CONFLICT (key) DO NOTHING;
    IF NOT FOUND THEN
        SELECT u.job_id INTO holder FROM unique_keys u WHERE u.key = k FOR UPDATE;
        SELECT j.state INTO st FROM jobs j WHERE j.id = holder;
        IF st IS NULL THEN
            st := CASE WHEN EXISTS (SELECT 1 FROM dead_jobs d WHERE d.id = holder)
                       THEN 'dead' ELSE 'done' END;
        END IF;
        IF holder IS NOT NULL AND st = ANY(p_states) THEN
            RETURN QUERY SELECT holder, true;
            RETURN;
        END IF;
    END IF;
    due := coalesce(p_run_at, t + p_delay);
    INSERT INTO jobs (queue, task, args, priority, run_at, state, max_attempts, dedup_key,
                      concurrency_key)
    VALUES (p_queue, p_task, p_args::jsonb, p_priority, due,
            CASE WHEN due > t THEN 'scheduled' ELSE 'available' END, p_max_attempts, k,
            p_concurrency_key)
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL
                              AND state IN ('scheduled', 'available', 'running') DO NOTHING
    RETURNING jobs.id INTO new_id;
    IF new_id IS NULL THEN
        -- A live job has the key without holding its record (a dead job retried by hand).
        SELECT j.id INTO holder FROM jobs j
         WHERE j.dedup_key = k AND j.state IN ('scheduled', 'available', 'running');
        RETURN QUERY SELECT holder, true;
        RETURN;
    END IF;
    UPDATE unique_keys u SET job_id = new_id, expires_at = expires WHERE u.key = k;
    IF p_notify THEN
        PERFORM pg_notify(p_channel, CASE WHEN due > t THEN '@scheduled' ELSE p_queue END);
    END IF;
    RETURN QUERY SELECT new_id, false;
END
$$;
