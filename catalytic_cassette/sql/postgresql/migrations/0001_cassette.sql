-- The message cassette on PostgreSQL: the same law as the SQLite ledger (LAW.md), held
-- by the server for every session. Differences from SQLite, and why:
--   * The journal is written by the server's own triggers with its own sha256(); no
--     function a client registers is involved, so every session journals.
--   * Time is the server's clock (plus a forward-only offset only the owner can move),
--     read once per transaction by cassette_tx_ms(), which also locks the one-row head:
--     every write transaction serializes on it, so ids stay dense and the chain linear.
--   * Ids and created_at are assigned by the BEFORE INSERT triggers, not the client.
--   * Refusals are RAISE EXCEPTION 'CODE: text' (SQLSTATE P0001), the codes of LAW.md.
-- Bodies, leaf and chain hashes are byte-identical to the SQLite ledger's for the same
-- rows: each body is concatenated here with the same key order and JSON text SQLite's
-- json_object() writes (json_build_object would add spaces).

-- What the ledger is, and which: format, and ledger_id (32 hex digits, random, as on
-- SQLite), the name seals and attestations bind to ("catalytic-cassette/ledger/<id>").
CREATE TABLE cassette_meta (
    key text PRIMARY KEY CHECK (key IN ('format', 'ledger_id')),
    value text NOT NULL CHECK (key <> 'ledger_id' OR value ~ '^[0-9a-f]{32}$')
);
INSERT INTO cassette_meta (key, value)
VALUES ('format', 'catalytic-cassette'), ('ledger_id', replace(gen_random_uuid()::text, '-', ''));

CREATE TABLE cassette_head (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    next_seq bigint NOT NULL CHECK (next_seq >= 0),
    chain_hash bytea NOT NULL CHECK (length(chain_hash) = 32),
    time_ms bigint NOT NULL,
    tx xid8,
    clock_offset_ms bigint NOT NULL DEFAULT 0 CHECK (clock_offset_ms >= 0)
);
INSERT INTO cassette_head (next_seq, chain_hash, time_ms)
VALUES (0, '\x0000000000000000000000000000000000000000000000000000000000000000', 0);

CREATE TABLE cassette_journal (
    seq bigint PRIMARY KEY CHECK (seq >= 0),
    body text NOT NULL,
    leaf_hash bytea NOT NULL CHECK (length(leaf_hash) = 32),
    chain_hash bytea NOT NULL CHECK (length(chain_hash) = 32),
    tbl text NOT NULL,
    row_key text NOT NULL
);
CREATE INDEX cassette_journal_by_row ON cassette_journal (tbl, row_key);

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
-- The claim order of a run's pending steps, read with FOR UPDATE SKIP LOCKED.
CREATE INDEX cassette_steps_pending ON cassette_steps (run_id, message_id, job_ordinal, ordinal)
    WHERE status = 'PENDING';
CREATE INDEX cassette_steps_by_run_status ON cassette_steps (run_id, status);

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
CREATE INDEX cassette_receipts_by_run ON cassette_receipts (run_id, outcome);

CREATE TABLE cassette_releases (
    release_id bigint PRIMARY KEY CHECK (release_id > 0),
    step_id bigint NOT NULL,
    run_id text NOT NULL,
    worker_id text NOT NULL,
    fencing_token bigint NOT NULL,
    created_at bigint NOT NULL,
    UNIQUE (step_id, fencing_token)
);

-- ------------------------------------------------------------------- time and head

-- The transaction's time: the later of the server's clock (plus the owner's forward
-- offset) and the latest time the ledger holds, fixed at the transaction's first call.
-- The UPDATE locks the head row until commit: the serialization point of every writer.
CREATE FUNCTION cassette_tx_ms() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    UPDATE cassette_head
       SET time_ms = CASE WHEN tx = pg_current_xact_id() THEN time_ms
                          ELSE greatest(time_ms, (floor(extract(epoch FROM clock_timestamp()) * 1000))::bigint
                                                 + clock_offset_ms) END,
           tx = pg_current_xact_id()
    RETURNING time_ms
$$;

