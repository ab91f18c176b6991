-- A call that changes no row takes no head and writes nothing; a malformed cassette.tail is
-- JOURNAL_BROKEN (issue 15, found by the last session's review; LAW.md section 14).
--   Before: every worker and appender function took the head first (cassette_tx_ms(): an
--   UPDATE of the one head row, its row lock held to the commit), also when it then wrote
--   nothing: an idempotent repost, a claim with nothing PENDING, a requeue with no lease
--   due, a checkpoint saved again. Each waited behind the writer holding the head (BUSY
--   after the busy timeout), made every later writer wait behind it, left a new version
--   of the head row and a commit record to flush.
--   Now each of these decides first, without the head, whether it is a no-op, and returns
--   then; anything else takes the head and runs as before (the same checks, codes and
--   answers). The early answer is the one the locked path gives when it takes the head at
--   the moment the early read's snapshot was taken:
--   * It is taken only in READ COMMITTED (every statement's snapshot holds every commit
--     made before the statement began: the package's write transactions) and only by a
--     transaction that does not hold the head already (one that does runs the locked
--     path, which then writes nothing more either). Under REPEATABLE READ or SERIALIZABLE
--     the snapshot may be older than the last commit: the locked path, where taking the
--     head from an old snapshot is a serialization error (BUSY), as before.
--   * Commits are made visible in the order writers take the head (a writer's commit is
--     visible before its lock is released and the next writer can take it), so such a
--     snapshot holds a prefix of the chain: a state the ledger really had, from which only
--     writes serialized after this call are missing. Writing nothing, the call is one of
--     the histories the head allows: it came before them.
--   * What it reads never changes once committed: a message under its key (append-only,
--     its jobs committed with it), a checkpoint under its id (append-only). A PENDING or
--     LEASED step can change, and so can the ledger's time: the claim returns early only
--     when no step of the run is PENDING at all, the requeue only when no lease of the run
--     is due at the ledger's time read in the same statement, after its snapshot (the
--     later of the head's time and the server's clock plus the owner's offset, exactly as
--     cassette_tx_ms() would date a writer then). A lease due at that time is seen, and
--     the requeue takes the head; a lease not due then is not due at any earlier time
--     either.
--   * Arguments are checked before the head now (n, ttl, max_attempts): the same codes,
--     without waiting for the head first.
--   complete_and_claim's claim half runs after its receipt took the head: unchanged (it
--   stamps nothing more). A release, a completion, an attestation and an append always
--   write, or are refused and roll back. cassette_signer_context() and
--   cassette_append_time() take the head on purpose (a signer's time and lock); the
--   package's signed post, claim and requeue ask cassette_posted_under_key(),
--   cassette_run_has_pending() and cassette_run_has_lease_due() first, in statements of
--   their own, and with nothing to write do not take it.
-- cassette.tail (0009) is a setting any session can set. It was cast where it was read
-- (cassette_journal_append, cassette_head_follow): a value naming this transaction with a
-- seq or hash that does not parse failed with the cast's error (22P02, 22023 or 22003:
-- INVALID_ARGUMENT), and any other value was ignored. Now any value other than empty or the form cassette_journal_append
-- writes (transaction id, seq, 64 lowercase hex digits) is JOURNAL_BROKEN where it is read,
-- whichever transaction it names, and refuses the session's own write as a forged
-- well-formed one does.

-- Whether a call may decide that it is a no-op without the head (above): the transaction
-- is READ COMMITTED and does not hold the head. (pg_current_xact_id_if_assigned: a
-- transaction that wrote nothing has no id, and asking must not give it one.)
CREATE FUNCTION cassette_noop_without_head() RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT current_setting('transaction_isolation') = 'read committed'
           AND NOT coalesce((SELECT tx FROM cassette_head) = pg_current_xact_id_if_assigned(), false)
$$;

-- Whether the run has a step to claim, and whether a lease of it is due at the ledger's
-- time now: the time cassette_tx_ms() would give a writer now, read after the statement's
-- snapshot. Read by the functions below before the head, and by the package's signed
-- paths as a statement of its own before their transaction takes the head.
CREATE FUNCTION cassette_run_has_pending(p_run_id text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = public, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM cassette_steps s WHERE s.run_id = p_run_id AND s.status = 'PENDING')
$$;

