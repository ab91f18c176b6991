-- The ledger's identity is fixed by its first entry, for every interleaving of sessions
-- (found by the attack pass on the merged 0007-0009: tests/test_postgres_attacks_merged.py).
--   Before: the meta guard let the ledger_id be replaced while cassette_journal_size()
--   was 0, counted in the caller's snapshot, without taking the head. Two interleavings
--   replaced it after the first entries, and nothing in the journal or verify shows it
--   (meta is not journaled; only a seal's origin or a signed statement names the id):
--   * a REPEATABLE READ transaction whose snapshot predates another session's first
--     entries still counted an empty journal;
--   * a READ COMMITTED transaction replaced it while the journal was empty and had not
--     committed when a signer took the head, read the old id in
--     cassette_signer_context(), signed under it and committed its first entries.
--   Now a replacement first locks the head row (FOR UPDATE), the lock every journaled
--   write takes: the old snapshot fails to take it (a serialization error, BUSY), a
--   signer waits for the replacement's commit and reads the new id, and the count that
--   follows is made under the head's lock (a volatile function's statement sees what
--   committed before it, in READ COMMITTED). Only the lock: not cassette_tx_ms(), which
--   would also date the transaction now, and a copy (which takes its source's id, then
--   dates each row with its source's time) must set that time itself.

CREATE OR REPLACE FUNCTION cassette_meta_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.key = 'ledger_id' AND NEW.key = 'ledger_id' THEN
        PERFORM 1 FROM cassette_head FOR UPDATE;
        IF cassette_journal_size() = 0 THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION USING MESSAGE = format('APPEND_ONLY: cassette_meta rows cannot be %s',
        CASE TG_OP WHEN 'UPDATE' THEN 'updated' ELSE 'deleted' END);
END $$;
