-- Reserved: number 0012 is another branch's (issue 15). This file only keeps the versions
-- 1..n without a gap on the branch that adds 0013; it is replaced by that branch's 0012
-- when both are merged.
SELECT 1;