CREATE FUNCTION cassette_run_has_lease_due(p_run_id text) RETURNS boolean
LANGUAGE sql VOLATILE SET search_path = public, pg_temp AS $$
    SELECT EXISTS (
        SELECT 1 FROM cassette_steps s, cassette_head h
         WHERE s.run_id = p_run_id AND s.status = 'LEASED'
           AND s.lease_expires_at <= greatest(h.time_ms,
                   (floor(extract(epoch FROM clock_timestamp()) * 1000))::bigint + h.clock_offset_ms))
$$;

-- The committed message a post under this run and key repeats, if any: its id, its first
-- job's, and whether source and payload are the same (else IDEMPOTENCY_CONFLICT). Read by
-- cassette_post before the head and under it, and by the package's signed post.
CREATE FUNCTION cassette_posted_under_key(
    p_run_id text, p_idempotency_key text, p_source text, p_payload_json text,
    OUT message_id bigint, OUT job_id bigint, OUT same boolean)
LANGUAGE plpgsql STABLE SET search_path = public, pg_temp AS $$
DECLARE
    earlier cassette_messages;
BEGIN
    SELECT * INTO earlier FROM cassette_messages m
    WHERE m.run_id = p_run_id AND m.idempotency_key = p_idempotency_key;
    IF FOUND THEN
        message_id := earlier.message_id;
        SELECT j.job_id INTO job_id FROM cassette_jobs j
        WHERE j.message_id = earlier.message_id ORDER BY j.ordinal LIMIT 1;
        same := earlier.source IS NOT DISTINCT FROM p_source
                AND earlier.payload_json IS NOT DISTINCT FROM p_payload_json;
    END IF;
END $$;

