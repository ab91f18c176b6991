-- 0015: review of 0014. The journal's guard checks every entry again, at any trigger
-- depth; two lookups 0014 missed plan without statistics.
--
-- 0014 ran the guard only for entries inserted at pg_trigger_depth() = 0, on the ground
-- that an entry inserted from a trigger is cassette_journal_append's, "since only the
-- owner makes triggers, and the owner's DDL is what verify's catalog check reports". Any
-- session makes triggers: on a temporary table, with the trigger's function in pg_temp
-- (TEMP is PUBLIC's). Those objects are in no catalog verify reads (another session's,
-- gone when it ends), and the owner's INSERT into cassette_journal from such a trigger ran
-- at depth 1, unguarded: with DML only, the owner stored entries whose hashes are not
-- their bodies', entries of a transaction that does not hold the head, and entries past
-- the next seq (a gap: the follower then moved the head to them, as the head's guard
-- accepts any move forward to the journal's last entry). Only verify told.
--
-- A trigger cannot tell the append's INSERT from another one at the same depth (the
-- setting cassette.tail is any session's to set), so the guard fires for every INSERT, as
-- before 0014. The append keeps the checks 0014 gave it; they refuse the same entries
-- earlier. Attacks: tests/test_postgres_attacks_0014.py.
DROP TRIGGER cassette_journal_guard ON cassette_journal;
CREATE TRIGGER cassette_journal_guard BEFORE INSERT ON cassette_journal
    FOR EACH ROW EXECUTE FUNCTION cassette_journal_guard();

-- Two keyed lookups 0014 left planning from the statistics. cassette_run_has_lease_due
-- (granted to the worker, called by the package before a requeue) is a SQL function with
-- its own search_path, so the server plans it at every call, from the statistics, as it
-- did the PENDING check 0014 rewrote: a sequential scan of the steps. The releases'
-- signature trigger (its receipts twin was set) looks up its lease's claim attestation:
-- by hand, the owner's session planned it into a scan of the attestations.
ALTER FUNCTION cassette_run_has_lease_due(text) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_releases_signature() SET enable_seqscan = off SET jit = off;
