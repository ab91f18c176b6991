-- 0016: the chain's functions name the ledger's tables, never a session's temporary ones
-- (review of 0015, tests/test_postgres_attacks_0015.py).
--
-- The journal's guard, the append, the head's guard, cassette_tx_ms() (which takes the
-- head), the journal's size, the meta guard and the seal check read cassette_head and
-- cassette_journal by unqualified name and, not being SECURITY DEFINER, ran with the
-- search_path of the session that fired them. A session's temporary schema is searched
-- first for tables unless the path names pg_temp, and a temporary table is any session's
-- to make (TEMP is PUBLIC's), seen by no catalog check of another session. So the
-- owner, with DML on the ledger's tables only, could:
--   * give the guard a temporary cassette_head stamped with its own transaction and a
--     temporary cassette_journal ending where it chose: since 0015 the guard places and
--     hashes the entry from those, so an INSERT naming no seq or hash stored a gap or a
--     fork without the head ever taken (before 0015 the same, naming the forged values);
--     the follower (SECURITY DEFINER, its own path) then moved the real head onto it;
--   * insert a ledger row whose entry the append wrote into a temporary cassette_journal
--     and whose head cassette_tx_ms() took in a temporary cassette_head: a row outside
--     the journal, committed;
--   * have the seal check fold the root of a temporary journal.
-- Each now runs with search_path = public, pg_temp, as every definer function does
-- (pg_catalog first, implicitly; pg_temp last, so it holds no table the path finds
-- first). The functions called from the definer functions already ran so; what changes
-- is the owner's raw DML, and the cost is one setting saved and restored per call.
-- (Row-rule trigger functions that look up other tables, e.g. a step's update checking
-- its receipt, still run with the session's path: not covered here.)

ALTER FUNCTION cassette_journal_guard() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_journal_append(text, text, text, text, text) SET search_path = public, pg_temp;
ALTER FUNCTION cassette_head_guard() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_tx_ms() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_advance_clock(bigint) SET search_path = public, pg_temp;
ALTER FUNCTION cassette_journal_size() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_meta_guard() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_seals_insert() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_tree_root(bigint) SET search_path = public, pg_temp;
