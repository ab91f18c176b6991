-- Puts back what PostgreSQL migration 0015 replaced (the definitions of 0014: the append
-- links and hashes each entry and the journal's guard checks it again; the two indexes
-- 0015 dropped, without the three it made), on a ledger migrated to 0015:
-- scripts/bench_pg_levers.py ab measures 0015 against its absence in one run
-- (docs/BENCHMARKS.md, "Issue 15: the entry computed once, and the index diet"). The
-- functions as 0012 and 0009 wrote them, with 0014's plan settings; only for benchmarks.
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
ALTER FUNCTION cassette_journal_append(text, text, text, text, text) SET enable_seqscan = off SET jit = off;

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
ALTER FUNCTION cassette_journal_guard() SET enable_seqscan = off SET jit = off;

DROP INDEX cassette_journal_receipt_entries;
DROP INDEX cassette_journal_action_entries;
CREATE INDEX cassette_journal_by_row ON cassette_journal (tbl, row_key);
DROP INDEX cassette_steps_leased;
CREATE INDEX cassette_steps_by_run_status ON cassette_steps (run_id, status);
