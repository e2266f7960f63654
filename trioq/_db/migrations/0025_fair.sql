-- trioq schema: fair share between keys (docs/flow-control.md, "Fair share"). Runs with
-- search_path set to the target schema; names here are unqualified.
--
-- A queue set `fair` claims round-robin across its jobs' keys (the concurrency key, set at
-- enqueue: a producer that never sees a worker's configuration still writes it), so one
-- key's 100,000 jobs do not delay another key's 10. `fair_cursor` is the last key a claim
-- served ('': the group of jobs without a key; NULL: none yet); claims of a controlled queue
-- run one at a time under its row lock, so the rotation goes on from claim to claim across
-- every worker. A fair queue is controlled (its claims go through `claim_limited`).
ALTER TABLE queues ADD COLUMN fair boolean NOT NULL DEFAULT false,
                   ADD COLUMN fair_cursor text
                       CONSTRAINT queues_fair_cursor_check CHECK (length(fair_cursor) <= 500);
ALTER TABLE queues DROP COLUMN controlled;
ALTER TABLE queues ADD COLUMN controlled boolean GENERATED ALWAYS AS (
    paused OR global_concurrency IS NOT NULL OR rate_limit IS NOT NULL
    OR key_concurrency IS NOT NULL OR key_rate_limit IS NOT NULL OR fair
) STORED;

