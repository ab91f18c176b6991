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
-- before 0014. The checks 0014 gave the append then only repeat the guard's (the head
-- held, the seq free, the entry before it stored with the chain hash it links to), so the
-- append is 0012's again, with 0014's plan settings: measured against 0014's append with
-- the guard on every entry, same run, four workers, fused 1,059 -> 1,177 steps/s, separate
-- 861 -> 873 (docs/BENCHMARKS.md). (Its first entry reads the head and nothing else: no
-- check correlated with the head's row, which 0014 first wrote as an EXISTS that the
-- server planned as a hash of the whole journal when the head had no statistics.)
-- Attacks: tests/test_postgres_attacks_0014.py.
DROP TRIGGER cassette_journal_guard ON cassette_journal;
CREATE TRIGGER cassette_journal_guard BEFORE INSERT ON cassette_journal
    FOR EACH ROW EXECUTE FUNCTION cassette_journal_guard();

CREATE OR REPLACE FUNCTION cassette_journal_append(tbl text, op text, key_json text, row_key text, row_json text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    body text := '{"table":' || cassette_j(tbl) || ',"op":' || cassette_j(op)
                 || ',"key":' || key_json || ',"row":' || row_json || '}';
    leaf bytea := sha256('\x00'::bytea || convert_to(body, 'UTF8'));
    me text := pg_current_xact_id()::text;
    tail text := current_setting('cassette.tail', true);
    entry_seq bigint;
    prev bytea;
    chain bytea;
BEGIN
    IF cassette_tail_malformed(tail) THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: cassette.tail is not a transaction, a seq and a chain hash';
    END IF;
    -- Every journaled write's BEFORE trigger has taken the head (cassette_tx_ms()), so no
    -- other transaction can append before this one commits; the guard checks it, and that
    -- the entry links to the stored one before it at a free seq, whatever the hint says.
    IF split_part(tail, ':', 1) = me THEN  -- this transaction's last entry
        entry_seq := split_part(tail, ':', 2)::bigint + 1;
        prev := decode(split_part(tail, ':', 3), 'hex');
    ELSE  -- its first: the head, where the last commit left it
        SELECT next_seq, chain_hash INTO entry_seq, prev FROM cassette_head;
    END IF;
    chain := sha256('\x02'::bytea || int8send(entry_seq) || prev || leaf);
    -- Set before the INSERT, so that a follower made immediate (it fires at the INSERT's
    -- end) finds it; if the INSERT fails, its (sub)transaction and the setting go with it.
    PERFORM set_config('cassette.tail', me || ':' || entry_seq || ':' || encode(chain, 'hex'), true);
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash, tbl, row_key)
    VALUES (entry_seq, body, leaf, chain, tbl, row_key);
END $$;
ALTER FUNCTION cassette_journal_append(text, text, text, text, text)
    SET enable_seqscan = off SET jit = off;

-- Two keyed lookups 0014 left planning from the statistics. cassette_run_has_lease_due
-- (granted to the worker, called by the package before a requeue) is a SQL function with
-- its own search_path, so the server plans it at every call, from the statistics, as it
-- did the PENDING check 0014 rewrote: a sequential scan of the steps. The releases'
-- signature trigger (its receipts twin was set) looks up its lease's claim attestation:
-- by hand, the owner's session planned it into a scan of the attestations.
ALTER FUNCTION cassette_run_has_lease_due(text) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_releases_signature() SET enable_seqscan = off SET jit = off;
