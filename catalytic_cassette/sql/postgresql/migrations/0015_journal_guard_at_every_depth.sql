-- 0015: the journal's guard checks every entry again, at any trigger depth (review of 0014).
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
