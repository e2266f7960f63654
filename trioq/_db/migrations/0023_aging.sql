-- trioq schema: anti-starvation by aging (docs/flow-control.md, "Aging"). Runs with
-- search_path set to the target schema; names here are unqualified.
--
-- A job that waits improves its priority by one level per `aging` of waiting, but never
-- past the best priority waiting in its queue at that moment: it joins the front class and,
-- being older, runs first within it. A worker's aging service rewrites the priority of the
-- jobs that are due for it (a few writes a job at most: one per level it climbs), so the
-- claim, its index and its plan stay exactly as they were.
--
-- `aged` is how many levels the job has climbed: its priority at enqueue is
-- priority + aged, and it is due for the next level once it has waited (aged + 1) x aging.
-- Existing rows start at 0, as if just enqueued at their priority. Aging writes 0 to 200 (the
-- width of trioq's priorities, -100 to 100); the schema refuses anything else.
ALTER TABLE jobs ADD COLUMN aged smallint NOT NULL DEFAULT 0 CHECK (aged BETWEEN 0 AND 200);

-- The queue's setting: NULL is the default (one level a minute), '0' turns aging off,
-- anything else is the wait that earns one level (1 second to 366 days, as `trioq.Queue`
-- checks). Not part of `controlled`: aging never changes the claim.
ALTER TABLE queues ADD COLUMN aging interval
    CHECK (aging = interval '0' OR aging BETWEEN interval '1 second' AND interval '366 days');