-- A cassette.tail value cassette_journal_append would not write (empty: none set): a
-- transaction id (at most 20 digits), a seq (at most 18, no leading zero: it fits a
-- bigint, and one more), 64 lowercase hex digits. (Lengths apart from the pattern: a
-- bounded repeat in the pattern costs about 11 us per entry, this about 1.5.)
CREATE FUNCTION cassette_tail_malformed(tail text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(tail, '') <> ''
           AND NOT (tail ~ '^[0-9]+:(0|[1-9][0-9]*):[0-9a-f]+$'
                    AND length(split_part(tail, ':', 1)) <= 20
                    AND length(split_part(tail, ':', 2)) <= 18
                    AND length(split_part(tail, ':', 3)) = 64)
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

CREATE OR REPLACE FUNCTION cassette_head_follow() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    tail text := current_setting('cassette.tail', true);
BEGIN
    IF NEW.seq < (SELECT next_seq FROM cassette_head) THEN
        RETURN NULL;  -- an earlier firing of this transaction has moved the head past it
    END IF;
    IF cassette_tail_malformed(tail) THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: cassette.tail is not a transaction, a seq and a chain hash';
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

CREATE OR REPLACE FUNCTION cassette_post(
    p_run_id text, p_source text, p_idempotency_key text, p_payload_json text,
    p_intents text[], p_step_counts integer[], p_step_payloads text[],
    OUT message_id bigint, OUT job_id bigint, OUT existing boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
    SET standard_conforming_strings = on SET extra_float_digits = 1 SET bytea_output = 'hex' AS $$
DECLARE
    same boolean;
    job_ordinal integer;
    this_job bigint;
    offset_in integer := 0;
BEGIN
    existing := false;
    IF p_idempotency_key IS NOT NULL THEN
        -- a repeat of a committed post is answered without the head; a key not seen yet
        -- is looked up again under it (a post under it may have committed meanwhile)
        IF cassette_noop_without_head() THEN
            SELECT r.message_id, r.job_id, r.same INTO message_id, job_id, same
            FROM cassette_posted_under_key(p_run_id, p_idempotency_key, p_source, p_payload_json) r;
        END IF;
        IF message_id IS NULL THEN
            PERFORM cassette_tx_ms();
            SELECT r.message_id, r.job_id, r.same INTO message_id, job_id, same
            FROM cassette_posted_under_key(p_run_id, p_idempotency_key, p_source, p_payload_json) r;
        END IF;
        IF message_id IS NOT NULL THEN
            IF NOT same THEN
                RAISE EXCEPTION USING
                    MESSAGE = 'IDEMPOTENCY_CONFLICT: this run_id and idempotency_key were posted with another payload or source',
                    DETAIL = message_id::text;
            END IF;
            existing := true;
            RETURN;
        END IF;
    ELSE
        PERFORM cassette_tx_ms();
    END IF;
    IF coalesce(cardinality(p_intents), 0) = 0
       OR cardinality(p_intents) IS DISTINCT FROM cardinality(p_step_counts)
       OR (SELECT sum(c) FROM unnest(p_step_counts) c) IS DISTINCT FROM cardinality(p_step_payloads)::bigint
       OR EXISTS (SELECT 1 FROM unnest(p_step_counts) c WHERE c IS NULL OR c < 1) THEN
        RAISE EXCEPTION 'INVALID_PAYLOAD: a message declares at least one job, each with at least one step';
    END IF;
    INSERT INTO cassette_messages (run_id, source, idempotency_key, payload_json)
    VALUES (p_run_id, p_source, p_idempotency_key, p_payload_json)
    RETURNING cassette_messages.message_id INTO message_id;
    FOR job_ordinal IN 1 .. cardinality(p_intents) LOOP
        INSERT INTO cassette_jobs (message_id, run_id, intent, ordinal)
        VALUES (message_id, p_run_id, p_intents[job_ordinal], job_ordinal - 1)
        RETURNING cassette_jobs.job_id INTO this_job;
        IF job_ordinal = 1 THEN
            job_id := this_job;
        END IF;
        INSERT INTO cassette_steps (job_id, run_id, message_id, job_ordinal, ordinal, status,
                                    fencing_token, payload_json)
        SELECT this_job, p_run_id, message_id, job_ordinal - 1, s.ordinal - 1, 'PENDING', 0,
               p_step_payloads[offset_in + s.ordinal]
        FROM generate_series(1, p_step_counts[job_ordinal]) AS s(ordinal)
        ORDER BY s.ordinal;
        offset_in := offset_in + p_step_counts[job_ordinal];
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION cassette_claim(p_run_id text, p_worker_id text, p_n integer, p_ttl_ms bigint)
RETURNS TABLE (step_id bigint, job_id bigint, message_id bigint, ordinal bigint,
               payload_json text, fencing_token bigint, lease_expires_at bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
    SET standard_conforming_strings = on SET extra_float_digits = 1 SET bytea_output = 'hex' AS $$
DECLARE
    now_ms bigint;
BEGIN
    IF p_n IS NULL OR p_n < 1 THEN
        RAISE EXCEPTION 'INVALID_ARGUMENT: n must be at least 1';
    END IF;
    IF p_ttl_ms IS NULL OR p_ttl_ms < 1 OR p_ttl_ms > 2592000000 THEN
        RAISE EXCEPTION 'INVALID_TTL: a lease lasts 1 ms to 30 days';
    END IF;
    IF cassette_noop_without_head() AND NOT cassette_run_has_pending(p_run_id) THEN
        RETURN;  -- nothing to claim
    END IF;
    now_ms := cassette_tx_ms();
    -- One row at a time, in claim order: the journal then holds the leases in that order.
    FOR step_id IN
        SELECT s.step_id FROM cassette_steps s
        WHERE s.run_id = p_run_id AND s.status = 'PENDING'
        ORDER BY s.message_id, s.job_ordinal, s.ordinal
        LIMIT p_n FOR UPDATE SKIP LOCKED
    LOOP
        UPDATE cassette_steps s
           SET status = 'LEASED', lease_owner = p_worker_id, lease_expires_at = now_ms + p_ttl_ms,
               fencing_token = s.fencing_token + 1
         WHERE s.step_id = cassette_claim.step_id
        RETURNING s.job_id, s.message_id, s.ordinal, s.payload_json, s.fencing_token, s.lease_expires_at
        INTO job_id, message_id, ordinal, payload_json, fencing_token, lease_expires_at;
        RETURN NEXT;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION cassette_requeue(p_run_id text, p_step_id bigint, p_max_attempts bigint)
RETURNS TABLE (step_id bigint, action text, fencing_token bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
    SET standard_conforming_strings = on SET extra_float_digits = 1 SET bytea_output = 'hex' AS $$
DECLARE
    now_ms bigint;
    one cassette_steps;
BEGIN
    IF p_max_attempts IS NOT NULL AND p_max_attempts < 1 THEN
        RAISE EXCEPTION 'INVALID_ARGUMENT: max_attempts must be at least 1';
    END IF;
    -- (a named step with no lease due is always refused below, under the head)
    IF p_step_id IS NULL AND cassette_noop_without_head()
       AND NOT cassette_run_has_lease_due(p_run_id) THEN
        RETURN;  -- no lease due
    END IF;
    now_ms := cassette_tx_ms();
    IF p_step_id IS NOT NULL THEN
        SELECT * INTO one FROM cassette_steps s WHERE s.step_id = p_step_id;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'STEP_NOT_FOUND: no step %', p_step_id;
        ELSIF one.run_id IS DISTINCT FROM p_run_id THEN
            RAISE EXCEPTION 'RUN_MISMATCH: step % belongs to another run', p_step_id;
        ELSIF one.status IS DISTINCT FROM 'LEASED' THEN
            RAISE EXCEPTION 'NOT_LEASED: step % is %', p_step_id, one.status;
        ELSIF one.lease_expires_at > now_ms THEN
            RAISE EXCEPTION 'LEASE_NOT_EXPIRED: step %''s lease expires at %', p_step_id, one.lease_expires_at;
        END IF;
    END IF;
    FOR one IN
        SELECT * FROM cassette_steps s
        WHERE s.run_id = p_run_id AND s.status = 'LEASED' AND s.lease_expires_at <= now_ms
          AND (p_step_id IS NULL OR s.step_id = p_step_id)
        ORDER BY s.step_id
    LOOP
        IF p_max_attempts IS NOT NULL AND one.fencing_token >= p_max_attempts THEN
            INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id, fencing_token,
                                           outcome, receipt_json)
            VALUES (one.step_id, one.job_id, p_run_id, one.lease_owner, one.fencing_token, 'ABORTED',
                    -- the receipt SQLite's package writes: payloads.dumps, keys sorted
                    '{"attempts":' || one.fencing_token || ',"reason":"max_attempts"}');
            step_id := one.step_id; action := 'aborted'; fencing_token := one.fencing_token;
        ELSE
            UPDATE cassette_steps s SET status = 'PENDING', lease_owner = NULL, lease_expires_at = NULL
            WHERE s.step_id = one.step_id;
            step_id := one.step_id; action := 'requeued'; fencing_token := one.fencing_token;
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION cassette_save_checkpoint(p_checkpoint_id text, p_plan_id text, p_context_json text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
    SET standard_conforming_strings = on SET extra_float_digits = 1 SET bytea_output = 'hex' AS $$
DECLARE
    stored text;
BEGIN
    -- a checkpoint committed under this id is answered without the head; an id not seen
    -- yet is looked up again under it
    IF cassette_noop_without_head() THEN
        SELECT context_json INTO stored FROM cassette_checkpoints WHERE checkpoint_id = p_checkpoint_id;
    END IF;
    IF stored IS NULL THEN
        PERFORM cassette_tx_ms();
        SELECT context_json INTO stored FROM cassette_checkpoints WHERE checkpoint_id = p_checkpoint_id;
    END IF;
    IF stored IS NOT NULL THEN
        IF stored IS DISTINCT FROM p_context_json THEN
            RAISE EXCEPTION 'CHECKPOINT_MISMATCH: % holds another context than its id names', p_checkpoint_id;
        END IF;
        RETURN p_checkpoint_id;
    END IF;
    INSERT INTO cassette_checkpoints (checkpoint_id, plan_id, context_json, created_at)
    VALUES (p_checkpoint_id, p_plan_id, p_context_json, 0);
    RETURN p_checkpoint_id;
END $$;

REVOKE EXECUTE ON FUNCTION cassette_noop_without_head(), cassette_tail_malformed(text),
    cassette_run_has_pending(text), cassette_run_has_lease_due(text),
    cassette_posted_under_key(text, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cassette_run_has_pending(text), cassette_run_has_lease_due(text),
    cassette_posted_under_key(text, text, text, text)
   TO cassette_worker;
