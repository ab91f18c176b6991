-- Placeholder for migration 0007, which another branch of issue 15 adds; this branch
-- needs it only so its 0008 follows without a gap. The merge keeps the other branch's
-- 0007 and drops this file.
SELECT 1;
