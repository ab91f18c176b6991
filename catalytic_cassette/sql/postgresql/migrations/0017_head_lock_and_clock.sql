-- 0017: the head is the chain's lock and the ledger's clock, no longer a copy of the
-- journal's end; the claim's plan is made once; a step's update checks a requeue's
-- signature itself (issue 15, item 7). Same journal bytes; the same codes for every
-- caller but an attacker's (a forged cassette.tail is no longer JOURNAL_BROKEN: nothing
-- reads it) and verify's journal_head, which now means a head that is not one row.
-- Measured in docs/BENCHMARKS.md, "Issue 15: the head as a lock and a clock (migration
-- 0017)".
--
-- 1. Since 0015 the journal's guard places and hashes every entry from the journal's
--    last entry (read through the seq's primary key, under the head), so the head's
--    next_seq and chain_hash were a second copy of one fact, kept at the journal's end
--    by a deferred constraint trigger (cassette_head_follow, 0009) that fired at every
--    commit for every entry, parsed cassette.tail, UPDATEd the head and ran the head's
--    guard (two journal lookups): a sixth to an eighth of the server's work per claim
--    and per completion, all of it under the head, whose hold is what serializes the
--    ledger's writers. The copy is gone: the follower, cassette.tail (the guard no
--    longer sets it) and cassette_tail_malformed() with it, and the two columns.
--    What the copy told verify: a journal cut short by someone who removed entries
--    past the append-only triggers (a superuser, or the owner with the triggers
--    disabled and enabled again in one transaction, which leaves no trace in the
--    catalog) and did not move the head back with them. Whoever can do the one can
--    do the other, so it caught only a careless cut; a seal catches any cut below its
--    size, which the head never did for a careful one (LAW.md, section 14).
--    What the head keeps: the lock (tx: the journal's guard admits an entry only from
--    the transaction stamped there) and the clock (time_ms, clock_offset_ms), with the
--    guard's rules for them unchanged (stamped only by its own transaction, time and
--    offset never back).
-- 2. The claim's "next PENDING step" query, with its LIMIT a parameter, was planned
--    again at every call (PL/pgSQL's plan cache kept choosing a custom plan: 501 plans
--    in 500 claims under pg_stat_statements, a tenth of a claim's server time). Its
--    generic plan is the custom one (the PENDING partial index, in claim order), so the
--    claim asks for it.
-- 3. The requeue's signature check (0007) was a trigger of its own with a WHEN
--    condition, and a trigger's WHEN is parsed again at every statement that updates
--    the table (every claim and every commit). It is now the last check of the step's
--    own guard's requeue branch, where it ran before (BEFORE triggers fire in name
--    order, and the guard's name comes first): same refusal, same order.

-- 1.
DROP TRIGGER cassette_head_follow ON cassette_journal;
DROP FUNCTION cassette_head_follow();
DROP TRIGGER cassette_head_guard_update ON cassette_head;
ALTER TABLE cassette_head DROP COLUMN next_seq, DROP COLUMN chain_hash;

CREATE OR REPLACE FUNCTION cassette_head_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' OR TG_OP = 'INSERT' THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: the journal head is one row, never inserted or deleted';
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
-- (CREATE OR REPLACE resets a function's settings: 0014's and 0016's again)
ALTER FUNCTION cassette_head_guard()
    SET enable_seqscan = off SET jit = off SET search_path = public, pg_temp;

-- Its own conditions, NULL-safe (as 0014's): taking the head calls nothing.
CREATE TRIGGER cassette_head_guard_update BEFORE UPDATE ON cassette_head
    FOR EACH ROW WHEN (
        (NEW.tx IS DISTINCT FROM OLD.tx AND NEW.tx IS DISTINCT FROM pg_current_xact_id())
        OR NOT coalesce(NEW.time_ms >= OLD.time_ms, false)
        OR NOT coalesce(NEW.clock_offset_ms >= OLD.clock_offset_ms, false))
    EXECUTE FUNCTION cassette_head_guard();

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
    RETURN NEW;
END $$;
ALTER FUNCTION cassette_journal_guard()
    SET enable_seqscan = off SET jit = off SET search_path = public, pg_temp;

DROP FUNCTION cassette_tail_malformed(text);

-- 2.
ALTER FUNCTION cassette_claim(text, text, integer, bigint) SET plan_cache_mode = force_generic_plan;

-- 3.
DROP TRIGGER cassette_steps_update_signature ON cassette_steps;
DROP FUNCTION cassette_steps_update_signature();

CREATE OR REPLACE FUNCTION cassette_steps_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    now_ms bigint;
BEGIN
    -- A claim and a requeue are judged at the transaction's time, and take the head. A
    -- commit is not: it comes from its receipt's insert, which took the head (and an
    -- UPDATE by hand without a receipt is refused below; the journal's guard refuses
    -- an entry of a transaction without the head either way).
    IF OLD.status IS DISTINCT FROM 'LEASED' OR NEW.status IS DISTINCT FROM 'COMMITTED' THEN
        now_ms := cassette_tx_ms();
    END IF;
    IF NEW.status IS NULL OR NEW.status NOT IN ('PENDING', 'LEASED', 'COMMITTED') THEN
        PERFORM cassette_refuse('INVALID_STATUS: status is PENDING, LEASED or COMMITTED');
    END IF;
    IF NEW.fencing_token IS NULL OR NEW.fencing_token < 0 THEN
        PERFORM cassette_refuse('INVALID_TOKEN: a fencing token is a non-negative integer');
    END IF;
    IF NEW.step_id IS DISTINCT FROM OLD.step_id OR NEW.job_id IS DISTINCT FROM OLD.job_id
       OR NEW.run_id IS DISTINCT FROM OLD.run_id OR NEW.message_id IS DISTINCT FROM OLD.message_id
       OR NEW.job_ordinal IS DISTINCT FROM OLD.job_ordinal OR NEW.ordinal IS DISTINCT FROM OLD.ordinal
       OR NEW.payload_json IS DISTINCT FROM OLD.payload_json OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        PERFORM cassette_refuse('IMMUTABLE_FIELD: only status, lease fields and fencing_token of a step change');
    END IF;
    IF NEW.status = OLD.status AND (NEW.lease_owner IS DISTINCT FROM OLD.lease_owner
        OR NEW.lease_expires_at IS DISTINCT FROM OLD.lease_expires_at
        OR NEW.fencing_token IS DISTINCT FROM OLD.fencing_token) THEN
        PERFORM cassette_refuse('LEASE_FIELDS_LOCKED: lease fields change only with a claim or a requeue');
    END IF;
    IF NOT ((OLD.status = 'PENDING' AND NEW.status = 'LEASED')
            OR (OLD.status = 'LEASED' AND NEW.status = 'COMMITTED')
            OR (OLD.status = 'LEASED' AND NEW.status = 'PENDING')) THEN
        PERFORM cassette_refuse('ILLEGAL_TRANSITION: allowed are PENDING->LEASED, LEASED->COMMITTED, LEASED->PENDING');
    END IF;
    IF OLD.status = 'PENDING' THEN
        IF NOT cassette_name_ok(NEW.lease_owner) OR NEW.lease_expires_at IS NULL
           OR NEW.fencing_token IS DISTINCT FROM OLD.fencing_token + 1 THEN
            PERFORM cassette_refuse('LEASE_FIELDS_LOCKED: a claim sets lease_owner and lease_expires_at and adds 1 to the token');
        END IF;
        IF NEW.lease_expires_at <= now_ms THEN
            PERFORM cassette_refuse('INVALID_TTL: a lease must expire in the future');
        END IF;
        IF NEW.lease_expires_at > now_ms + 2592000000 THEN
            PERFORM cassette_refuse('INVALID_TTL: a lease may last at most 30 days');
        END IF;
    ELSIF NEW.status = 'PENDING' THEN
        IF NEW.lease_owner IS NOT NULL OR NEW.lease_expires_at IS NOT NULL
           OR NEW.fencing_token IS DISTINCT FROM OLD.fencing_token THEN
            PERFORM cassette_refuse('LEASE_FIELDS_LOCKED: a requeue clears the lease and keeps the token');
        END IF;
        IF OLD.lease_expires_at > now_ms AND NOT EXISTS (
            SELECT 1 FROM cassette_releases
            WHERE step_id = OLD.step_id AND fencing_token = OLD.fencing_token) THEN
            PERFORM cassette_refuse('LEASE_NOT_EXPIRED: only an expired or released lease is requeued');
        END IF;
        -- 0007's requeue signature rule (a trigger of its own until 0017).
        IF cassette_signed_claim(OLD.step_id, OLD.fencing_token, OLD.lease_owner) IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM cassette_releases r
                           WHERE r.step_id = OLD.step_id AND r.fencing_token = OLD.fencing_token)
           AND NOT cassette_attested(OLD.step_id, OLD.fencing_token, 'requeue', NULL, NULL) THEN
            PERFORM cassette_refuse('SIGNATURE_REQUIRED: this lease was claimed signed; a requeue must be attested');
        END IF;
    ELSE
        IF NEW.lease_owner IS DISTINCT FROM OLD.lease_owner
           OR NEW.lease_expires_at IS DISTINCT FROM OLD.lease_expires_at
           OR NEW.fencing_token IS DISTINCT FROM OLD.fencing_token THEN
            PERFORM cassette_refuse('LEASE_FIELDS_LOCKED: committing keeps the lease fields and the token');
        END IF;
        IF NOT EXISTS (SELECT 1 FROM cassette_receipts r WHERE r.step_id = OLD.step_id
                       AND r.fencing_token = OLD.fencing_token AND r.worker_id = OLD.lease_owner) THEN
            PERFORM cassette_refuse('RECEIPT_REQUIRED: a step is committed only by inserting its receipt');
        END IF;
    END IF;
    RETURN NEW;
END $$;
ALTER FUNCTION cassette_steps_update()
    SET enable_seqscan = off SET jit = off SET search_path = public, pg_temp;
