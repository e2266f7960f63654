-- trioq schema: debounce (docs/flow-control.md, "Debounce"). Runs with search_path set to
-- the target schema; names here are unqualified.
--
-- `enqueue(..., dedup_key=k, debounce=5)`: a burst of enqueues with one key makes one job,
-- which runs once the burst is over (5 s after the last enqueue), with the last args. The
-- key of a job that has not started is in debounce_key, under a unique index of its own:
-- the enqueue is one INSERT ... ON CONFLICT DO UPDATE on it (a later enqueue replaces the
-- args and pushes run_at; one racing it waits for its commit, then updates). The claim that
-- starts the job clears debounce_key, so an enqueue after the start makes a new job (the
-- burst after the start must run too), and a snoozed or retried job never meets a newer
-- one in the index. debounce_deadline is the first enqueue's time plus max_wait: run_at is
-- never pushed past it, so an endless burst still runs.
ALTER TABLE jobs ADD COLUMN debounce_key text;
ALTER TABLE jobs ADD COLUMN debounce_deadline timestamptz;
ALTER TABLE jobs
    ADD CONSTRAINT jobs_debounce_deadline_check
        CHECK (debounce_deadline BETWEEN '0001-01-01 00:00:00+00'
                                     AND '9999-12-31 23:59:59.999999+00');

-- One job per key among those that have not started.
CREATE UNIQUE INDEX jobs_debounce_idx ON jobs (debounce_key)
    WHERE debounce_key IS NOT NULL AND state IN ('scheduled', 'available');

-- The claim of a controlled queue (migration 21's), unchanged but for clearing debounce_key
-- (the plain claim does the same, trioq/_db/sql/leases.py).
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
               lease_owner = p_owner, lease_expires_at = t + p_lease, start_by = NULL,
               debounce_key = NULL
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
