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
-- functions call already ran so). What changes is the owner's raw DML; the cost is the
-- setting saved and restored per call (the search path recomputed each time), for every
-- caller: scripts/bench_pg_levers.py ab --loop ours-fused --workers 4 --steps 1000 -
-- scripts/levers/undo_0016.sql, two short runs: server CPU 1.660 and 1.400 ms per step
-- with it, 1.550 and 1.340 without (4-7% more; medians 717/807 against 764/906 steps/s,
-- trials 646-1,079: noisy). Naming the
-- tables public.* in the functions' bodies instead would cost nothing (pg_temp is never
-- searched for functions or operators); not done here.

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
