-- The head is written once per transaction, not once per journal entry (issue 15, item 7;
-- measured in docs/BENCHMARKS.md, "Issue 15"). Same law, same journal bytes.
--   Before: every entry UPDATEd the one head row (next_seq, chain_hash). Inside one
--   transaction each UPDATE leaves a row version that cannot be pruned before the commit
--   and that every later read of the head walks past, so a batch of n entries cost O(n^2)
--   (1,000 posts: 513 messages/s against 5,919 for the bare tables).
--   Now a transaction's first entry links to the head (exact: the last commit left it
--   at the journal's end, and this transaction holds it), and each later one to the
--   entry before it, named in a transaction-local setting (`cassette.tail`: the
--   transaction id, the seq and the chain hash of its last entry). That setting is a
--   hint any session can set, so nothing trusts it: the journal's guard admits an entry
--   only if the stored entry before it exists and links to it, and its seq (the primary
--   key) is free; a forged hint makes the session's own write fail, never a fork. No
--   query for "the journal's last entry" on the hot path: its plan (ORDER BY seq DESC
--   LIMIT 1), cached by a session that first ran it on a journal whose statistics say
--   empty, scans the whole journal per entry (batches of 1,000 slowed from 467 to 179
--   messages/s in one session).
--   * cassette_tx_ms() still takes the head at a transaction's first journaled write (the
--     same UPDATE, the same row lock, held to the commit): the head still serializes the
--     chain, and the journal's guard still refuses an entry from a transaction that has
--     not taken it.
--   * cassette_journal_append() links the entry as above and sets the hint.
--   * A deferred constraint trigger on the journal brings the head to the journal's last
--     entry at commit: its first firing moves the head, the others find it there. A
--     session's SET CONSTRAINTS ... IMMEDIATE only makes it fire after each statement (the
--     head moves more often, to the same place): it cannot be skipped. It is SECURITY
--     DEFINER because it fires at COMMIT, outside the definer functions that wrote the
--     entries, as the session's own role, which may not UPDATE the head.
--   * The head's guard: next_seq and chain_hash move together, only forward, and only to
--     the journal's last entry as the writing transaction sees it (the entry before
--     next_seq has that chain hash, none is at next_seq; before: one entry at a time).
--     The stamp and time rules of 0006 are unchanged.
--   * What read the head's next_seq as "the journal's size" inside a transaction (the
--     meta guard of 0001, the seal check of 0003) reads the journal itself: within a
--     writing transaction the head lags until its commit.

-- The number of entries the journal holds, as the caller's snapshot sees them.
CREATE FUNCTION cassette_journal_size() RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT seq FROM cassette_journal ORDER BY seq DESC LIMIT 1) + 1, 0)
$$;

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
    -- Every journaled write's BEFORE trigger has taken the head (cassette_tx_ms()), so no
    -- other transaction can append before this one commits; the guard checks it.
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

-- An entry is appended only by a transaction holding the head, right after the journal's
-- last entry, with its own hashes. (The running state above is a hint any session can
-- set: whatever it says, an entry passes only if it links to the stored entry before it,
-- and its seq, the primary key, is free.)
CREATE OR REPLACE FUNCTION cassette_journal_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    prev bytea;
BEGIN
    IF (SELECT tx FROM cassette_head) IS DISTINCT FROM pg_current_xact_id() THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: entries are appended by the journal''s triggers only';
    END IF;
    IF NEW.seq = 0 THEN
        prev := '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea;
    ELSE
        prev := (SELECT chain_hash FROM cassette_journal WHERE seq = NEW.seq - 1);
    END IF;
    -- Each entry needs the one before it and a free seq: an entry can only be the one
    -- right after the last.
    IF prev IS NULL OR EXISTS (SELECT 1 FROM cassette_journal WHERE seq = NEW.seq) THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: entries are appended by the journal''s triggers only';
    END IF;
    IF NEW.leaf_hash IS DISTINCT FROM sha256('\x00'::bytea || convert_to(NEW.body, 'UTF8'))
       OR NEW.chain_hash IS DISTINCT FROM sha256('\x02'::bytea || int8send(NEW.seq) || prev || NEW.leaf_hash) THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: an entry''s leaf and chain hashes are computed from its body';
    END IF;
    RETURN NEW;
END $$;

