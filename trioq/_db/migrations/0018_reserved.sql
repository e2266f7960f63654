-- PLACEHOLDER (branch h-dbcron only): version 18 belongs to another branch (0018_aging.sql).
-- It is here so that this branch's 0019 can be applied and tested on its own (the runner
-- refuses a gap in the numbers); delete this file when merging.
SELECT 1;
