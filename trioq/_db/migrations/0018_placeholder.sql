SELECT 1;  -- placeholder for another branch's migration 18 (untracked, not committed)
