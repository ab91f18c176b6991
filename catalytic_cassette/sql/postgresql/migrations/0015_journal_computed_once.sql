-- 0015: each journal entry computed once, and fewer indexes to write per step (issue 15,
-- item 7). Same law, same journal bytes, same codes. Measured in docs/BENCHMARKS.md, "Issue
-- 15: the entry computed once, and the index diet (migration 0015)".
--
-- 1. The journal's guard computes the entry. Before, cassette_journal_append() found the
--    entry's seq and link (from cassette.tail or the head), hashed it and inserted it, and
--    the guard, which must run for every entry whoever inserts it (0014's review), found
--    the link again, looked for a free seq and hashed the body again: every entry was
--    hashed twice and linked twice, under the head. Now the append only builds the body
--    and inserts it; the guard (BEFORE INSERT, for every entry from any session, trigger
--    or function) holds the one computation:
--    * the transaction must hold the head (JOURNAL_BROKEN otherwise, as before);
--    * the entry goes right after the journal's last entry (read through the seq's
--      primary key, last first: every entry in the table is committed or this
--      transaction's own, as no other transaction can hold the head), with the leaf and
--      chain hashes of its body;
--    * an INSERT that gives a seq or a hash (the owner's by hand) must give exactly these
--      values; one that gives none gets them (before, it had to compute them itself: no
--      new power, as sha256() is every session's);
--    * cassette.tail (0009), the transaction's last entry, any session's to set, is no
--      longer read here: the guard sets it for the follower, which reads it at the commit
--      and whose move of the head the head's guard checks (a forged value set after the
--      transaction's last entry is still JOURNAL_BROKEN there, a malformed one too). Set
--      before or between entries it is overwritten: it cannot place an entry anywhere but
--      after the journal's last (before, it failed the session's own write: the chain was
--      safe either way). Nor does the guard compare the head with the journal's end at a
--      transaction's first entry: the head is moved only to the journal's end (its own
--      guard), and verify reports a head that is not there.
-- 2. Indexes written per step. A step's claim and commit are updates that change an
--    indexed column (status, in the PENDING index's predicate), so each writes a new entry
--    into every index of the table, and each journal entry one into each of the journal's.
--    * cassette_journal_by_row (tbl, row_key) served three reads: a receipt's entry
--      (receipt_seq) and an action's (session_entries, bundle_entries). It becomes two
--      partial indexes on row_key, one for receipts, one for actions: a step's two
--      entries per claim and commit no longer write it.
--    * cassette_steps_by_run_status (run_id, status) served the LEASED lookups (lease due,
--      requeue) and the per-run status counts. The LEASED lookups get a partial index
--      (run_id, lease_expires_at) WHERE status = 'LEASED', written by a claim only (the
--      order they ask in); the status counts read the PENDING and LEASED indexes and
--      count COMMITTED steps as the run's receipts (queries.sql, steps_by_status: a step
--      is COMMITTED exactly when it has its receipt, and a receipt's run is its step's).

-- 1.
CREATE OR REPLACE FUNCTION cassette_journal_append(tbl text, op text, key_json text, row_key text, row_json text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- seq, leaf_hash and chain_hash: the journal's guard computes them
    INSERT INTO cassette_journal (body, tbl, row_key)
    VALUES ('{"table":' || cassette_j(tbl) || ',"op":' || cassette_j(op)
            || ',"key":' || key_json || ',"row":' || row_json || '}', tbl, row_key);
END $$;

CREATE OR REPLACE FUNCTION cassette_journal_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    last_seq bigint;
    last_chain bytea;
    leaf bytea;
    chain bytea;
BEGIN
    IF (SELECT tx FROM cassette_head) IS DISTINCT FROM pg_current_xact_id() THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: entries are appended by the journal''s triggers only';
    END IF;
    SELECT j.seq, j.chain_hash INTO last_seq, last_chain
      FROM cassette_journal j ORDER BY j.seq DESC LIMIT 1;
    IF NOT FOUND THEN
        last_seq := -1;
        last_chain := '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea;
    END IF;
    IF NEW.seq IS DISTINCT FROM last_seq + 1 AND NEW.seq IS NOT NULL THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: entries are appended by the journal''s triggers only';
    END IF;
    leaf := sha256('\x00'::bytea || convert_to(NEW.body, 'UTF8'));
    chain := sha256('\x02'::bytea || int8send(last_seq + 1) || last_chain || leaf);
    IF (NEW.leaf_hash IS NOT NULL AND NEW.leaf_hash IS DISTINCT FROM leaf)
       OR (NEW.chain_hash IS NOT NULL AND NEW.chain_hash IS DISTINCT FROM chain) THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: an entry''s leaf and chain hashes are computed from its body';
    END IF;
    NEW.seq := last_seq + 1;
    NEW.leaf_hash := leaf;
    NEW.chain_hash := chain;
    -- For the follower at the commit (it moves the head to the transaction's last entry);
    -- if the INSERT fails, its (sub)transaction and the setting go with it.
    PERFORM set_config('cassette.tail',
                       pg_current_xact_id()::text || ':' || NEW.seq || ':' || encode(chain, 'hex'), true);
    RETURN NEW;
END $$;
ALTER FUNCTION cassette_journal_guard() SET enable_seqscan = off SET jit = off;

-- 2.
DROP INDEX cassette_journal_by_row;
CREATE INDEX cassette_journal_receipt_entries ON cassette_journal (row_key)
    WHERE tbl = 'cassette_receipts';
CREATE INDEX cassette_journal_action_entries ON cassette_journal (row_key)
    WHERE tbl = 'cassette_actions';

DROP INDEX cassette_steps_by_run_status;
CREATE INDEX cassette_steps_leased ON cassette_steps (run_id, lease_expires_at)
    WHERE status = 'LEASED';
