SELECT 1;  -- placeholder for another branch's migration 20 (untracked, not committed)
