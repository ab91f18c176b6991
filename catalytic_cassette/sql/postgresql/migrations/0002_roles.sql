-- The worker's API as SECURITY DEFINER functions, and three roles:
--   cassette_worker    post, claim, complete, release and requeue, only through these
--                      functions; reads every ledger table
--   cassette_appender  (actions, a later migration) appends actions; reads
--   cassette_auditor   reads, nothing else
-- No role but the owner holds INSERT, UPDATE, DELETE or TRUNCATE on any table, so a
-- session under these roles cannot write a row these functions (and the triggers they
-- fire) do not write. Each function takes the head first (cassette_tx_ms()): the
-- lookups it makes see every earlier commit, and the whole call is one step of the chain.
-- Roles are the cluster's, shared by every ledger database in it; grants are this one's.

DO $$
DECLARE
    role_name text;
BEGIN
    FOREACH role_name IN ARRAY ARRAY['cassette_worker', 'cassette_appender', 'cassette_auditor'] LOOP
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', role_name);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- made by another ledger of this cluster (or concurrently)
        END;
    END LOOP;
END $$;

-- Post a message and the jobs and steps its payload declares (planned by the client as
-- intents, step counts per job, and the step payloads in order). An idempotent repeat
-- returns the first post's ids with existing = true and writes nothing.
CREATE FUNCTION cassette_post(
    p_run_id text, p_source text, p_idempotency_key text, p_payload_json text,
    p_intents text[], p_step_counts integer[], p_step_payloads text[],
    OUT message_id bigint, OUT job_id bigint, OUT existing boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    earlier cassette_messages;
    job_ordinal integer;
    this_job bigint;
    offset_in integer := 0;
BEGIN
    PERFORM cassette_tx_ms();
    existing := false;
    IF p_idempotency_key IS NOT NULL THEN
        SELECT * INTO earlier FROM cassette_messages m
        WHERE m.run_id = p_run_id AND m.idempotency_key = p_idempotency_key;
        IF FOUND THEN
            IF earlier.source IS DISTINCT FROM p_source OR earlier.payload_json IS DISTINCT FROM p_payload_json THEN
                RAISE EXCEPTION USING
                    MESSAGE = 'IDEMPOTENCY_CONFLICT: this run_id and idempotency_key were posted with another payload or source',
                    DETAIL = earlier.message_id::text;
            END IF;
            message_id := earlier.message_id;
            SELECT j.job_id INTO job_id FROM cassette_jobs j
            WHERE j.message_id = earlier.message_id ORDER BY j.ordinal LIMIT 1;
            existing := true;
            RETURN;
        END IF;
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

-- Lease up to n of the run's PENDING steps in claim order, each expiring ttl_ms after
-- the transaction's time. Locked rows (another claim under way) are skipped.
CREATE FUNCTION cassette_claim(p_run_id text, p_worker_id text, p_n integer, p_ttl_ms bigint)
RETURNS TABLE (step_id bigint, job_id bigint, message_id bigint, ordinal bigint,
               payload_json text, fencing_token bigint, lease_expires_at bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    now_ms bigint := cassette_tx_ms();
BEGIN
    IF p_n IS NULL OR p_n < 1 THEN
        RAISE EXCEPTION 'INVALID_ARGUMENT: n must be at least 1';
    END IF;
    IF p_ttl_ms IS NULL OR p_ttl_ms < 1 OR p_ttl_ms > 2592000000 THEN
        RAISE EXCEPTION 'INVALID_TTL: a lease lasts 1 ms to 30 days';
    END IF;
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

-- The step's one receipt, which commits it (the receipts trigger); its id.
CREATE FUNCTION cassette_complete(p_run_id text, p_step_id bigint, p_worker_id text,
                                  p_fencing_token bigint, p_outcome text, p_receipt_json text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    made bigint;
BEGIN
    PERFORM cassette_tx_ms();
    INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id, fencing_token, outcome, receipt_json)
    SELECT s.step_id, s.job_id, p_run_id, p_worker_id, p_fencing_token, p_outcome, p_receipt_json
    FROM cassette_steps s WHERE s.step_id = p_step_id
    RETURNING receipt_id INTO made;
    IF made IS NULL THEN
        RAISE EXCEPTION 'STEP_NOT_FOUND: no step %', p_step_id;
    END IF;
    RETURN made;
END $$;

-- The lease holder gives its step back before expiry (the releases trigger requeues it).
CREATE FUNCTION cassette_release(p_run_id text, p_step_id bigint, p_worker_id text,
                                 p_fencing_token bigint)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    PERFORM cassette_tx_ms();
    INSERT INTO cassette_releases (step_id, run_id, worker_id, fencing_token)
    VALUES (p_step_id, p_run_id, p_worker_id, p_fencing_token);
END $$;

-- Expired leases of the run (or of one step) back to PENDING; with max_attempts a step
-- whose token has reached it is closed by an ABORTED receipt instead.
CREATE FUNCTION cassette_requeue(p_run_id text, p_step_id bigint, p_max_attempts bigint)
RETURNS TABLE (step_id bigint, action text, fencing_token bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    now_ms bigint := cassette_tx_ms();
    one cassette_steps;
BEGIN
    IF p_max_attempts IS NOT NULL AND p_max_attempts < 1 THEN
        RAISE EXCEPTION 'INVALID_ARGUMENT: max_attempts must be at least 1';
    END IF;
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

-- Move the ledger's clock forward (never back): the owner's only say over time; tests
-- use it to expire leases without sleeping. No role is granted it.
CREATE FUNCTION cassette_advance_clock(p_ms bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF p_ms IS NULL OR p_ms < 0 THEN
        RAISE EXCEPTION 'INVALID_ARGUMENT: the clock moves forward only';
    END IF;
    UPDATE cassette_head SET clock_offset_ms = clock_offset_ms + p_ms;
    RETURN (SELECT clock_offset_ms FROM cassette_head);
END $$;

REVOKE ALL ON ALL TABLES IN SCHEMA public FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC;
-- The schema version and the head are read by every package connection when it opens
-- (is the ledger current?) and for the ledger's time; reading them gives away nothing.
GRANT SELECT ON cassette_migrations, cassette_head, cassette_meta, cassette_journal,
                cassette_messages, cassette_jobs, cassette_steps, cassette_receipts,
                cassette_releases
   TO cassette_worker, cassette_appender, cassette_auditor;
GRANT EXECUTE ON FUNCTION
    cassette_post(text, text, text, text, text[], integer[], text[]),
    cassette_claim(text, text, integer, bigint),
    cassette_complete(text, bigint, text, bigint, text, text),
    cassette_release(text, bigint, text, bigint),
    cassette_requeue(text, bigint, bigint)
   TO cassette_worker;
