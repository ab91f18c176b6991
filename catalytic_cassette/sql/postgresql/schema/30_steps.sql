-- Steps, receipts and releases: the step machine, its leases and their fencing.
-- PENDING -> LEASED (a claim: lease_owner, lease_expires_at, fencing_token + 1) ->
-- COMMITTED (its receipt's insert) or back to PENDING (a release by the lease holder, or a
-- requeue once the lease expired). A receipt or a release is accepted only from the
-- lease's holder at its current fencing token; a step is never deleted. Every rule of
-- that machine is in this file: the tables' BEFORE triggers (insert, update), the AFTER
-- triggers that commit or requeue the step from its receipt or release, and the
-- SECURITY DEFINER functions a worker calls (70_roles.sql grants them). The signed-claim
-- rules, which refuse an unattested completion, release or requeue of a lease claimed
-- with a key, are in 60_worker_keys.sql.

-- A step: status PENDING, LEASED or COMMITTED (cassette_steps_update is the machine);
-- while LEASED, lease_owner holds it until lease_expires_at, and fencing_token counts its
-- claims, so a holder whose lease was taken over holds a stale token.
CREATE TABLE cassette_steps (
    step_id bigint PRIMARY KEY CHECK (step_id > 0),
    job_id bigint NOT NULL,
    run_id text NOT NULL,
    message_id bigint NOT NULL,
    job_ordinal bigint NOT NULL,
    ordinal bigint NOT NULL,
    status text NOT NULL,
    lease_owner text,
    lease_expires_at bigint,
    fencing_token bigint NOT NULL,
    payload_json text NOT NULL,
    created_at bigint NOT NULL,
    UNIQUE (job_id, ordinal)
);

-- A step's one receipt (SUCCESS, FAILURE or ABORTED): its insert commits the step.
CREATE TABLE cassette_receipts (
    receipt_id bigint PRIMARY KEY CHECK (receipt_id > 0),
    step_id bigint NOT NULL UNIQUE,
    job_id bigint NOT NULL,
    run_id text NOT NULL,
    worker_id text NOT NULL,
    fencing_token bigint NOT NULL,
    outcome text NOT NULL,
    receipt_json text NOT NULL,
    created_at bigint NOT NULL
);

-- A lease given back by its holder before expiry: its insert requeues the step. One per
-- lease (step, token).
CREATE TABLE cassette_releases (
    release_id bigint PRIMARY KEY CHECK (release_id > 0),
    step_id bigint NOT NULL,
    run_id text NOT NULL,
    worker_id text NOT NULL,
    fencing_token bigint NOT NULL,
    created_at bigint NOT NULL,
    UNIQUE (step_id, fencing_token)
);

-- A run's receipts by outcome (status; COMMITTED steps are counted as their receipts).
CREATE INDEX cassette_receipts_by_run ON cassette_receipts (run_id, outcome);

-- The leases due of a run (a requeue, and its check before the head). A claim and a commit
-- change status, a column in a partial index's predicate, so neither is a HOT update and
-- each writes an entry into every index of the table: there is no index by run and
-- status, and status counts PENDING and LEASED steps through these two.
CREATE INDEX cassette_steps_leased ON cassette_steps (run_id, lease_expires_at)
    WHERE status = 'LEASED';

-- The claim order of a run's pending steps, read with FOR UPDATE SKIP LOCKED.
CREATE INDEX cassette_steps_pending ON cassette_steps (run_id, message_id, job_ordinal, ordinal)
    WHERE status = 'PENDING';