-- The JSON text SQLite's json_object() writes for a text or integer value.
CREATE FUNCTION cassette_j(value text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT coalesce(to_json(value)::text, 'null') $$;

CREATE FUNCTION cassette_j(value bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT coalesce(value::text, 'null') $$;

-- Append one entry: body {"table":T,"op":O,"key":K,"row":R}, leaf = SHA-256(0x00||body),
-- chain = SHA-256(0x02 || seq as 8-byte big-endian || previous chain || leaf).
CREATE FUNCTION cassette_journal_append(tbl text, op text, row_key text, row_json text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    body text := '{"table":' || cassette_j(tbl) || ',"op":' || cassette_j(op)
                 || ',"key":' || row_key || ',"row":' || row_json || '}';
    leaf bytea := sha256('\x00'::bytea || convert_to(body, 'UTF8'));
    entry_seq bigint;
    chain bytea;
BEGIN
    -- Every journaled write's BEFORE trigger has taken the head (cassette_tx_ms()); the
    -- journal's guard refuses an entry in a transaction that has not.
    UPDATE cassette_head
       SET next_seq = next_seq + 1,
           chain_hash = sha256('\x02'::bytea || int8send(next_seq) || chain_hash || leaf)
    RETURNING next_seq - 1, chain_hash INTO entry_seq, chain;
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash, tbl, row_key)
    VALUES (entry_seq, body, leaf, chain, tbl, row_key);
END $$;

-- ------------------------------------------------------------------------ checks

-- JSON the API can read back, as the SQLite rules define it: a JSON object, no number
-- beyond a 64-bit integer or a finite double, nesting no deeper than 1024, no lone
-- surrogate (jsonb refuses those when it parses).
CREATE FUNCTION cassette_readable_object(doc text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    parsed jsonb;
BEGIN
    BEGIN
        parsed := doc::jsonb;
    EXCEPTION WHEN others THEN
        RETURN false;
    END;
    IF jsonb_typeof(parsed) IS DISTINCT FROM 'object' THEN
        RETURN false;
    END IF;
    IF doc ~ '[0-9][eE]' OR doc ~ '[0-9]{19}' THEN
        IF EXISTS (SELECT 1 FROM jsonb_path_query(parsed, 'strict $.** ? (@.type() == "number")') n
                   WHERE CASE WHEN n::text ~ '^-?[0-9]+$'
                              THEN n::text::numeric NOT BETWEEN -9223372036854775808 AND 9223372036854775807
                              ELSE abs(n::text::numeric) > 1.7976931348623157e308 END) THEN
            RETURN false;
        END IF;
    END IF;
    IF length(doc) > 2048 AND jsonb_path_exists(parsed, 'strict $.**{1024 to last}') THEN
        RETURN false;
    END IF;
    RETURN true;
END $$;

CREATE FUNCTION cassette_refuse(message text) RETURNS void
LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION USING MESSAGE = message; END $$;

CREATE FUNCTION cassette_name_ok(value text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$ SELECT value IS NOT NULL AND length(value) BETWEEN 1 AND 200 $$;

-- A row's id is the next of its table's dense ids, assigned under the head's lock; a
-- client that names another id is refused as on SQLite.
CREATE FUNCTION cassette_next_id(given bigint, next_id bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF given IS NOT NULL AND given IS DISTINCT FROM next_id THEN
        RAISE EXCEPTION 'OUT_OF_ORDER: ids are dense: an id must follow the last one';
    END IF;
    RETURN next_id;
END $$;

-- ---------------------------------------------------------------- append-only

CREATE FUNCTION cassette_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING MESSAGE = format('APPEND_ONLY: %s rows cannot be %s',
        TG_TABLE_NAME, CASE TG_OP WHEN 'UPDATE' THEN 'updated' WHEN 'DELETE' THEN 'deleted'
                                  ELSE 'truncated' END);
END $$;

-- A ledger's identity is fixed by its first entry: until then its ledger_id may be
-- replaced (a copy takes its source's, so the source's seals name it too); never after.
CREATE FUNCTION cassette_meta_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.key = 'ledger_id' AND NEW.key = 'ledger_id'
       AND (SELECT next_seq FROM cassette_head) = 0 THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION USING MESSAGE = format('APPEND_ONLY: cassette_meta rows cannot be %s',
        CASE TG_OP WHEN 'UPDATE' THEN 'updated' ELSE 'deleted' END);
END $$;
CREATE TRIGGER cassette_meta_no_change BEFORE UPDATE OR DELETE ON cassette_meta
    FOR EACH ROW EXECUTE FUNCTION cassette_meta_guard();
CREATE TRIGGER cassette_journal_no_change BEFORE UPDATE OR DELETE ON cassette_journal
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();
CREATE TRIGGER cassette_messages_no_change BEFORE UPDATE OR DELETE ON cassette_messages
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();
CREATE TRIGGER cassette_jobs_no_change BEFORE UPDATE OR DELETE ON cassette_jobs
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();
CREATE TRIGGER cassette_steps_no_delete BEFORE DELETE ON cassette_steps
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();
CREATE TRIGGER cassette_receipts_no_change BEFORE UPDATE OR DELETE ON cassette_receipts
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();
CREATE TRIGGER cassette_releases_no_change BEFORE UPDATE OR DELETE ON cassette_releases
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();
-- TRUNCATE fires no row trigger: a statement trigger refuses it.
CREATE TRIGGER cassette_meta_no_truncate BEFORE TRUNCATE ON cassette_meta
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();
CREATE TRIGGER cassette_head_no_truncate BEFORE TRUNCATE ON cassette_head
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();
CREATE TRIGGER cassette_journal_no_truncate BEFORE TRUNCATE ON cassette_journal
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();
CREATE TRIGGER cassette_messages_no_truncate BEFORE TRUNCATE ON cassette_messages
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();
CREATE TRIGGER cassette_jobs_no_truncate BEFORE TRUNCATE ON cassette_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();
CREATE TRIGGER cassette_steps_no_truncate BEFORE TRUNCATE ON cassette_steps
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();
CREATE TRIGGER cassette_receipts_no_truncate BEFORE TRUNCATE ON cassette_receipts
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();
CREATE TRIGGER cassette_releases_no_truncate BEFORE TRUNCATE ON cassette_releases
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();

-- The head moves only by the journal's own functions, one entry at a time, and its
-- clock offset only forward.
CREATE FUNCTION cassette_head_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' OR TG_OP = 'INSERT' THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: the journal head is one row, never inserted or deleted';
    END IF;
    IF NEW.next_seq IS DISTINCT FROM OLD.next_seq AND NEW.next_seq IS DISTINCT FROM OLD.next_seq + 1 THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: the head moves one entry at a time';
    END IF;
    IF NEW.time_ms < OLD.time_ms THEN
        RAISE EXCEPTION 'TIME_BACKWARDS: the ledger''s time never runs back';
    END IF;
    IF NEW.clock_offset_ms < OLD.clock_offset_ms THEN
        RAISE EXCEPTION 'TIME_BACKWARDS: the clock offset only moves forward';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER cassette_head_guard BEFORE INSERT OR UPDATE OR DELETE ON cassette_head
    FOR EACH ROW EXECUTE FUNCTION cassette_head_guard();

-- An entry is appended only at the head, linked to it, with its own hashes.
CREATE FUNCTION cassette_journal_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    head cassette_head;
    prev bytea;
BEGIN
    SELECT * INTO head FROM cassette_head;
    IF NEW.seq IS DISTINCT FROM head.next_seq - 1 OR head.tx IS DISTINCT FROM pg_current_xact_id() THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: entries are appended by the journal''s triggers only';
    END IF;
    prev := coalesce((SELECT chain_hash FROM cassette_journal WHERE seq = NEW.seq - 1),
                     '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea);
    IF NEW.leaf_hash IS DISTINCT FROM sha256('\x00'::bytea || convert_to(NEW.body, 'UTF8'))
       OR NEW.chain_hash IS DISTINCT FROM sha256('\x02'::bytea || int8send(NEW.seq) || prev || NEW.leaf_hash)
       OR NEW.chain_hash IS DISTINCT FROM head.chain_hash THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: an entry''s leaf and chain hashes are computed from its body';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER cassette_journal_guard BEFORE INSERT ON cassette_journal
    FOR EACH ROW EXECUTE FUNCTION cassette_journal_guard();

-- ---------------------------------------------------------------------- messages

CREATE FUNCTION cassette_messages_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
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
CREATE TRIGGER cassette_messages_insert BEFORE INSERT ON cassette_messages
    FOR EACH ROW EXECUTE FUNCTION cassette_messages_insert();

CREATE FUNCTION cassette_messages_journal() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cassette_journal_append(TG_TABLE_NAME, TG_OP, cassette_j(NEW.message_id),
        '{"message_id":' || cassette_j(NEW.message_id) || ',"run_id":' || cassette_j(NEW.run_id)
        || ',"source":' || cassette_j(NEW.source) || ',"idempotency_key":' || cassette_j(NEW.idempotency_key)
        || ',"payload_json":' || cassette_j(NEW.payload_json) || ',"created_at":' || cassette_j(NEW.created_at) || '}');
    RETURN NULL;
END $$;
CREATE TRIGGER cassette_messages_journal AFTER INSERT ON cassette_messages
    FOR EACH ROW EXECUTE FUNCTION cassette_messages_journal();

-- -------------------------------------------------------------------------- jobs

CREATE FUNCTION cassette_jobs_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
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
CREATE TRIGGER cassette_jobs_insert BEFORE INSERT ON cassette_jobs
    FOR EACH ROW EXECUTE FUNCTION cassette_jobs_insert();

CREATE FUNCTION cassette_jobs_journal() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cassette_journal_append(TG_TABLE_NAME, TG_OP, cassette_j(NEW.job_id),
        '{"job_id":' || cassette_j(NEW.job_id) || ',"message_id":' || cassette_j(NEW.message_id)
        || ',"run_id":' || cassette_j(NEW.run_id) || ',"intent":' || cassette_j(NEW.intent)
        || ',"ordinal":' || cassette_j(NEW.ordinal) || ',"created_at":' || cassette_j(NEW.created_at) || '}');
    RETURN NULL;
END $$;
CREATE TRIGGER cassette_jobs_journal AFTER INSERT ON cassette_jobs
    FOR EACH ROW EXECUTE FUNCTION cassette_jobs_journal();

-- ------------------------------------------------------------------------- steps

CREATE FUNCTION cassette_steps_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
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
CREATE TRIGGER cassette_steps_insert BEFORE INSERT ON cassette_steps
    FOR EACH ROW EXECUTE FUNCTION cassette_steps_insert();

-- The allow-listed state machine: PENDING->LEASED (claim), LEASED->COMMITTED (only by
-- its receipt), LEASED->PENDING (requeue after expiry, or the holder's release).
CREATE FUNCTION cassette_steps_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    now_ms bigint := cassette_tx_ms();
BEGIN
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
CREATE TRIGGER cassette_steps_update BEFORE UPDATE ON cassette_steps
    FOR EACH ROW EXECUTE FUNCTION cassette_steps_update();

CREATE FUNCTION cassette_steps_journal() RETURNS trigger
LANGUAGE plpgsql AS $$
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
CREATE TRIGGER cassette_steps_journal AFTER INSERT OR UPDATE ON cassette_steps
    FOR EACH ROW EXECUTE FUNCTION cassette_steps_journal();

-- ---------------------------------------------------------------------- receipts

CREATE FUNCTION cassette_receipts_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
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
CREATE TRIGGER cassette_receipts_insert BEFORE INSERT ON cassette_receipts
    FOR EACH ROW EXECUTE FUNCTION cassette_receipts_insert();

-- AFTER triggers of one event fire in name order: the receipt is journaled (1) before
-- the step it commits (2), as on SQLite.
CREATE FUNCTION cassette_receipts_journal() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cassette_journal_append(TG_TABLE_NAME, TG_OP, cassette_j(NEW.receipt_id),
        '{"receipt_id":' || cassette_j(NEW.receipt_id) || ',"step_id":' || cassette_j(NEW.step_id)
        || ',"job_id":' || cassette_j(NEW.job_id) || ',"run_id":' || cassette_j(NEW.run_id)
        || ',"worker_id":' || cassette_j(NEW.worker_id) || ',"fencing_token":' || cassette_j(NEW.fencing_token)
        || ',"outcome":' || cassette_j(NEW.outcome) || ',"receipt_json":' || cassette_j(NEW.receipt_json)
        || ',"created_at":' || cassette_j(NEW.created_at) || '}');
    RETURN NULL;
END $$;
CREATE TRIGGER cassette_receipts_1_journal AFTER INSERT ON cassette_receipts
    FOR EACH ROW EXECUTE FUNCTION cassette_receipts_journal();

CREATE FUNCTION cassette_receipts_commit_step() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cassette_steps SET status = 'COMMITTED' WHERE step_id = NEW.step_id;
    RETURN NULL;
END $$;
CREATE TRIGGER cassette_receipts_2_commit_step AFTER INSERT ON cassette_receipts
    FOR EACH ROW EXECUTE FUNCTION cassette_receipts_commit_step();

-- ---------------------------------------------------------------------- releases

CREATE FUNCTION cassette_releases_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
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
CREATE TRIGGER cassette_releases_insert BEFORE INSERT ON cassette_releases
    FOR EACH ROW EXECUTE FUNCTION cassette_releases_insert();

CREATE FUNCTION cassette_releases_journal() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cassette_journal_append(TG_TABLE_NAME, TG_OP, cassette_j(NEW.release_id),
        '{"release_id":' || cassette_j(NEW.release_id) || ',"step_id":' || cassette_j(NEW.step_id)
        || ',"run_id":' || cassette_j(NEW.run_id) || ',"worker_id":' || cassette_j(NEW.worker_id)
        || ',"fencing_token":' || cassette_j(NEW.fencing_token)
        || ',"created_at":' || cassette_j(NEW.created_at) || '}');
    RETURN NULL;
END $$;
CREATE TRIGGER cassette_releases_1_journal AFTER INSERT ON cassette_releases
    FOR EACH ROW EXECUTE FUNCTION cassette_releases_journal();

CREATE FUNCTION cassette_releases_requeue_step() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cassette_steps SET status = 'PENDING', lease_owner = NULL, lease_expires_at = NULL
    WHERE step_id = NEW.step_id;
    RETURN NULL;
END $$;
CREATE TRIGGER cassette_releases_2_requeue_step AFTER INSERT ON cassette_releases
    FOR EACH ROW EXECUTE FUNCTION cassette_releases_requeue_step();
