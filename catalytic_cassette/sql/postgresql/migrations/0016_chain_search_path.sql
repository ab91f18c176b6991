-- 0016: the ledger's trigger functions name the ledger's tables, never a session's
-- temporary ones (review of 0015, tests/test_postgres_attacks_0015.py).
--
-- The journal's guard, the append, the head's guard, cassette_tx_ms() (which takes the
-- head), the journal's size, the meta guard, the seal check and every row rule read the
-- ledger's tables by unqualified name and, not being SECURITY DEFINER, ran with the
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
--   * have the seal check fold the root of a temporary journal;
--   * pass a row rule that looks another row up, e.g. insert a receipt for a step never
--     claimed, checked against (and "committing") a temporary cassette_steps: the real
--     step stayed PENDING beside its receipt, and status() counted it twice.
-- Each now runs with search_path = public, pg_temp, as every definer function does
-- (pg_catalog first, implicitly; pg_temp last, so it holds no table the path finds
-- first). Each function that is not IMMUTABLE and is not a definer gets it (the setting
-- holds for what it calls, so the SQL helpers it calls follow; those the definer
-- functions call already ran so). What changes is the owner's raw DML; the cost is one
-- setting saved and restored per call, about 1 us (a PL/pgSQL function called 50,000
-- times with and without it, one run: 5.2-5.4 against 5.8-7.1 us per call).

ALTER FUNCTION cassette_journal_guard() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_journal_append(text, text, text, text, text) SET search_path = public, pg_temp;
ALTER FUNCTION cassette_head_guard() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_tx_ms() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_advance_clock(bigint) SET search_path = public, pg_temp;
ALTER FUNCTION cassette_journal_size() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_meta_guard() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_seals_insert() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_tree_root(bigint) SET search_path = public, pg_temp;
ALTER FUNCTION cassette_next_id(bigint, bigint) SET search_path = public, pg_temp;
ALTER FUNCTION cassette_messages_insert() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_messages_journal() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_jobs_insert() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_jobs_journal() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_steps_insert() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_steps_update() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_steps_update_signature() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_steps_journal() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_receipts_insert() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_receipts_signature() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_receipts_commit_step() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_receipts_journal() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_releases_insert() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_releases_signature() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_releases_requeue_step() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_releases_journal() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_seals_journal() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_actions_insert() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_actions_lifecycle(cassette_actions, json) SET search_path = public, pg_temp;
ALTER FUNCTION cassette_actions_journal() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_checkpoints_insert() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_checkpoints_journal() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_attestations_insert() SET search_path = public, pg_temp;
ALTER FUNCTION cassette_attestations_journal() SET search_path = public, pg_temp;