-- A worker's claim of up to n PENDING steps of a run, in claim order, each leased for
-- ttl_ms with its token moved on. With nothing PENDING it returns before taking the head
-- (cassette_noop_without_head), writing nothing. plan_cache_mode: the claim's query, its
-- LIMIT a parameter, would otherwise be planned again at every call (PL/pgSQL's plan
-- cache kept choosing a custom plan); its generic plan is the custom one (the PENDING
-- partial index, in claim order).
CREATE FUNCTION cassette_claim(p_run_id text, p_worker_id text, p_n integer, p_ttl_ms bigint)
RETURNS TABLE (step_id bigint, job_id bigint, message_id bigint, ordinal bigint,
               payload_json text, fencing_token bigint, lease_expires_at bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET standard_conforming_strings = on
SET extra_float_digits = 1
SET bytea_output = 'hex'
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    now_ms bigint;
BEGIN
    IF p_n IS NULL OR p_n < 1 THEN
        RAISE EXCEPTION 'INVALID_ARGUMENT: n must be at least 1';
    END IF;
    IF p_ttl_ms IS NULL OR p_ttl_ms < 1 OR p_ttl_ms > 2592000000 THEN
        RAISE EXCEPTION 'INVALID_TTL: a lease lasts 1 ms to 30 days';
    END IF;
    IF cassette_noop_without_head() THEN
        PERFORM FROM cassette_steps s
         WHERE s.run_id = p_run_id AND s.status = 'PENDING'
         ORDER BY s.message_id, s.job_ordinal, s.ordinal LIMIT 1;
        IF NOT FOUND THEN
            RETURN;  -- nothing to claim
        END IF;
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

-- A worker's completion: the receipt's insert, whose trigger takes the head once and
-- checks the lease (STEP_NOT_FOUND, when the INSERT finds no step, is decided without
-- it: a refusal writes nothing).
CREATE FUNCTION cassette_complete(p_run_id text, p_step_id bigint, p_worker_id text,
                                             p_fencing_token bigint, p_outcome text,
                                             p_receipt_json text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET standard_conforming_strings = on
SET extra_float_digits = 1
SET bytea_output = 'hex'
SET enable_seqscan = off
SET jit = off AS $$
DECLARE
    made bigint;
BEGIN
    INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id, fencing_token, outcome, receipt_json)
    SELECT s.step_id, s.job_id, p_run_id, p_worker_id, p_fencing_token, p_outcome, p_receipt_json
    FROM cassette_steps s WHERE s.step_id = p_step_id
    RETURNING receipt_id INTO made;
    IF made IS NULL THEN
        RAISE EXCEPTION 'STEP_NOT_FOUND: no step %', p_step_id;
    END IF;
    RETURN made;
END $$;

-- Complete a step and lease the run's next one in one call, so a worker's fused
-- transaction is one statement (no client round trip while the head is locked).
CREATE FUNCTION cassette_complete_and_claim(
    p_run_id text, p_step_id bigint, p_worker_id text, p_fencing_token bigint,
    p_outcome text, p_receipt_json text, p_ttl_ms bigint)
RETURNS TABLE (receipt_id bigint, step_id bigint, job_id bigint, message_id bigint,
               ordinal bigint, payload_json text, fencing_token bigint, lease_expires_at bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET standard_conforming_strings = on
SET extra_float_digits = 1
SET bytea_output = 'hex' AS $$
BEGIN
    receipt_id := cassette_complete(p_run_id, p_step_id, p_worker_id, p_fencing_token,
                                    p_outcome, p_receipt_json);
    FOR step_id, job_id, message_id, ordinal, payload_json, fencing_token, lease_expires_at IN
        SELECT * FROM cassette_claim(p_run_id, p_worker_id, 1, p_ttl_ms)
    LOOP
        RETURN NEXT;
    END LOOP;
    IF NOT FOUND THEN  -- no step left: the receipt alone
        step_id := NULL;
        RETURN NEXT;
    END IF;
END $$;

-- The lease holder gives its step back before expiry (the releases trigger requeues it).
CREATE FUNCTION cassette_release(p_run_id text, p_step_id bigint, p_worker_id text,
                                 p_fencing_token bigint)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET standard_conforming_strings = on
SET extra_float_digits = 1
SET bytea_output = 'hex'
SET enable_seqscan = off
SET jit = off AS $$
BEGIN
    PERFORM cassette_tx_ms();
    INSERT INTO cassette_releases (step_id, run_id, worker_id, fencing_token)
    VALUES (p_step_id, p_run_id, p_worker_id, p_fencing_token);
END $$;

-- Requeue the run's expired leases (or one named step's), or abort a step past
-- max_attempts with the receipt SQLite's package writes. With no lease of the run due it
-- returns before taking the head, writing nothing.
CREATE FUNCTION cassette_requeue(p_run_id text, p_step_id bigint, p_max_attempts bigint)
RETURNS TABLE (step_id bigint, action text, fencing_token bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET standard_conforming_strings = on
SET extra_float_digits = 1
SET bytea_output = 'hex'
SET enable_seqscan = off
SET jit = off AS $$
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

-- Whether a lease of the run is due at the ledger's time as cassette_tx_ms() would date a
-- writer now (read without taking the head; granted to the worker for its signed path).
CREATE FUNCTION cassette_run_has_lease_due(p_run_id text) RETURNS boolean
LANGUAGE sql VOLATILE
SET search_path = public, pg_temp
SET enable_seqscan = off
SET jit = off AS $$
    SELECT EXISTS (
        SELECT 1 FROM cassette_steps s, cassette_head h
         WHERE s.run_id = p_run_id AND s.status = 'LEASED'
           AND s.lease_expires_at <= greatest(h.time_ms,
                   (floor(extract(epoch FROM clock_timestamp()) * 1000))::bigint + h.clock_offset_ms))
$$;

-- Whether the run has a PENDING step (the claim's check before the head, as a function
-- for the worker's signed path): PL/pgSQL, so its one plan is cached, over the PENDING
-- index in claim order. A SQL function with its own settings is not inlined, and was
-- planned at every call into a scan of every claimed version.
CREATE FUNCTION cassette_run_has_pending(p_run_id text) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = public, pg_temp
SET enable_seqscan = off
SET jit = off AS $$
BEGIN
    PERFORM FROM cassette_steps s
     WHERE s.run_id = p_run_id AND s.status = 'PENDING'
     ORDER BY s.message_id, s.job_ordinal, s.ordinal LIMIT 1;
    RETURN FOUND;
END $$;

-- A receipt commits its step (LEASED -> COMMITTED), after the receipt is journaled.
CREATE FUNCTION cassette_receipts_commit_step() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
BEGIN
    UPDATE cassette_steps SET status = 'COMMITTED' WHERE step_id = NEW.step_id;
    RETURN NULL;
END $$;

-- A receipt's rules, in the order SQLite meets them (so a receipt that breaks several gets
-- the same code): the lease's holder, at its current token, before expiry (an expired
-- lease takes only ABORTED). It takes the head first, then reads the step with a
-- snapshot taken after it holds the head.
CREATE FUNCTION cassette_receipts_insert() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
DECLARE
    now_ms bigint;
    step cassette_steps;
BEGIN
    now_ms := cassette_tx_ms();  -- first: the head's lock makes max() the last id
    NEW.created_at := now_ms;
    NEW.receipt_id := cassette_next_id(NEW.receipt_id, (SELECT coalesce(max(receipt_id), 0) + 1 FROM cassette_receipts));
    IF NOT cassette_name_ok(NEW.worker_id) THEN
        PERFORM cassette_refuse('INVALID_WORKER: worker_id is a string of 1-200 characters');
    END IF;
    IF NEW.outcome IS NULL OR NEW.outcome NOT IN ('SUCCESS', 'FAILURE', 'ABORTED') THEN
        PERFORM cassette_refuse('INVALID_OUTCOME: outcome is SUCCESS, FAILURE or ABORTED');
    END IF;
    SELECT * INTO step FROM cassette_steps WHERE step_id = NEW.step_id;
    IF NOT FOUND THEN
        PERFORM cassette_refuse('STEP_NOT_FOUND: the receipt''s step does not exist');
    END IF;
    IF EXISTS (SELECT 1 FROM cassette_receipts WHERE step_id = NEW.step_id) THEN
        PERFORM cassette_refuse('DUPLICATE_RECEIPT: this step already has its receipt');
    END IF;
    IF NEW.run_id IS DISTINCT FROM step.run_id THEN
        PERFORM cassette_refuse('RUN_MISMATCH: the step belongs to another run');
    END IF;
    IF NEW.job_id IS DISTINCT FROM step.job_id THEN
        PERFORM cassette_refuse('REFERENCE_MISMATCH: a receipt''s job_id must be its step''s job');
    END IF;
    IF step.status IS DISTINCT FROM 'LEASED' THEN
        PERFORM cassette_refuse('NOT_LEASED: only a LEASED step takes a receipt');
    END IF;
    IF NEW.fencing_token IS DISTINCT FROM step.fencing_token THEN
        PERFORM cassette_refuse('STALE_FENCING_TOKEN: the token is not the step''s current token');
    END IF;
    IF NEW.worker_id IS DISTINCT FROM step.lease_owner THEN
        PERFORM cassette_refuse('WRONG_WORKER: only the lease owner completes a step');
    END IF;
    IF NEW.outcome IS DISTINCT FROM 'ABORTED' AND step.lease_expires_at <= now_ms THEN
        PERFORM cassette_refuse('LEASE_EXPIRED: the lease expired before the receipt; only ABORTED is accepted');
    END IF;
    IF NOT cassette_readable_object(NEW.receipt_json) THEN
        PERFORM cassette_refuse('INVALID_PAYLOAD: the receipt is a JSON object the API can read back');
    END IF;
    RETURN NEW;
END $$;

-- AFTER triggers of one event fire in name order: the receipt is journaled (1) before
-- the step it commits (2), as on SQLite.
CREATE FUNCTION cassette_receipts_journal() RETURNS trigger
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
BEGIN
    PERFORM cassette_journal_append(TG_TABLE_NAME, TG_OP, cassette_j(NEW.receipt_id),
        '{"receipt_id":' || cassette_j(NEW.receipt_id) || ',"step_id":' || cassette_j(NEW.step_id)
        || ',"job_id":' || cassette_j(NEW.job_id) || ',"run_id":' || cassette_j(NEW.run_id)
        || ',"worker_id":' || cassette_j(NEW.worker_id) || ',"fencing_token":' || cassette_j(NEW.fencing_token)
        || ',"outcome":' || cassette_j(NEW.outcome) || ',"receipt_json":' || cassette_j(NEW.receipt_json)
        || ',"created_at":' || cassette_j(NEW.created_at) || '}');
    RETURN NULL;
END $$;

-- A release's rules: the lease's holder, at its current token, before expiry.
CREATE FUNCTION cassette_releases_insert() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
DECLARE
    now_ms bigint;
    step cassette_steps;
BEGIN
    now_ms := cassette_tx_ms();  -- first: the head's lock makes max() the last id
    NEW.created_at := now_ms;
    NEW.release_id := cassette_next_id(NEW.release_id, (SELECT coalesce(max(release_id), 0) + 1 FROM cassette_releases));
    IF NOT cassette_name_ok(NEW.worker_id) THEN
        PERFORM cassette_refuse('INVALID_WORKER: worker_id is a string of 1-200 characters');
    END IF;
    IF EXISTS (SELECT 1 FROM cassette_releases
               WHERE step_id = NEW.step_id AND fencing_token = NEW.fencing_token) THEN
        PERFORM cassette_refuse('APPEND_ONLY: a release of this step with this token exists');
    END IF;
    SELECT * INTO step FROM cassette_steps WHERE step_id = NEW.step_id;
    IF NOT FOUND THEN
        PERFORM cassette_refuse('STEP_NOT_FOUND: the released step does not exist');
    END IF;
    IF NEW.run_id IS DISTINCT FROM step.run_id THEN
        PERFORM cassette_refuse('RUN_MISMATCH: the step belongs to another run');
    END IF;
    IF step.status IS DISTINCT FROM 'LEASED' THEN
        PERFORM cassette_refuse('NOT_LEASED: only a LEASED step can be released');
    END IF;
    IF NEW.fencing_token IS DISTINCT FROM step.fencing_token THEN
        PERFORM cassette_refuse('STALE_FENCING_TOKEN: the token is not the step''s current token');
    END IF;
    IF NEW.worker_id IS DISTINCT FROM step.lease_owner THEN
        PERFORM cassette_refuse('WRONG_WORKER: only the lease owner releases a step');
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION cassette_releases_journal() RETURNS trigger
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
BEGIN
    PERFORM cassette_journal_append(TG_TABLE_NAME, TG_OP, cassette_j(NEW.release_id),
        '{"release_id":' || cassette_j(NEW.release_id) || ',"step_id":' || cassette_j(NEW.step_id)
        || ',"run_id":' || cassette_j(NEW.run_id) || ',"worker_id":' || cassette_j(NEW.worker_id)
        || ',"fencing_token":' || cassette_j(NEW.fencing_token)
        || ',"created_at":' || cassette_j(NEW.created_at) || '}');
    RETURN NULL;
END $$;

-- A release requeues its step (LEASED -> PENDING), after the release is journaled.
CREATE FUNCTION cassette_releases_requeue_step() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
BEGIN
    UPDATE cassette_steps SET status = 'PENDING', lease_owner = NULL, lease_expires_at = NULL
    WHERE step_id = NEW.step_id;
    RETURN NULL;
END $$;

-- A step is inserted PENDING, with token 0, no lease, under its job and message.
CREATE FUNCTION cassette_steps_insert() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
DECLARE
    now_ms bigint;
    job cassette_jobs;
BEGIN
    now_ms := cassette_tx_ms();  -- first: the head's lock makes max() the last id
    NEW.created_at := now_ms;
    NEW.step_id := cassette_next_id(NEW.step_id, (SELECT coalesce(max(step_id), 0) + 1 FROM cassette_steps));
    IF NEW.status IS DISTINCT FROM 'PENDING' THEN
        PERFORM cassette_refuse('ILLEGAL_TRANSITION: a step is inserted as PENDING');
    END IF;
    IF NEW.fencing_token IS DISTINCT FROM 0 OR NEW.lease_owner IS NOT NULL
       OR NEW.lease_expires_at IS NOT NULL THEN
        PERFORM cassette_refuse('LEASE_FIELDS_LOCKED: a step is inserted with token 0 and no lease');
    END IF;
    IF NEW.ordinal IS NULL OR NEW.ordinal < 0 THEN
        PERFORM cassette_refuse('INVALID_ORDINAL: ordinal is a non-negative integer');
    END IF;
    IF EXISTS (SELECT 1 FROM cassette_steps WHERE job_id = NEW.job_id AND ordinal = NEW.ordinal) THEN
        PERFORM cassette_refuse('APPEND_ONLY: a step with this job_id and ordinal exists');
    END IF;
    SELECT * INTO job FROM cassette_jobs WHERE job_id = NEW.job_id;
    IF NOT FOUND THEN
        PERFORM cassette_refuse('REFERENCE_MISSING: the step''s job does not exist');
    END IF;
    IF NEW.run_id IS DISTINCT FROM job.run_id THEN
        PERFORM cassette_refuse('RUN_MISMATCH: a step''s run_id must equal its job''s run_id');
    END IF;
    IF NEW.message_id IS DISTINCT FROM job.message_id OR NEW.job_ordinal IS DISTINCT FROM job.ordinal THEN
        PERFORM cassette_refuse('REFERENCE_MISMATCH: a step''s message_id and job_ordinal must equal its job''s');
    END IF;
    IF NOT cassette_readable_object(NEW.payload_json) THEN
        PERFORM cassette_refuse('INVALID_PAYLOAD: the payload is a JSON object the API can read back');
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION cassette_steps_journal() RETURNS trigger
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
BEGIN
    PERFORM cassette_journal_append(TG_TABLE_NAME, TG_OP, cassette_j(NEW.step_id),
        '{"step_id":' || cassette_j(NEW.step_id) || ',"job_id":' || cassette_j(NEW.job_id)
        || ',"run_id":' || cassette_j(NEW.run_id) || ',"message_id":' || cassette_j(NEW.message_id)
        || ',"job_ordinal":' || cassette_j(NEW.job_ordinal) || ',"ordinal":' || cassette_j(NEW.ordinal)
        || ',"status":' || cassette_j(NEW.status) || ',"lease_owner":' || cassette_j(NEW.lease_owner)
        || ',"lease_expires_at":' || cassette_j(NEW.lease_expires_at)
        || ',"fencing_token":' || cassette_j(NEW.fencing_token)
        || ',"payload_json":' || cassette_j(NEW.payload_json) || ',"created_at":' || cassette_j(NEW.created_at) || '}');
    RETURN NULL;
END $$;

-- The step machine: the only transitions are a claim (PENDING -> LEASED, the token moved
-- on by one), a commit (LEASED -> COMMITTED, only from its receipt's insert) and a
-- requeue (LEASED -> PENDING, once the lease expired or was released; a lease claimed
-- signed is requeued only with an attestation, 60_worker_keys.sql). Nothing else of a
-- step changes.
CREATE FUNCTION cassette_steps_update() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
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
        -- The requeue's signature rule (60_worker_keys.sql): the last check of the
        -- requeue, inside the guard rather than a trigger with a WHEN condition, which the
        -- server would parse again at every statement that updates the table.
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

-- Each table's triggers of one timing and event fire in name order: the numbered names
-- journal a receipt (1) before it commits its step (2), and a release (1) before it
-- requeues its step (2), so the journal holds the cause before its effect, as on SQLite.
CREATE TRIGGER cassette_receipts_1_journal AFTER INSERT ON cassette_receipts
    FOR EACH ROW EXECUTE FUNCTION cassette_receipts_journal();

CREATE TRIGGER cassette_receipts_2_commit_step AFTER INSERT ON cassette_receipts
    FOR EACH ROW EXECUTE FUNCTION cassette_receipts_commit_step();

CREATE TRIGGER cassette_receipts_insert BEFORE INSERT ON cassette_receipts
    FOR EACH ROW EXECUTE FUNCTION cassette_receipts_insert();

CREATE TRIGGER cassette_receipts_no_change BEFORE UPDATE OR DELETE ON cassette_receipts
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_receipts_no_truncate BEFORE TRUNCATE ON cassette_receipts
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_releases_1_journal AFTER INSERT ON cassette_releases
    FOR EACH ROW EXECUTE FUNCTION cassette_releases_journal();

CREATE TRIGGER cassette_releases_2_requeue_step AFTER INSERT ON cassette_releases
    FOR EACH ROW EXECUTE FUNCTION cassette_releases_requeue_step();

CREATE TRIGGER cassette_releases_insert BEFORE INSERT ON cassette_releases
    FOR EACH ROW EXECUTE FUNCTION cassette_releases_insert();

CREATE TRIGGER cassette_releases_no_change BEFORE UPDATE OR DELETE ON cassette_releases
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_releases_no_truncate BEFORE TRUNCATE ON cassette_releases
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_steps_insert BEFORE INSERT ON cassette_steps
    FOR EACH ROW EXECUTE FUNCTION cassette_steps_insert();

CREATE TRIGGER cassette_steps_journal AFTER INSERT OR UPDATE ON cassette_steps
    FOR EACH ROW EXECUTE FUNCTION cassette_steps_journal();

CREATE TRIGGER cassette_steps_no_delete BEFORE DELETE ON cassette_steps
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_steps_no_truncate BEFORE TRUNCATE ON cassette_steps
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_steps_update BEFORE UPDATE ON cassette_steps
    FOR EACH ROW EXECUTE FUNCTION cassette_steps_update();
