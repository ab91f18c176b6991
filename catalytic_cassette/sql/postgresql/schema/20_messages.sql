-- Messages and the jobs they declare. A message is posted once per (run_id,
-- idempotency_key); its jobs and their steps are written with it, in one transaction
-- (cassette_post), and never change afterwards.

CREATE TABLE cassette_messages (
    message_id bigint PRIMARY KEY CHECK (message_id > 0),
    run_id text NOT NULL,
    source text NOT NULL,
    idempotency_key text,
    payload_json text NOT NULL,
    created_at bigint NOT NULL,
    UNIQUE (run_id, idempotency_key)
);

CREATE TABLE cassette_jobs (
    job_id bigint PRIMARY KEY CHECK (job_id > 0),
    message_id bigint NOT NULL,
    run_id text NOT NULL,
    intent text NOT NULL,
    ordinal bigint NOT NULL,
    created_at bigint NOT NULL,
    UNIQUE (message_id, ordinal)
);

CREATE FUNCTION cassette_post(
    p_run_id text, p_source text, p_idempotency_key text, p_payload_json text,
    p_intents text[], p_step_counts integer[], p_step_payloads text[],
    OUT message_id bigint, OUT job_id bigint, OUT existing boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET standard_conforming_strings = on
SET extra_float_digits = 1
SET bytea_output = 'hex'
SET enable_seqscan = off
SET jit = off AS $$
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

-- The committed message a post under this run and key repeats, if any: its id, its first
-- job's, and whether source and payload are the same (else IDEMPOTENCY_CONFLICT). Read by
-- cassette_post before the head and under it, and by the package's signed post.
CREATE FUNCTION cassette_posted_under_key(
    p_run_id text, p_idempotency_key text, p_source text, p_payload_json text,
    OUT message_id bigint, OUT job_id bigint, OUT same boolean)
LANGUAGE plpgsql STABLE
SET search_path = public, pg_temp
SET enable_seqscan = off
SET jit = off AS $$
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

CREATE FUNCTION cassette_jobs_insert() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
DECLARE
    now_ms bigint;
    message cassette_messages;
BEGIN
    now_ms := cassette_tx_ms();  -- first: the head's lock makes max() the last id
    NEW.created_at := now_ms;
    NEW.job_id := cassette_next_id(NEW.job_id, (SELECT coalesce(max(job_id), 0) + 1 FROM cassette_jobs));
    IF NOT cassette_name_ok(NEW.intent) THEN
        PERFORM cassette_refuse('INVALID_INTENT: intent is a string of 1-200 characters');
    END IF;
    IF NEW.ordinal IS NULL OR NEW.ordinal < 0 THEN
        PERFORM cassette_refuse('INVALID_ORDINAL: ordinal is a non-negative integer');
    END IF;
    IF EXISTS (SELECT 1 FROM cassette_jobs WHERE message_id = NEW.message_id AND ordinal = NEW.ordinal) THEN
        PERFORM cassette_refuse('APPEND_ONLY: a job with this message_id and ordinal exists');
    END IF;
    SELECT * INTO message FROM cassette_messages WHERE message_id = NEW.message_id;
    IF NOT FOUND THEN
        PERFORM cassette_refuse('REFERENCE_MISSING: the job''s message does not exist');
    END IF;
    IF NEW.run_id IS DISTINCT FROM message.run_id THEN
        PERFORM cassette_refuse('RUN_MISMATCH: a job''s run_id must equal its message''s run_id');
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION cassette_jobs_journal() RETURNS trigger
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
BEGIN
    PERFORM cassette_journal_append(TG_TABLE_NAME, TG_OP, cassette_j(NEW.job_id),
        '{"job_id":' || cassette_j(NEW.job_id) || ',"message_id":' || cassette_j(NEW.message_id)
        || ',"run_id":' || cassette_j(NEW.run_id) || ',"intent":' || cassette_j(NEW.intent)
        || ',"ordinal":' || cassette_j(NEW.ordinal) || ',"created_at":' || cassette_j(NEW.created_at) || '}');
    RETURN NULL;
END $$;

CREATE FUNCTION cassette_messages_insert() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
DECLARE
    now_ms bigint;
BEGIN
    now_ms := cassette_tx_ms();  -- first: the head's lock makes max() the last id
    NEW.created_at := now_ms;
    NEW.message_id := cassette_next_id(NEW.message_id, (SELECT coalesce(max(message_id), 0) + 1 FROM cassette_messages));
    IF NOT cassette_name_ok(NEW.run_id) THEN
        PERFORM cassette_refuse('INVALID_RUN_ID: run_id is a string of 1-200 characters');
    END IF;
    IF NEW.source IS NULL OR NEW.source NOT IN ('USER', 'PLANNER', 'SYSTEM', 'WORKER') THEN
        PERFORM cassette_refuse('INVALID_SOURCE: source is USER, PLANNER, SYSTEM or WORKER');
    END IF;
    IF NEW.idempotency_key IS NOT NULL AND NOT cassette_name_ok(NEW.idempotency_key) THEN
        PERFORM cassette_refuse('INVALID_IDEMPOTENCY_KEY: idempotency_key is a string of 1-200 characters');
    END IF;
    IF NOT cassette_readable_object(NEW.payload_json) THEN
        PERFORM cassette_refuse('INVALID_PAYLOAD: the payload is a JSON object the API can read back');
    END IF;
    IF NEW.idempotency_key IS NOT NULL AND EXISTS (
        SELECT 1 FROM cassette_messages
        WHERE run_id = NEW.run_id AND idempotency_key = NEW.idempotency_key) THEN
        PERFORM cassette_refuse('IDEMPOTENCY_CONFLICT: a message with this run_id and idempotency_key exists');
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION cassette_messages_journal() RETURNS trigger
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
BEGIN
    PERFORM cassette_journal_append(TG_TABLE_NAME, TG_OP, cassette_j(NEW.message_id),
        '{"message_id":' || cassette_j(NEW.message_id) || ',"run_id":' || cassette_j(NEW.run_id)
        || ',"source":' || cassette_j(NEW.source) || ',"idempotency_key":' || cassette_j(NEW.idempotency_key)
        || ',"payload_json":' || cassette_j(NEW.payload_json) || ',"created_at":' || cassette_j(NEW.created_at) || '}');
    RETURN NULL;
END $$;

CREATE TRIGGER cassette_jobs_insert BEFORE INSERT ON cassette_jobs
    FOR EACH ROW EXECUTE FUNCTION cassette_jobs_insert();

CREATE TRIGGER cassette_jobs_journal AFTER INSERT ON cassette_jobs
    FOR EACH ROW EXECUTE FUNCTION cassette_jobs_journal();

CREATE TRIGGER cassette_jobs_no_change BEFORE UPDATE OR DELETE ON cassette_jobs
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_jobs_no_truncate BEFORE TRUNCATE ON cassette_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_messages_insert BEFORE INSERT ON cassette_messages
    FOR EACH ROW EXECUTE FUNCTION cassette_messages_insert();

CREATE TRIGGER cassette_messages_journal AFTER INSERT ON cassette_messages
    FOR EACH ROW EXECUTE FUNCTION cassette_messages_journal();

CREATE TRIGGER cassette_messages_no_change BEFORE UPDATE OR DELETE ON cassette_messages
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_messages_no_truncate BEFORE TRUNCATE ON cassette_messages
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();