-- At commit (or after the statement, for a session that made it immediate): the head
-- names the journal's last entry. The head's guard checks where it is moved.
CREATE FUNCTION cassette_head_follow() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    tail text := current_setting('cassette.tail', true);
BEGIN
    IF NEW.seq < (SELECT next_seq FROM cassette_head) THEN
        RETURN NULL;  -- an earlier firing of this transaction has moved the head past it
    END IF;
    IF split_part(tail, ':', 1) = pg_current_xact_id()::text
       AND split_part(tail, ':', 2)::bigint >= NEW.seq THEN
        UPDATE cassette_head SET next_seq = split_part(tail, ':', 2)::bigint + 1,
                                 chain_hash = decode(split_part(tail, ':', 3), 'hex');
    ELSE  -- an entry not written by cassette_journal_append: one entry at a time
        UPDATE cassette_head SET next_seq = NEW.seq + 1, chain_hash = NEW.chain_hash;
    END IF;
    RETURN NULL;
END $$;
REVOKE EXECUTE ON FUNCTION cassette_head_follow() FROM PUBLIC;
CREATE CONSTRAINT TRIGGER cassette_head_follow AFTER INSERT ON cassette_journal
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION cassette_head_follow();

CREATE OR REPLACE FUNCTION cassette_head_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' OR TG_OP = 'INSERT' THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: the journal head is one row, never inserted or deleted';
    END IF;
    IF (NEW.next_seq IS DISTINCT FROM OLD.next_seq OR NEW.chain_hash IS DISTINCT FROM OLD.chain_hash)
       AND (NEW.next_seq < OLD.next_seq
            OR NEW.chain_hash IS DISTINCT FROM
               (SELECT chain_hash FROM cassette_journal WHERE seq = NEW.next_seq - 1)
            OR EXISTS (SELECT 1 FROM cassette_journal WHERE seq = NEW.next_seq)) THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: the head moves only forward, to the journal''s last entry';
    END IF;
    IF NEW.tx IS DISTINCT FROM OLD.tx AND NEW.tx IS DISTINCT FROM pg_current_xact_id() THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: the head is stamped only by the transaction that takes it';
    END IF;
    IF NEW.time_ms < OLD.time_ms THEN
        RAISE EXCEPTION 'TIME_BACKWARDS: the ledger''s time never runs back';
    END IF;
    IF NEW.clock_offset_ms < OLD.clock_offset_ms THEN
        RAISE EXCEPTION 'TIME_BACKWARDS: the clock offset only moves forward';
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION cassette_meta_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.key = 'ledger_id' AND NEW.key = 'ledger_id'
       AND cassette_journal_size() = 0 THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION USING MESSAGE = format('APPEND_ONLY: cassette_meta rows cannot be %s',
        CASE TG_OP WHEN 'UPDATE' THEN 'updated' ELSE 'deleted' END);
END $$;

CREATE OR REPLACE FUNCTION cassette_seals_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    now_ms bigint;
BEGIN
    now_ms := cassette_tx_ms();  -- first: the head's lock makes max() the last id
    NEW.created_at := now_ms;
    NEW.seal_id := cassette_next_id(NEW.seal_id, (SELECT coalesce(max(seal_id), 0) + 1 FROM cassette_seals));
    IF NEW.tree_size IS NULL OR NEW.tree_size < 1 THEN
        RAISE EXCEPTION 'INVALID_SEAL: a seal covers at least one entry';
    END IF;
    IF NEW.tree_size > cassette_journal_size() THEN
        RAISE EXCEPTION 'INVALID_SEAL: a seal covers at most the entries the journal has';
    END IF;
    IF NEW.root_hex IS NULL OR NEW.root_hex !~ '^[0-9a-f]{64}$'
       OR NEW.key_id IS NULL OR NEW.key_id !~ '^[0-9a-f]{8}$'
       OR NEW.origin IS NULL OR length(NEW.origin) NOT BETWEEN 1 AND 200
       OR NEW.origin ~ '[\t\n\r +]'
       OR NEW.note IS NULL
       OR left(NEW.note, length(NEW.origin) + length(NEW.tree_size::text) + 2)
          IS DISTINCT FROM NEW.origin || E'\n' || NEW.tree_size || E'\n' THEN
        RAISE EXCEPTION 'INVALID_SEAL: a seal is a signed note of its origin, tree size and root';
    END IF;
    IF NEW.root_hex IS DISTINCT FROM encode(cassette_tree_root(NEW.tree_size), 'hex') THEN
        RAISE EXCEPTION 'SEAL_MISMATCH: the sealed root is not the ledger''s root at that size';
    END IF;
    RETURN NEW;
END $$;

REVOKE EXECUTE ON FUNCTION cassette_journal_size() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cassette_journal_size() TO cassette_worker, cassette_appender, cassette_auditor;
