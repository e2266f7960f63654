SELECT 1;  -- placeholder for another branch's migration 19 (untracked, not committed)
