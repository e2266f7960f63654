-- trioq schema: a child's end wakes a parent that parks at the same moment (docs/durable.md).
-- Runs with search_path set to the target schema; names here are unqualified.
--
-- Migration 16's child_ended looked for its parent parked (scheduled, waiting for 'job <id>')
-- without taking the parent's row lock. A parent whose wait held that lock (it had looked for
-- the signal, found none, and was parking) was seen by the child's transaction as the version
-- before: running, not parked, so not woken; and the wait, with its snapshot, had not seen the
-- signal. The parent then slept until its timeout. Now the child's transaction takes the
-- parent's row lock first, as a signal's sender does (durable.SIGNAL), so the statements after
-- it see the wait's outcome: either the wait sees the signal or the child sees the wait.
--
-- Locks go from a child up to its parent, never down, so two ends cannot wait on each other,
-- except where one batch of completions holds a grandparent while another holds its child
-- (Postgres aborts one; the completer writes it again).
CREATE OR REPLACE FUNCTION child_ended() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    child   jobs%ROWTYPE;
    payload jsonb;
    d       record;
    parent  record;
    t       timestamptz := coalesce(nullif(current_setting('trioq.now', true), '')::timestamptz,
                                    now());
BEGIN
    IF TG_OP = 'UPDATE' THEN
        child := NEW;
        payload := jsonb_build_object('state', NEW.state, 'result', NEW.result);
    ELSE
        child := OLD;
        IF OLD.state IN ('done', 'cancelled') THEN
            RETURN NULL;  -- pruned after it ended: its parent was told then
        END IF;
        SELECT x.reason, x.last_error INTO d FROM dead_jobs x WHERE x.id = OLD.id;
        IF FOUND THEN
            payload := jsonb_build_object('state', 'dead', 'reason', d.reason,
                                          'error', d.last_error);
        ELSIF OLD.state = 'running' THEN
            payload := jsonb_build_object('state', 'done', 'result', NULL);
        ELSE
            payload := jsonb_build_object('state', 'deleted');
        END IF;
    END IF;
    -- The fence: waits for a wait that holds the parent's row; the statements below then
    -- start after it committed, and see the parent parked.
    PERFORM 1 FROM jobs p WHERE p.id = child.parent_id FOR NO KEY UPDATE;
    INSERT INTO job_signals (job_id, name, payload, sent_at)
    SELECT p.id, 'job ' || child.id, payload, t FROM jobs p WHERE p.id = child.parent_id
    ON CONFLICT (job_id, name) DO NOTHING;
    UPDATE jobs p SET state = 'available', run_at = t, waiting_for = NULL
     WHERE p.id = child.parent_id AND p.state = 'scheduled'
       AND p.waiting_for = 'job ' || child.id
    RETURNING p.queue INTO parent;
    IF FOUND THEN
        PERFORM pg_notify('trioq_' || TG_TABLE_SCHEMA, parent.queue);
    END IF;
    RETURN NULL;
END
$$;