-- The claim of a controlled queue (migration 24's), unchanged but for the lines marked
-- "fair share": the rotation above, when the queue is fair.
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
    g_room       integer;          -- cost: the units the global limit has left
    units        integer := 0;     -- cost: the units of the jobs taken
    cut          boolean := false; -- cost: the next job's cost did not fit the global room
    costed       boolean := false; -- cost: a chosen job has a cost (else each counts 1)
    costs        smallint[];       -- cost: the chosen jobs' costs, in claim order
    jc           integer;          -- cost: a job's units
    fk           text;             -- fair share: the key the rotation is at
    nk           text;             -- fair share: the next key with available jobs
    wrapped      boolean := false; -- fair share: the rotation went past the last key
    fair_keys    text[] := '{}';   -- fair share: the keys visited, in rotation order
    unkeyed      bigint[] := '{}'; -- fair share: the due jobs without a key (one group)
    unkeyed_pos  numeric;          -- fair share: where that group sits in the rotation
    share        integer;          -- fair share: the most jobs one key (group) gives
    fair_more    boolean := false; -- fair share: a key may have more than it gave
    fair_held    boolean := false; -- fair share: a key was held back by its limits
    fair_cut     boolean := false; -- fair share: a key gave all its limits let it
    kept         integer;          -- cost: how many of the chosen jobs fit
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
        -- cost: the running jobs' units, each its cost (NULL: the task's, counted 1), and
        -- never more than the limit (a job that costs more runs alone).
        SELECT coalesce(sum(least(coalesce(j.cost, 1), q.global_concurrency)), 0) INTO n
          FROM jobs j
         WHERE j.lease_expires_at IS NOT NULL AND j.queue = p_queue AND j.state = 'running';
        g_room := greatest(q.global_concurrency - n, 0);  -- cost
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
    END IF;

    IF q.fair THEN
        -- fair share (migration 25): round-robin over the keys that have available jobs,
        -- from the key after the queue's cursor (the last key a claim served), wrapping
        -- around once; the jobs without a key are one more group, at the wrap. Each key is
        -- found by one probe of jobs_key_available_idx (a loose index scan), so a claim
        -- reads O(its batch) rows whatever the backlog of any key. A key gives its best
        -- jobs (priority, run_at, id), at most `share` of them, so that fewer keys than
        -- room still fill a batch; the jobs are taken round by round (every key's first,
        -- then every key's second, ...) and the batch is cut at room.
        fk := q.fair_cursor;
        IF fk IS NULL THEN  -- the rotation starts at the group without a key
            unkeyed_pos := 0.5;
            fk := '';
        END IF;
        LOOP
            EXIT WHEN cardinality(fair_keys) >= room;
            SELECT j.concurrency_key INTO nk FROM jobs j
             WHERE j.queue = p_queue AND j.state = 'available' AND j.concurrency_key > fk
             ORDER BY j.concurrency_key LIMIT 1;
            IF nk IS NULL THEN  -- past the last key: wrap, once, through the unkeyed group
                EXIT WHEN wrapped;
                wrapped := true;
                IF unkeyed_pos IS NULL THEN
                    unkeyed_pos := cardinality(fair_keys) + 0.5;
                END IF;
                -- the keys up to the cursor come next, unless the rotation began before
                -- the first key (then it has seen them all)
                EXIT WHEN q.fair_cursor IS NULL OR q.fair_cursor = '';
                fk := '';
                CONTINUE;
            END IF;
            EXIT WHEN wrapped AND nk > q.fair_cursor;  -- back where the rotation began
            fk := nk;
            IF keyed AND coalesce(base_allow[array_position(base_keys, nk)], default_a) <= 0
            THEN
                fair_held := true;  -- its per-key limits let it start nothing now
                CONTINUE;
            END IF;
            fair_keys := fair_keys || nk;
        END LOOP;
        IF unkeyed_pos IS NOT NULL THEN
            -- No index holds the unkeyed jobs alone (one would cost every enqueue): they
            -- are looked for among the queue's first due jobs in claim order.
            unkeyed := ARRAY(SELECT s.id FROM (
                               SELECT j.id, j.concurrency_key, j.priority, j.run_at FROM jobs j
                                WHERE j.queue = p_queue AND j.state = 'available'
                                  AND j.run_at <= t AND (j.start_by IS NULL OR j.start_by >= t)
                                ORDER BY j.priority, j.run_at, j.id
                                LIMIT greatest(room * 2, 20)) AS s
                              WHERE s.concurrency_key IS NULL
                              ORDER BY s.priority, s.run_at, s.id LIMIT room);
        END IF;
        n := cardinality(fair_keys) + CASE WHEN cardinality(unkeyed) > 0 THEN 1 ELSE 0 END;
        IF n > 0 THEN
            share := (room + n - 1) / n;
            -- Each key gives at most its cap: the share, or less where its per-key limits
            -- allow less (then, having given all it may, it was held back: 'keys').
            SELECT coalesce(array_agg(c.id ORDER BY c.rn, c.pos), '{}'),
                   coalesce(bool_or(c.rn >= share), false),
                   coalesce(bool_or(c.rn >= c.cap AND c.cap < share), false)
              INTO chosen, fair_more, fair_cut
              FROM (SELECT kk.pos::numeric AS pos, x.id, x.rn, kk.cap
                      FROM (SELECT f.k, f.pos,
                                   CASE WHEN keyed
                                        THEN least(share, coalesce(base_allow[
                                                 array_position(base_keys, f.k)], default_a))
                                        ELSE share END AS cap
                              FROM unnest(fair_keys) WITH ORDINALITY AS f(k, pos)) AS kk
                     CROSS JOIN LATERAL (
                        SELECT y.id, row_number() OVER (ORDER BY y.priority, y.run_at, y.id) AS rn
                          FROM (SELECT j.id, j.priority, j.run_at FROM jobs j
                                 WHERE j.queue = p_queue AND j.concurrency_key = kk.k
                                   AND j.state = 'available' AND j.run_at <= t
                                   AND (j.start_by IS NULL OR j.start_by >= t)
                                 ORDER BY j.priority, j.run_at, j.id
                                 LIMIT kk.cap) AS y) AS x
                    UNION ALL
                    SELECT unkeyed_pos, u.id, u.rn, share
                      FROM unnest(unkeyed[1:share]) WITH ORDINALITY AS u(id, rn)) AS c;
            fair_held := fair_held OR fair_cut;
            fair_more := fair_more OR cardinality(fair_keys) >= room
                         OR cardinality(chosen) > room;
            chosen := chosen[1:room];
        END IF;
    ELSIF keyed THEN
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
    -- cost: the lock also says whether any of them has a cost (one sort, as before).
    IF q.fair THEN  -- fair share: the rotation's order is kept
        SELECT coalesce(array_agg(x.id ORDER BY x.o), '{}'),
               coalesce(bool_or(x.cost IS NOT NULL), false)
          INTO chosen, costed
          FROM (SELECT j.id, u.o, j.cost
                  FROM unnest(chosen) WITH ORDINALITY AS u(id, o) JOIN jobs j ON j.id = u.id
                 WHERE j.state = 'available' AND (j.start_by IS NULL OR j.start_by >= t)
                   FOR UPDATE OF j SKIP LOCKED) AS x;
    ELSIF keyed THEN
        -- (as migration 22's: no sort here; the cost step orders the jobs when one has a cost)
        chosen := ARRAY(SELECT j.id FROM jobs j
                         WHERE j.id = ANY(chosen) AND j.state = 'available'
                           AND (j.start_by IS NULL OR j.start_by >= t)
                           FOR UPDATE SKIP LOCKED);
        costed := EXISTS (SELECT FROM jobs j WHERE j.id = ANY(chosen) AND j.cost IS NOT NULL);
        IF costed THEN  -- cost: in claim order, for the cut
            chosen := ARRAY(SELECT j.id FROM jobs j WHERE j.id = ANY(chosen)
                             ORDER BY j.priority, j.run_at, j.id);
        END IF;
    ELSE
        SELECT coalesce(array_agg(x.id ORDER BY x.priority, x.run_at, x.id), '{}'),
               coalesce(bool_or(x.cost IS NOT NULL), false)
          INTO chosen, costed
          FROM (SELECT j.id, j.priority, j.run_at, j.cost FROM jobs j
                 WHERE j.queue = p_queue AND j.state = 'available' AND j.run_at <= t
                   AND (j.start_by IS NULL OR j.start_by >= t)
                 ORDER BY j.priority, j.run_at, j.id
                 LIMIT room
                   FOR UPDATE SKIP LOCKED) AS x;
    END IF;
    -- cost (weighted slots, migration 24): keep the chosen jobs, in claim order, while the
    -- units taken before each are fewer than asked (p_limit, the worker's free units: the
    -- last may go past it and waits in its buffer) and their sum fits the global room
    -- (never past it). The first that does not fit ends the claim: no job behind it is
    -- taken, so a big job at the head is never passed by small ones. Jobs that all count 1
    -- (cost NULL) fit as they are: at most `room` of them, which is within both.
    units := cardinality(chosen);
    IF costed THEN
        costs := ARRAY(SELECT j.cost FROM unnest(chosen) WITH ORDINALITY AS u(id, o)
                         JOIN jobs j ON j.id = u.id ORDER BY u.o);
        units := 0;
        kept := 0;
        FOR i IN 1 .. cardinality(chosen) LOOP
            EXIT WHEN units >= p_limit;
            jc := least(coalesce(costs[i], 1), coalesce(q.global_concurrency, 32767));
            IF units + jc > coalesce(g_room, 2147483647) THEN
                cut := true;
                EXIT;
            END IF;
            units := units + jc;
            kept := i;
        END LOOP;
        chosen := chosen[1:kept];
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
           -- cost: a job row's cost rides in retry_in, which job rows never use (the
           -- RETURNS TABLE stays as it was); NULL: its task's
           NULL::text, u.cost::double precision
      FROM upd u;
    GET DIAGNOSTICS claimed = ROW_COUNT;
    IF q.fair AND claimed > 0 THEN
        -- fair share: the next claim goes on after the last key this one served ('': the
        -- unkeyed group, so the next begins at the first key). The row is locked: claims
        -- of the queue run one at a time.
        UPDATE queues qs
           SET fair_cursor = (SELECT coalesce(j.concurrency_key, '') FROM jobs j
                               WHERE j.id = chosen[cardinality(chosen)])
         WHERE qs.name = p_queue;
    ELSIF q.fair AND cardinality(fair_keys) > 0 THEN
        -- fair share: keys visited that gave nothing (none of their jobs due yet): the next
        -- claim goes on after them, so keys further on are reached
        UPDATE queues qs SET fair_cursor = fair_keys[cardinality(fair_keys)]
         WHERE qs.name = p_queue;
    END IF;

    IF q.rate_limit IS NOT NULL OR q.key_rate_limit IS NOT NULL THEN
        DELETE FROM rate_starts r
         WHERE r.queue = p_queue
           AND r.started_at <= t - greatest(coalesce(q.rate_period, interval '0'),
                                            coalesce(q.key_rate_period, interval '0'));
    END IF;

    IF claimed >= p_limit OR units >= p_limit THEN  -- cost: or as many units as asked
        RETURN;
    END IF;
    IF cut THEN  -- cost: the next job's cost does not fit the global room: wait for it
        why := 'concurrency';
    ELSIF q.fair AND claimed < room THEN
        -- fair share: a key held back by its limits, or one that may have more (claim
        -- again now), or drained
        why := CASE WHEN fair_more THEN 'more' WHEN fair_held THEN 'keys' END;
    ELSIF claimed < room AND keyed THEN
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
