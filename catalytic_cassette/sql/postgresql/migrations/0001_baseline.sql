-- The baseline of a PostgreSQL ledger (version 1, the first released schema): the
-- files of sql/postgresql/schema/ joined in their names' order by
-- catalytic_cassette/postgresql/baseline.py. Generated: change the schema files (and, once
-- this is released, add a migration), never this file. The reasons are in the schema
-- files, beside each rule.

-- ==== 10_ledger.sql

-- The ledger: what it is (cassette_meta), the head that is its lock and its clock, and
-- the checks every other concern shares. The same law as the SQLite ledger (LAW.md),
-- held by the server for every session. Differences from SQLite, and why:
--   * The journal is written by the server's own triggers with its own sha256(); no
--     function a client registers is involved, so every session journals.
--   * Time is the server's clock (plus a forward-only offset only the owner can move),
--     read once per transaction by cassette_tx_ms(), which also locks the one-row head:
--     every write transaction serializes on it, so ids stay dense and the chain linear.
--   * Ids and created_at are assigned by the BEFORE INSERT triggers, not the client.
--   * Refusals are RAISE EXCEPTION 'CODE: text' (SQLSTATE P0001), the codes of LAW.md.
-- The files of this folder are applied in their names' order; 70_roles.sql grants.
-- PostgreSQL fires the triggers of one table and event in the order of their names:
-- the names below are part of the law (tests/test_postgres_schema.py pins the order).
--
-- Settings pinned on functions (each function's SET clauses), and why:
--   * search_path = public, pg_temp on every function that is not IMMUTABLE: a function
--     that is not SECURITY DEFINER runs with the search_path of the session that fires
--     it, and a session's temporary schema is searched first for tables unless the path
--     names pg_temp. A temporary table is any session's to make, seen by no other
--     session's catalog check: a trigger reading cassette_head, cassette_journal or
--     cassette_steps by name would read the session's own. pg_catalog comes first
--     (implicitly) and pg_temp last, so it holds no table the path finds first.
--   * enable_seqscan = off and jit = off on the functions that look rows up by key (the
--     functions the roles call and the tables' trigger functions, which run for the
--     owner's own DML too; not on the session, so the clients' own queries plan as they
--     would): a PL/pgSQL function caches its plans for the session, made from the
--     table's statistics, and a table analyzed while small gets sequential scans for its
--     keyed lookups that the session keeps while the table grows. With these settings
--     the key's index is used whatever the statistics say, and a statement the first
--     setting penalizes is not JIT-compiled at every call. (Functions that only read the
--     one-row head, and SQL functions the server inlines into their caller, are not set.)
--   * standard_conforming_strings = on, extra_float_digits = 1, bytea_output = 'hex' on
--     the functions granted to the roles: a session's own settings cannot change how
--     their SQL parses or prints.

-- What the ledger is, and which: format, and ledger_id (32 hex digits, random, as on
-- SQLite), the name seals and attestations bind to ("catalytic-cassette/ledger/<id>").
CREATE TABLE cassette_meta (
    key text PRIMARY KEY CHECK (key IN ('format', 'ledger_id')),
    value text NOT NULL CHECK (key <> 'ledger_id' OR value ~ '^[0-9a-f]{32}$')
);
INSERT INTO cassette_meta (key, value)
VALUES ('format', 'catalytic-cassette'), ('ledger_id', replace(gen_random_uuid()::text, '-', ''));

-- The head: one row, the chain's lock and the ledger's clock. The lock: tx, the
-- transaction that took it (the journal's guard admits an entry only from the
-- transaction stamped here), so every writing transaction serializes on this row and
-- ids stay dense and the chain linear. The clock: time_ms, the latest time the ledger
-- holds, and clock_offset_ms, the owner's forward-only offset. It holds no copy of the
-- journal's end: the journal's guard places and hashes each entry from the journal's
-- last entry, read through the seq's primary key under the head.
-- fillfactor 10: the row is updated twice per writing transaction, and versions a
-- concurrent snapshot can still see cannot be pruned; with a nearly empty page the server
-- prunes it at nearly every visit, so the one-row table stays one page (at the default
-- it grew to 20 pages in 2,000 steps, and every read of the head scanned them all).
CREATE TABLE cassette_head (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    time_ms bigint NOT NULL,
    tx xid8,
    clock_offset_ms bigint NOT NULL DEFAULT 0 CHECK (clock_offset_ms >= 0)
) WITH (fillfactor = 10);
INSERT INTO cassette_head (time_ms) VALUES (0);

-- Move the ledger's clock forward (never back): the owner's only say over time; tests
-- use it to expire leases without sleeping. No role is granted it.
CREATE FUNCTION cassette_advance_clock(p_ms bigint) RETURNS bigint
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
BEGIN
    IF p_ms IS NULL OR p_ms < 0 THEN
        RAISE EXCEPTION 'INVALID_ARGUMENT: the clock moves forward only';
    END IF;
    UPDATE cassette_head SET clock_offset_ms = clock_offset_ms + p_ms;
    RETURN (SELECT clock_offset_ms FROM cassette_head);
END $$;

-- The appender's transaction time, before it writes: a signed action signs the row as
-- stored, its timestamp included, and suggested causes are read at the time of the action
-- they are suggested for. It takes the head, so nothing commits between the read of the
-- suggestions and the insert, and writes nothing else. Nothing new is trusted: the row's
-- timestamp is still set by the insert trigger (cassette_tx_ms() again), so a client that
-- signs another time only makes a signature that verify reports as bad_signature.
CREATE FUNCTION cassette_append_time() RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET standard_conforming_strings = on
SET extra_float_digits = 1
SET bytea_output = 'hex' AS $$
BEGIN
    RETURN cassette_tx_ms();
END $$;

-- The document as json whose values can be read, or NULL. PostgreSQL cannot hold U+0000
-- in text and refuses to read any value of a document holding the escape \u0000 (SQLite
-- reads it): it becomes \u0001 first, which no rule tells apart (the rules read keys,
-- types, numbers and ids, never a string's characters, except plan_body's hash). A
-- document whose values cannot be read (a lone surrogate) is NULL.
CREATE FUNCTION cassette_json(doc text) RETURNS json
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    readable text := doc;
BEGIN
    IF strpos(doc, '\u0000') > 0 THEN
        readable := regexp_replace(doc, '(?<!\\)((?:\\\\)*)\\u0000', '\1\\u0001', 'g');
    END IF;
    PERFORM readable::jsonb;  -- reads every value: refuses lone surrogates
    RETURN readable::json;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;

-- SQLite's json_type() 'integer': a number written without fraction or exponent.
CREATE FUNCTION cassette_json_integer(value json) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT json_typeof(value) = 'number' AND value::text ~ '^-?[0-9]+$'
$$;

-- The json type of a document as json_typeof names it (object, array, string, number,
-- boolean, null), or NULL when the text is not JSON (SQLite's json_valid()).
CREATE FUNCTION cassette_json_type(doc text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN json_typeof(doc::json);
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;

-- A run id, source, worker id or intent: non-empty text of at most 200 characters.
CREATE FUNCTION cassette_name_ok(value text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$ SELECT value IS NOT NULL AND length(value) BETWEEN 1 AND 200 $$;

-- A row's id is the next of its table's dense ids, assigned under the head's lock; a
-- client that names another id is refused as on SQLite.
CREATE FUNCTION cassette_next_id(given bigint, next_id bigint) RETURNS bigint
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
BEGIN
    IF given IS NOT NULL AND given IS DISTINCT FROM next_id THEN
        RAISE EXCEPTION 'OUT_OF_ORDER: ids are dense: an id must follow the last one';
    END IF;
    RETURN next_id;
END $$;

-- Whether a call that may change nothing can decide so before taking the head: only in a
-- transaction that has no transaction id yet (it has written nothing, so cannot hold the
-- head) and in READ COMMITTED (its statement's snapshot holds every commit made before
-- the statement began). Reads no table: it costs what the two built-in calls cost.
CREATE FUNCTION cassette_noop_without_head() RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT pg_current_xact_id_if_assigned() IS NULL
           AND current_setting('transaction_isolation') = 'read committed'
$$;

-- JSON the API can read back (SQLite's cassette_*_readable checks): no integer beyond 64
-- bits, no other number beyond a finite double, nesting no deeper than 1024, no lone
-- surrogate. NULL and text that is not JSON pass: other rules refuse those.
CREATE FUNCTION cassette_readable_json(doc text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    readable text := doc;
    parsed jsonb;
BEGIN
    IF doc IS NULL OR NOT (doc ~ '[0-9][eE]' OR doc ~ '[0-9]{19}' OR length(doc) > 2048
                           OR strpos(lower(doc), '\ud') > 0) THEN
        RETURN true;
    END IF;
    IF cassette_json_type(doc) IS NULL THEN
        RETURN true;
    END IF;
    IF strpos(doc, '\u0000') > 0 THEN
        readable := regexp_replace(doc, '(?<!\\)((?:\\\\)*)\\u0000', '\1\\u0001', 'g');
    END IF;
    BEGIN
        parsed := readable::jsonb;
    EXCEPTION WHEN others THEN
        RETURN false;  -- a lone surrogate, or a number no numeric holds
    END;
    -- Numbers as written (jsonb would print 1.5e+300 as 15 followed by 299 zeros, an
    -- integer): walked through json, which keeps each token's text.
    IF doc ~ '[0-9][eE]' OR doc ~ '[0-9]{19}' THEN
        IF EXISTS (
            WITH RECURSIVE walk(v) AS (
                SELECT readable::json
                UNION ALL
                SELECT e.value FROM walk, LATERAL (
                    SELECT a.value FROM json_array_elements(
                        CASE WHEN json_typeof(walk.v) = 'array' THEN walk.v END) a
                    UNION ALL
                    SELECT o.value FROM json_each(
                        CASE WHEN json_typeof(walk.v) = 'object' THEN walk.v END) o) e
            )
            SELECT 1 FROM walk
             WHERE json_typeof(v) = 'number'
               AND CASE WHEN v::text ~ '^-?[0-9]+$'
                        THEN v::text::numeric NOT BETWEEN -9223372036854775808 AND 9223372036854775807
                        ELSE abs(v::text::numeric) > 1.7976931348623157e308 END) THEN
            RETURN false;
        END IF;
    END IF;
    IF length(doc) > 2048 AND jsonb_path_exists(parsed, 'strict $.**{1024 to last}') THEN
        RETURN false;
    END IF;
    RETURN true;
END $$;

-- A JSON object the API can read back, as SQLite accepts it (INVALID_PAYLOAD otherwise):
-- one holding the escape \u0000 (the API writes it for a string with U+0000; jsonb cannot
-- hold it) is read, and so is a real written with an exponent that jsonb prints as a long
-- integer (1.5e300 is not an integer beyond 64 bits).
CREATE FUNCTION cassette_readable_object(doc text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(cassette_json_type(doc) = 'object' AND cassette_readable_json(doc), false)
$$;

-- A refusal: RAISE EXCEPTION 'CODE: text' (SQLSTATE P0001), the codes of LAW.md.
CREATE FUNCTION cassette_refuse(message text) RETURNS void
LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION USING MESSAGE = message; END $$;

-- SHA-256 of the text's UTF-8 bytes, as lowercase hex (plan and checkpoint hashes).
CREATE FUNCTION cassette_sha256_hex(value text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT encode(sha256(convert_to(value, 'UTF8')), 'hex') $$;

-- The transaction's time: the later of the server's clock (plus the owner's forward
-- offset) and the latest time the ledger holds, fixed at the transaction's first call.
-- The first call takes the head (the UPDATE locks its row until commit: the
-- serialization point of every writer); a later call of the same transaction finds the
-- head stamped with its own transaction id and reads the time it set, without writing
-- the row again (nobody else can have changed it: the transaction holds its lock). A call
-- after a rolled-back savepoint finds the head without its id and takes it again.
CREATE FUNCTION cassette_tx_ms() RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = public, pg_temp AS $$
DECLARE
    taken bigint;
BEGIN
    SELECT time_ms INTO taken FROM cassette_head WHERE tx = pg_current_xact_id();
    IF FOUND THEN
        RETURN taken;
    END IF;
    UPDATE cassette_head
       SET time_ms = greatest(time_ms, (floor(extract(epoch FROM clock_timestamp()) * 1000))::bigint
                                       + clock_offset_ms),
           tx = pg_current_xact_id()
    RETURNING time_ms INTO taken;
    RETURN taken;
END $$;

-- Append-only tables: no row is updated or deleted (APPEND_ONLY), nor the table truncated.
CREATE FUNCTION cassette_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING MESSAGE = format('APPEND_ONLY: %s rows cannot be %s',
        TG_TABLE_NAME, CASE TG_OP WHEN 'UPDATE' THEN 'updated' WHEN 'DELETE' THEN 'deleted'
                                  ELSE 'truncated' END);
END $$;

-- The head is one row, never inserted or deleted; its stamp goes only to the transaction
-- taking it (a predicted transaction could otherwise skip taking the head), and neither
-- its time nor the owner's offset runs back.
CREATE FUNCTION cassette_head_guard() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
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

-- cassette_meta is append-only, but for the ledger_id while the journal is empty (a copy
-- takes its source's). The ledger's identity is then fixed by its first entry, for every
-- interleaving of sessions: a replacement first locks the head row (FOR UPDATE), the lock
-- every journaled write takes, so a REPEATABLE READ snapshot that predates another
-- session's first entries fails to take it (a serialization error, BUSY), a signer waits
-- for the replacement's commit and reads the new id, and the count that follows is made
-- under the lock (a volatile function's statement sees what committed before it, in READ
-- COMMITTED). Only the lock: not cassette_tx_ms(), which would also date the transaction
-- now, and a copy (which takes its source's id, then dates each row with its source's
-- time) must set that time itself. Without it the id could be replaced after the first
-- entries, and nothing in the journal or verify would show it (meta is not journaled).
CREATE FUNCTION cassette_meta_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
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

CREATE TRIGGER cassette_head_guard BEFORE INSERT OR DELETE ON cassette_head
    FOR EACH ROW EXECUTE FUNCTION cassette_head_guard();

-- The guard fires on an UPDATE only when there is something to check: the stamp goes to
-- another transaction, or the time or the offset runs back. Taking the head
-- (cassette_tx_ms: its own stamp, a later time) calls nothing. The WHEN condition is the
-- guard's own conditions, NULL-safe (a NULL time or offset calls it; NOT NULL refuses them).
CREATE TRIGGER cassette_head_guard_update BEFORE UPDATE ON cassette_head
    FOR EACH ROW WHEN (
        (NEW.tx IS DISTINCT FROM OLD.tx AND NEW.tx IS DISTINCT FROM pg_current_xact_id())
        OR NOT coalesce(NEW.time_ms >= OLD.time_ms, false)
        OR NOT coalesce(NEW.clock_offset_ms >= OLD.clock_offset_ms, false))
    EXECUTE FUNCTION cassette_head_guard();

CREATE TRIGGER cassette_head_no_truncate BEFORE TRUNCATE ON cassette_head
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_meta_no_change BEFORE UPDATE OR DELETE ON cassette_meta
    FOR EACH ROW EXECUTE FUNCTION cassette_meta_guard();

-- TRUNCATE fires no row trigger: a statement trigger refuses it.
CREATE TRIGGER cassette_meta_no_truncate BEFORE TRUNCATE ON cassette_meta
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();

-- ==== 20_messages.sql

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

-- ==== 30_steps.sql

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

-- ==== 40_actions.sql

-- Actions, plans and checkpoints: the agent's causal record. An action is appended once,
-- with its cause, plan and policy fields checked here; a plan's lifecycle (started,
-- paused, resumed, completed, aborted) is the actions of that plan, in order. Checkpoints
-- save a plan's context once per id.

CREATE TABLE cassette_checkpoints (
    checkpoint_seq bigint PRIMARY KEY CHECK (checkpoint_seq > 0),
    checkpoint_id text NOT NULL UNIQUE,
    plan_id text NOT NULL,
    context_json text NOT NULL,
    created_at bigint NOT NULL
);

CREATE TABLE cassette_actions (
    action_seq bigint PRIMARY KEY CHECK (action_seq > 0),
    action_id text NOT NULL UNIQUE,
    parent_action_id text,
    plan_id text NOT NULL,
    intent_id text NOT NULL,
    session_id text,
    action_type text NOT NULL,
    function_name text NOT NULL,
    arguments_json text,
    arguments_artifact text,
    result_json text,
    result_artifact text,
    success bigint NOT NULL,  -- 0/1 as on SQLite, so the journal prints 0 and 1
    error_message text,
    cost_micros bigint NOT NULL,
    duration_ms bigint NOT NULL,
    "timestamp" bigint NOT NULL,
    metadata_json text NOT NULL,
    caused_by text,
    rationale text,
    category text
);

CREATE INDEX cassette_actions_by_cause ON cassette_actions (caused_by, action_seq)
    WHERE caused_by IS NOT NULL;

CREATE INDEX cassette_actions_by_function ON cassette_actions (function_name, action_seq);

CREATE INDEX cassette_actions_by_intent ON cassette_actions (intent_id, action_seq);

CREATE INDEX cassette_actions_by_parent ON cassette_actions (parent_action_id, action_seq)
    WHERE parent_action_id IS NOT NULL;

CREATE INDEX cassette_actions_by_plan ON cassette_actions (plan_id, action_seq);

CREATE INDEX cassette_actions_by_session ON cassette_actions (session_id, action_seq)
    WHERE session_id IS NOT NULL;

CREATE INDEX cassette_actions_by_time ON cassette_actions ("timestamp", action_seq);

CREATE INDEX cassette_actions_by_type ON cassette_actions (action_type, action_seq);

CREATE INDEX cassette_actions_plan_lifecycle ON cassette_actions (plan_id, action_seq)
    WHERE action_type IN ('PlanStarted', 'PlanPaused', 'PlanResumed', 'PlanCompleted', 'PlanAborted');

CREATE INDEX cassette_checkpoints_by_plan ON cassette_checkpoints (plan_id, checkpoint_seq);

-- SQLite's cassette_actions_lifecycle_guard: the plan lifecycle's rules.
CREATE FUNCTION cassette_actions_lifecycle(a cassette_actions, meta json) RETURNS void
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
DECLARE
    state text := cassette_plan_state(a.plan_id);
    step_event boolean := a.action_type IN ('PlanStepCompleted', 'PlanStepFailed', 'PlanStepRetrying');
    parent cassette_actions;
BEGIN
    IF cassette_json_type(a.metadata_json) IS DISTINCT FROM 'object' THEN
        PERFORM cassette_refuse('INVALID_METADATA: metadata_json must be a JSON object');
    END IF;
    IF a.action_type = 'PlanStarted' AND state IS NOT NULL THEN
        PERFORM cassette_refuse('PLAN_ALREADY_STARTED: a plan starts once');
    END IF;
    IF left(a.action_type, 4) = 'Plan' AND a.action_type <> 'PlanStarted' AND state IS NULL THEN
        PERFORM cassette_refuse('PLAN_NOT_STARTED: the first lifecycle action of a plan is PlanStarted');
    END IF;
    IF a.action_type = 'PlanResumed' AND state IS DISTINCT FROM 'PlanPaused' THEN
        PERFORM cassette_refuse('PLAN_NOT_PAUSED: PlanResumed only while the plan is paused');
    END IF;
    IF a.action_type IN ('PlanPaused', 'PlanCompleted', 'PlanStepStarted', 'PlanStepCompleted',
                         'PlanStepFailed', 'PlanStepRetrying')
       AND state = 'PlanPaused' THEN
        PERFORM cassette_refuse('PLAN_NOT_RUNNING: the plan is paused');
    END IF;
    IF step_event THEN
        SELECT * INTO parent FROM cassette_actions s WHERE s.action_id = a.parent_action_id;
        IF parent.action_type IS DISTINCT FROM 'PlanStepStarted' OR parent.plan_id IS DISTINCT FROM a.plan_id THEN
            PERFORM cassette_refuse('STEP_NOT_STARTED: a step event''s parent is the PlanStepStarted of its step in this plan');
        END IF;
        IF EXISTS (SELECT 1 FROM cassette_actions c
                   WHERE c.parent_action_id = a.parent_action_id
                     AND c.action_type IN ('PlanStepCompleted', 'PlanStepFailed')) THEN
            PERFORM cassette_refuse('STEP_FINISHED: the step has already completed or failed');
        END IF;
        IF a.action_type = 'PlanStepRetrying'
           AND (SELECT count(*) FROM cassette_actions c
                WHERE c.parent_action_id = a.parent_action_id AND c.action_type = 'PlanStepRetrying')
               >= coalesce((cassette_json(parent.metadata_json) #>> '{retries,max}')::numeric, 0) THEN
            PERFORM cassette_refuse('RETRIES_EXHAUSTED: the step declared fewer retries (metadata retries.max)');
        END IF;
    END IF;
    IF a.action_type = 'PlanStepStarted'
       AND (NOT cassette_policy_ok(meta -> 'retries', meta -> 'retries' -> 'max')
            OR NOT cassette_policy_ok(meta -> 'timeout_ms', meta -> 'timeout_ms')) THEN
        PERFORM cassette_refuse('INVALID_POLICY: retries.max and timeout_ms are non-negative integers');
    END IF;
    IF (meta ->> 'checkpoint_id') IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM cassette_checkpoints k
                       WHERE k.checkpoint_id = meta ->> 'checkpoint_id' AND k.plan_id = a.plan_id) THEN
        PERFORM cassette_refuse('REFERENCE_MISSING: metadata.checkpoint_id names no checkpoint of this plan');
    END IF;
END $$;

-- Append one action; its seq and time (the transaction's). The triggers hold the law.
CREATE FUNCTION cassette_append_action(
    p_action_id text, p_parent_action_id text, p_plan_id text, p_intent_id text,
    p_session_id text, p_action_type text, p_function_name text, p_arguments_json text,
    p_arguments_artifact text, p_result_json text, p_result_artifact text, p_success bigint,
    p_error_message text, p_cost_micros bigint, p_duration_ms bigint, p_metadata_json text,
    p_caused_by text, p_rationale text, p_category text,
    OUT action_seq bigint, OUT action_time bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET standard_conforming_strings = on
SET extra_float_digits = 1
SET bytea_output = 'hex'
SET enable_seqscan = off
SET jit = off AS $$
BEGIN
    PERFORM cassette_tx_ms();
    INSERT INTO cassette_actions (action_id, parent_action_id, plan_id, intent_id, session_id,
        action_type, function_name, arguments_json, arguments_artifact, result_json,
        result_artifact, success, error_message, cost_micros, duration_ms, "timestamp",
        metadata_json, caused_by, rationale, category)
    VALUES (p_action_id, p_parent_action_id, p_plan_id, p_intent_id, p_session_id,
        p_action_type, p_function_name, p_arguments_json, p_arguments_artifact, p_result_json,
        p_result_artifact, p_success, p_error_message, p_cost_micros, p_duration_ms, 0,
        p_metadata_json, p_caused_by, p_rationale, p_category)
    RETURNING cassette_actions.action_seq, cassette_actions."timestamp" INTO action_seq, action_time;
END $$;

-- SQLite's CHECK of an artifact column: JSON whose sha256 (if any) is text and size (if
-- any) an integer; NULL passes, as a CHECK on SQLite passes on NULL.
CREATE FUNCTION cassette_artifact_column_ok(ref text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    doc json;
BEGIN
    IF ref IS NULL THEN
        RETURN true;
    END IF;
    IF cassette_json_type(ref) IS NULL THEN
        RETURN false;
    END IF;
    doc := cassette_json(ref);
    RETURN coalesce(json_typeof(doc -> 'sha256'), 'string') = 'string'
           AND (json_typeof(doc -> 'size') IS NULL OR cassette_json_integer(doc -> 'size'));
END $$;

-- SQLite's cassette_actions_artifact_refs: a reference the readers can follow by hash.
CREATE FUNCTION cassette_artifact_ref_ok(ref text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    doc json := cassette_json(ref);
    sha text;
    path text;
BEGIN
    IF cassette_json_type(ref) IS DISTINCT FROM 'object' OR doc IS NULL THEN
        RETURN false;
    END IF;
    sha := doc ->> 'sha256';
    path := doc ->> 'path';
    RETURN coalesce(
        json_typeof(doc -> 'sha256') = 'string' AND length(sha) = 64 AND sha !~ '[^0-9a-f]'
        AND CASE WHEN cassette_json_integer(doc -> 'size') THEN (doc ->> 'size')::numeric >= 0 ELSE false END
        AND (json_typeof(doc -> 'path') IS NULL OR (
             json_typeof(doc -> 'path') = 'string'
             AND left(path, 1) <> '/'
             AND strpos('/' || path || '/', '/../') = 0
             AND strpos('/' || path || '/', '/./') = 0
             AND strpos(path, chr(92)) = 0
             AND right(path, 65) = '/' || sha)),
        false);
END $$;

-- The type of the plan's last lifecycle action (NULL: not started).
CREATE FUNCTION cassette_plan_state(p_plan_id text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT action_type FROM cassette_actions
     WHERE plan_id = p_plan_id
       AND action_type IN ('PlanStarted', 'PlanPaused', 'PlanResumed', 'PlanCompleted', 'PlanAborted')
     ORDER BY action_seq DESC LIMIT 1
$$;

-- A step policy's field: absent (field NULL), or a non-negative integer (value).
CREATE FUNCTION cassette_policy_ok(field json, value json) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN json_typeof(field) IS NULL THEN true
                WHEN coalesce(cassette_json_integer(value), false) THEN value::text::numeric >= 0
                ELSE false END
$$;

CREATE FUNCTION cassette_save_checkpoint(p_checkpoint_id text, p_plan_id text, p_context_json text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET standard_conforming_strings = on
SET extra_float_digits = 1
SET bytea_output = 'hex'
SET enable_seqscan = off
SET jit = off AS $$
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

-- metadata.suggested_causes: an array of at most 20 objects of exactly an action_id (text)
-- and a reason (1-500 characters).
CREATE FUNCTION cassette_suggested_causes_ok(causes json) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    one json;
BEGIN
    IF json_typeof(causes) IS DISTINCT FROM 'array' OR json_array_length(causes) > 20 THEN
        RETURN false;
    END IF;
    FOR one IN SELECT value FROM json_array_elements(causes) LOOP
        IF json_typeof(one) IS DISTINCT FROM 'object'
           OR json_typeof(one -> 'action_id') IS DISTINCT FROM 'string'
           OR json_typeof(one -> 'reason') IS DISTINCT FROM 'string' THEN
            RETURN false;
        END IF;
        IF length(one ->> 'reason') NOT BETWEEN 1 AND 500
           OR (SELECT count(*) FROM json_object_keys(one)) <> 2 THEN
            RETURN false;
        END IF;
    END LOOP;
    RETURN true;
END $$;

CREATE FUNCTION cassette_actions_insert() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
DECLARE
    given bigint := NEW.action_seq;
    next_id bigint;
    meta json;
    plan_hash text;
    cause_time bigint;
BEGIN
    NEW."timestamp" := cassette_tx_ms();  -- first: the head's lock makes max() the last id
    next_id := (SELECT coalesce(max(action_seq), 0) + 1 FROM cassette_actions);
    NEW.action_seq := next_id;
    IF cassette_json_type(NEW.metadata_json) IS NOT NULL THEN
        meta := cassette_json(NEW.metadata_json);
    END IF;

    -- SQLite's BEFORE INSERT triggers, newest first: the package's plan hash guard
    IF NEW.action_type = 'PlanStarted' AND json_typeof(meta -> 'plan_body') = 'string'
       AND json_typeof(meta -> 'plan_hash') = 'string' THEN
        plan_hash := meta ->> 'plan_hash';
        IF length(plan_hash) = 64 AND plan_hash !~ '[^0-9a-f]'
           AND plan_hash IS DISTINCT FROM cassette_sha256_hex(meta ->> 'plan_body') THEN
            PERFORM cassette_refuse('PLAN_HASH_MISMATCH: plan_hash must be the SHA-256 of plan_body');
        END IF;
    END IF;
    IF cassette_plan_state(NEW.plan_id) IN ('PlanCompleted', 'PlanAborted') THEN
        PERFORM cassette_refuse('PLAN_FINISHED: the plan has completed or aborted');
    END IF;
    IF left(NEW.action_type, 4) = 'Plan' OR (meta ->> 'checkpoint_id') IS NOT NULL THEN
        PERFORM cassette_actions_lifecycle(NEW, meta);
    END IF;
    IF NEW.caused_by IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM cassette_actions WHERE action_id = NEW.caused_by) THEN
        PERFORM cassette_refuse('REFERENCE_MISSING: the cause (caused_by) does not exist');
    END IF;
    IF EXISTS (SELECT 1 FROM cassette_actions WHERE action_seq = given) THEN
        PERFORM cassette_refuse('APPEND_ONLY: an action with this action_seq exists');
    END IF;
    IF EXISTS (SELECT 1 FROM cassette_actions WHERE action_id = NEW.action_id) THEN
        PERFORM cassette_refuse('APPEND_ONLY: an action with this action_id exists');
    END IF;
    IF NEW.parent_action_id IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM cassette_actions WHERE action_id = NEW.parent_action_id) THEN
        PERFORM cassette_refuse('REFERENCE_MISSING: the parent action does not exist');
    END IF;

    -- NOT NULL, then the CHECK constraints in column order
    IF NEW.action_id IS NULL OR NEW.plan_id IS NULL OR NEW.intent_id IS NULL
       OR NEW.action_type IS NULL OR NEW.function_name IS NULL OR NEW.success IS NULL
       OR NEW.cost_micros IS NULL OR NEW.duration_ms IS NULL OR NEW.metadata_json IS NULL THEN
        PERFORM cassette_refuse('CONSTRAINT_VIOLATION: NOT NULL constraint failed: cassette_actions');
    END IF;
    IF given <= 0 THEN
        PERFORM cassette_refuse('INVALID_ID: action_seq is a positive integer');
    END IF;
    IF NOT (NEW.action_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$') THEN
        PERFORM cassette_refuse('INVALID_ACTION_ID: action_id is a lowercase UUID');
    END IF;
    IF NOT cassette_name_ok(NEW.plan_id) THEN
        PERFORM cassette_refuse('INVALID_PLAN_ID: plan_id is a string of 1-200 characters');
    END IF;
    IF NOT cassette_name_ok(NEW.intent_id) THEN
        PERFORM cassette_refuse('INVALID_INTENT: intent_id is a string of 1-200 characters');
    END IF;
    IF NEW.session_id IS NOT NULL AND NOT cassette_name_ok(NEW.session_id) THEN
        PERFORM cassette_refuse('INVALID_SESSION_ID: session_id is a string of 1-200 characters');
    END IF;
    IF NEW.action_type NOT IN ('PlanStarted', 'PlanCompleted', 'PlanAborted', 'PlanPaused',
                               'PlanResumed', 'PlanStepStarted', 'PlanStepCompleted',
                               'PlanStepFailed', 'PlanStepRetrying', 'CapabilityCall',
                               'CapabilityResult', 'InternalStep') THEN
        PERFORM cassette_refuse('INVALID_ACTION_TYPE: action_type is one of the twelve types');
    END IF;
    IF NOT cassette_name_ok(NEW.function_name) THEN
        PERFORM cassette_refuse('INVALID_FUNCTION_NAME: function_name is a string of 1-200 characters');
    END IF;
    IF NEW.arguments_json IS NOT NULL AND cassette_json_type(NEW.arguments_json) IS DISTINCT FROM 'array' THEN
        PERFORM cassette_refuse('INVALID_ARGUMENTS: arguments_json is a JSON array');
    END IF;
    IF NOT cassette_artifact_column_ok(NEW.arguments_artifact) THEN
        PERFORM cassette_refuse('INVALID_ARTIFACT: arguments_artifact is an artifact reference');
    END IF;
    IF NEW.result_json IS NOT NULL AND cassette_json_type(NEW.result_json) IS NULL THEN
        PERFORM cassette_refuse('INVALID_PAYLOAD: result_json is JSON');
    END IF;
    IF NOT cassette_artifact_column_ok(NEW.result_artifact) THEN
        PERFORM cassette_refuse('INVALID_ARTIFACT: result_artifact is an artifact reference');
    END IF;
    IF NEW.success NOT IN (0, 1) THEN
        PERFORM cassette_refuse('INVALID_SUCCESS: success is 0 or 1');
    END IF;
    IF NEW.cost_micros < 0 THEN
        PERFORM cassette_refuse('INVALID_COST: cost_micros is a non-negative integer');
    END IF;
    IF NEW.duration_ms < 0 THEN
        PERFORM cassette_refuse('INVALID_DURATION: duration_ms is a non-negative integer');
    END IF;
    IF cassette_json_type(NEW.metadata_json) IS DISTINCT FROM 'object' THEN
        PERFORM cassette_refuse('INVALID_METADATA: metadata_json is a JSON object');
    END IF;
    IF NEW.category NOT IN ('conversation', 'decision', 'file_edit', 'tool_use', 'research') THEN
        PERFORM cassette_refuse('INVALID_CATEGORY: category is conversation, decision, file_edit, tool_use or research');
    END IF;
    IF NEW.arguments_json IS NOT NULL AND NEW.arguments_artifact IS NOT NULL
       OR NEW.result_json IS NOT NULL AND NEW.result_artifact IS NOT NULL THEN
        PERFORM cassette_refuse('INVALID_ARTIFACT: a value is inline or an artifact, not both');
    END IF;

    -- SQLite's AFTER INSERT triggers, newest first
    IF json_typeof(meta -> 'plan_body') IS NOT NULL OR json_typeof(meta -> 'plan_hash') IS NOT NULL THEN
        IF NEW.action_type <> 'PlanStarted' THEN
            PERFORM cassette_refuse('INVALID_PLAN_BODY: plan_body and plan_hash belong to a PlanStarted action');
        END IF;
        IF json_typeof(meta -> 'plan_body') IS DISTINCT FROM 'string'
           OR json_typeof(meta -> 'plan_hash') IS DISTINCT FROM 'string'
           OR length(meta ->> 'plan_hash') IS DISTINCT FROM 64
           OR (meta ->> 'plan_hash') ~ '[^0-9a-f]' THEN
            PERFORM cassette_refuse('INVALID_PLAN_BODY: plan_body is text and plan_hash 64 lowercase hex digits');
        END IF;
    END IF;
    IF json_typeof(meta -> 'suggested_causes') IS NOT NULL THEN
        IF NOT cassette_suggested_causes_ok(meta -> 'suggested_causes') THEN
            PERFORM cassette_refuse('INVALID_METADATA: suggested_causes is an array of at most 20 {action_id, reason} objects');
        END IF;
        IF EXISTS (SELECT 1 FROM json_array_elements(meta -> 'suggested_causes') s(value)
                   WHERE NOT EXISTS (SELECT 1 FROM cassette_actions c
                                     WHERE c.action_id = s.value ->> 'action_id')) THEN
            PERFORM cassette_refuse('REFERENCE_MISSING: a suggested cause names no earlier action');
        END IF;
    END IF;
    IF NEW.caused_by IS NOT NULL THEN
        cause_time := (SELECT c."timestamp" FROM cassette_actions c WHERE c.action_id = NEW.caused_by);
        IF cause_time > NEW."timestamp" THEN
            PERFORM cassette_refuse('CAUSE_AFTER_EFFECT: the cause (caused_by) has a later timestamp than its effect');
        END IF;
    END IF;
    IF (NEW.arguments_artifact IS NOT NULL AND NOT cassette_artifact_ref_ok(NEW.arguments_artifact))
       OR (NEW.result_artifact IS NOT NULL AND NOT cassette_artifact_ref_ok(NEW.result_artifact)) THEN
        PERFORM cassette_refuse('INVALID_ARTIFACT: a reference is {"sha256": 64 hex digits, "size": n >= 0, "path": "<folder>/<sha256>"}');
    END IF;
    IF NOT (cassette_readable_json(NEW.arguments_json) AND cassette_readable_json(NEW.result_json)
            AND cassette_readable_json(NEW.metadata_json) AND cassette_readable_json(NEW.arguments_artifact)
            AND cassette_readable_json(NEW.result_artifact)) THEN
        PERFORM cassette_refuse('INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate');
    END IF;
    IF given IS DISTINCT FROM next_id AND given IS NOT NULL THEN
        PERFORM cassette_refuse('OUT_OF_ORDER: ids are dense: action_seq must follow the last one');
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION cassette_actions_journal() RETURNS trigger
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
BEGIN
    PERFORM cassette_journal_append(TG_TABLE_NAME, TG_OP, cassette_j(NEW.action_id), NEW.action_id,
        '{"action_seq":' || cassette_j(NEW.action_seq) || ',"action_id":' || cassette_j(NEW.action_id)
        || ',"parent_action_id":' || cassette_j(NEW.parent_action_id) || ',"plan_id":' || cassette_j(NEW.plan_id)
        || ',"intent_id":' || cassette_j(NEW.intent_id) || ',"session_id":' || cassette_j(NEW.session_id)
        || ',"action_type":' || cassette_j(NEW.action_type) || ',"function_name":' || cassette_j(NEW.function_name)
        || ',"arguments_json":' || cassette_j(NEW.arguments_json)
        || ',"arguments_artifact":' || cassette_j(NEW.arguments_artifact)
        || ',"result_json":' || cassette_j(NEW.result_json) || ',"result_artifact":' || cassette_j(NEW.result_artifact)
        || ',"success":' || cassette_j(NEW.success) || ',"error_message":' || cassette_j(NEW.error_message)
        || ',"cost_micros":' || cassette_j(NEW.cost_micros) || ',"duration_ms":' || cassette_j(NEW.duration_ms)
        || ',"timestamp":' || cassette_j(NEW."timestamp") || ',"metadata_json":' || cassette_j(NEW.metadata_json)
        || ',"caused_by":' || cassette_j(NEW.caused_by) || ',"rationale":' || cassette_j(NEW.rationale)
        || ',"category":' || cassette_j(NEW.category) || '}');
    RETURN NULL;
END $$;

CREATE FUNCTION cassette_checkpoints_insert() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
DECLARE
    given bigint := NEW.checkpoint_seq;
    next_id bigint;
    context json;
BEGIN
    NEW.created_at := cassette_tx_ms();  -- first: the head's lock makes max() the last id
    next_id := (SELECT coalesce(max(checkpoint_seq), 0) + 1 FROM cassette_checkpoints);
    NEW.checkpoint_seq := next_id;
    -- SQLite: the package's TEMP hash guard, then cassette_checkpoints_insert_guard
    IF NEW.checkpoint_id IS DISTINCT FROM 'cp-' || cassette_sha256_hex(NEW.context_json) THEN
        PERFORM cassette_refuse('CHECKPOINT_MISMATCH: checkpoint_id must be cp- and the SHA-256 of context_json');
    END IF;
    IF EXISTS (SELECT 1 FROM cassette_checkpoints WHERE checkpoint_seq = given) THEN
        PERFORM cassette_refuse('APPEND_ONLY: a checkpoint with this checkpoint_seq exists');
    END IF;
    IF EXISTS (SELECT 1 FROM cassette_checkpoints WHERE checkpoint_id = NEW.checkpoint_id) THEN
        PERFORM cassette_refuse('APPEND_ONLY: a checkpoint with this checkpoint_id exists');
    END IF;
    -- NOT NULL, then the CHECK constraints in column order
    IF NEW.checkpoint_id IS NULL OR NEW.plan_id IS NULL OR NEW.context_json IS NULL THEN
        PERFORM cassette_refuse('CONSTRAINT_VIOLATION: NOT NULL constraint failed: cassette_checkpoints');
    END IF;
    IF given <= 0 THEN
        PERFORM cassette_refuse('INVALID_ID: checkpoint_seq is a positive integer');
    END IF;
    IF NOT (length(NEW.checkpoint_id) = 67 AND left(NEW.checkpoint_id, 3) = 'cp-'
            AND substr(NEW.checkpoint_id, 4) !~ '[^0-9a-f]') THEN
        PERFORM cassette_refuse('INVALID_CHECKPOINT_ID: a checkpoint id is cp- and 64 lowercase hex digits');
    END IF;
    IF NOT cassette_name_ok(NEW.plan_id) THEN
        PERFORM cassette_refuse('INVALID_PLAN_ID: plan_id is a string of 1-200 characters');
    END IF;
    context := cassette_json(NEW.context_json);
    IF cassette_json_type(NEW.context_json) IS NULL
       OR json_typeof(context -> 'plan_id') IS DISTINCT FROM 'string'
       OR (context ->> 'plan_id') IS DISTINCT FROM NEW.plan_id THEN
        PERFORM cassette_refuse('INVALID_PAYLOAD: context_json is JSON whose plan_id is the checkpoint''s plan');
    END IF;
    -- SQLite's AFTER triggers
    IF NOT cassette_readable_json(NEW.context_json) THEN
        PERFORM cassette_refuse('INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate');
    END IF;
    IF given IS DISTINCT FROM next_id AND given IS NOT NULL THEN
        PERFORM cassette_refuse('OUT_OF_ORDER: ids are dense: checkpoint_seq must follow the last one');
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION cassette_checkpoints_journal() RETURNS trigger
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
BEGIN
    PERFORM cassette_journal_append(TG_TABLE_NAME, TG_OP, cassette_j(NEW.checkpoint_id), NEW.checkpoint_id,
        '{"checkpoint_seq":' || cassette_j(NEW.checkpoint_seq) || ',"checkpoint_id":' || cassette_j(NEW.checkpoint_id)
        || ',"plan_id":' || cassette_j(NEW.plan_id) || ',"context_json":' || cassette_j(NEW.context_json)
        || ',"created_at":' || cassette_j(NEW.created_at) || '}');
    RETURN NULL;
END $$;

CREATE TRIGGER cassette_actions_insert BEFORE INSERT ON cassette_actions
    FOR EACH ROW EXECUTE FUNCTION cassette_actions_insert();

CREATE TRIGGER cassette_actions_journal AFTER INSERT ON cassette_actions
    FOR EACH ROW EXECUTE FUNCTION cassette_actions_journal();

CREATE TRIGGER cassette_actions_no_change BEFORE UPDATE OR DELETE ON cassette_actions
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_actions_no_truncate BEFORE TRUNCATE ON cassette_actions
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_checkpoints_insert BEFORE INSERT ON cassette_checkpoints
    FOR EACH ROW EXECUTE FUNCTION cassette_checkpoints_insert();

CREATE TRIGGER cassette_checkpoints_journal AFTER INSERT ON cassette_checkpoints
    FOR EACH ROW EXECUTE FUNCTION cassette_checkpoints_journal();

CREATE TRIGGER cassette_checkpoints_no_change BEFORE UPDATE OR DELETE ON cassette_checkpoints
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_checkpoints_no_truncate BEFORE TRUNCATE ON cassette_checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();

-- ==== 50_journal.sql

-- The journal, its Merkle tree and seals. Every write to a ledger table appends one entry,
-- inside the same transaction, from the table's AFTER trigger: body
-- {"table":T,"op":O,"key":K,"row":R}, leaf = SHA-256(0x00||body), chain = SHA-256(0x02 ||
-- seq as 8-byte big-endian || previous chain || leaf). Bodies, leaf and chain hashes are
-- byte-identical to the SQLite ledger's for the same rows: each body is concatenated here
-- with the same key order and JSON text SQLite's json_object() writes (json_build_object
-- would add spaces). The journal is append-only; a seal binds a tree size and its root.

CREATE TABLE cassette_journal (
    seq bigint PRIMARY KEY CHECK (seq >= 0),
    body text NOT NULL,
    leaf_hash bytea NOT NULL CHECK (length(leaf_hash) = 32),
    chain_hash bytea NOT NULL CHECK (length(chain_hash) = 32),
    tbl text NOT NULL,
    row_key text NOT NULL
);

-- Seals: the same cassette_seals rows as on SQLite (a signed C2SP note of a tree size and
-- its RFC 9162 root), journaled with the same bodies, each checked against the root the
-- server recomputes from the journal's leaves. So a ledger copied here with its seals
-- keeps them, and the seals of its source still hold on it (LAW.md, Copies). The root is
-- folded from the leaves in seq order each time a seal is inserted (no node is stored):
-- O(tree size) per seal.
CREATE TABLE cassette_seals (
    seal_id bigint PRIMARY KEY CHECK (seal_id > 0),
    tree_size bigint NOT NULL,
    root_hex text NOT NULL,
    origin text NOT NULL,
    key_id text NOT NULL,
    note text NOT NULL,
    created_at bigint NOT NULL
);

CREATE INDEX cassette_journal_action_entries ON cassette_journal (row_key)
    WHERE tbl = 'cassette_actions';

CREATE INDEX cassette_journal_receipt_entries ON cassette_journal (row_key)
    WHERE tbl = 'cassette_receipts';

-- The JSON text SQLite's json_object() writes for an integer or a text value. The text
-- form is STABLE (to_json is), so the planner inlines it into each body.
CREATE FUNCTION cassette_j(value bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT coalesce(value::text, 'null') $$;

CREATE FUNCTION cassette_j(value text) RETURNS text
LANGUAGE sql STABLE AS $$ SELECT coalesce(to_json(value)::text, 'null') $$;

CREATE FUNCTION cassette_journal_append(tbl text, op text, key_json text, row_key text, row_json text)
RETURNS void LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
BEGIN
    -- seq, leaf_hash and chain_hash: the journal's guard computes them
    INSERT INTO cassette_journal (body, tbl, row_key)
    VALUES ('{"table":' || cassette_j(tbl) || ',"op":' || cassette_j(op)
            || ',"key":' || key_json || ',"row":' || row_json || '}', tbl, row_key);
END $$;

CREATE FUNCTION cassette_journal_append(tbl text, op text, row_key text, row_json text)
RETURNS void LANGUAGE sql AS $$
    SELECT cassette_journal_append(tbl, op, row_key, row_key, row_json)
$$;

-- The number of entries the journal holds, as the caller's snapshot sees them.
CREATE FUNCTION cassette_journal_size() RETURNS bigint
LANGUAGE sql STABLE
SET search_path = public, pg_temp AS $$
    SELECT coalesce((SELECT seq FROM cassette_journal ORDER BY seq DESC LIMIT 1) + 1, 0)
$$;

-- RFC 9162 MTH of the first tree_size leaves: each leaf is pushed on a stack of complete
-- subtrees, merged while the count of leaves so far has a trailing one bit; the stack is
-- then folded right to left.
CREATE FUNCTION cassette_tree_root(tree_size bigint) RETURNS bytea
LANGUAGE plpgsql STABLE
SET search_path = public, pg_temp AS $$
DECLARE
    stack bytea[] := '{}';
    leaf bytea;
    count bigint := 0;
    merged bigint;
    acc bytea;
    i integer;
BEGIN
    FOR leaf IN SELECT leaf_hash FROM cassette_journal WHERE seq < tree_size ORDER BY seq LOOP
        stack := stack || leaf;
        count := count + 1;
        merged := count;
        WHILE merged % 2 = 0 LOOP
            i := cardinality(stack);
            stack := stack[1:i - 2] || sha256('\x01'::bytea || stack[i - 1] || stack[i]);
            merged := merged / 2;
        END LOOP;
    END LOOP;
    IF count IS DISTINCT FROM tree_size OR count = 0 THEN
        RETURN NULL;
    END IF;
    i := cardinality(stack);
    acc := stack[i];
    WHILE i > 1 LOOP
        i := i - 1;
        acc := sha256('\x01'::bytea || stack[i] || acc);
    END LOOP;
    RETURN acc;
END $$;

CREATE FUNCTION cassette_journal_guard() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
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

-- A seal's root is folded before the insert takes the head, not under it, so no writer
-- of the fleet waits for the fold (0.23 s at 10^5 entries, seconds at 10^6). The fold
-- runs in the statement's view of committed entries: entries below a seq that is visible
-- are committed and never change (append-only for every session; the owner who turns the
-- triggers off is verify's to catch), so a root folded there is the root under the lock
-- too. When the fold saw fewer entries than the seal covers (entries committed meanwhile,
-- or none), it is folded again under the head.
CREATE FUNCTION cassette_seals_insert() RETURNS trigger
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
DECLARE
    now_ms bigint;
    root bytea;
BEGIN
    IF NEW.tree_size IS NOT NULL AND NEW.tree_size >= 1 THEN
        root := cassette_tree_root(NEW.tree_size);  -- NULL unless all are visible
    END IF;
    now_ms := cassette_tx_ms();  -- the head's lock makes max() the last id
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
    IF root IS NULL THEN
        root := cassette_tree_root(NEW.tree_size);
    END IF;
    IF NEW.root_hex IS DISTINCT FROM encode(root, 'hex') THEN
        RAISE EXCEPTION 'SEAL_MISMATCH: the sealed root is not the ledger''s root at that size';
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION cassette_seals_journal() RETURNS trigger
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
BEGIN
    PERFORM cassette_journal_append(TG_TABLE_NAME, TG_OP, cassette_j(NEW.seal_id),
        '{"seal_id":' || cassette_j(NEW.seal_id) || ',"tree_size":' || cassette_j(NEW.tree_size)
        || ',"root_hex":' || cassette_j(NEW.root_hex) || ',"origin":' || cassette_j(NEW.origin)
        || ',"key_id":' || cassette_j(NEW.key_id) || ',"note":' || cassette_j(NEW.note)
        || ',"created_at":' || cassette_j(NEW.created_at) || '}');
    RETURN NULL;
END $$;

CREATE TRIGGER cassette_journal_guard BEFORE INSERT ON cassette_journal
    FOR EACH ROW EXECUTE FUNCTION cassette_journal_guard();

CREATE TRIGGER cassette_journal_no_change BEFORE UPDATE OR DELETE ON cassette_journal
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_journal_no_truncate BEFORE TRUNCATE ON cassette_journal
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_seals_insert BEFORE INSERT ON cassette_seals
    FOR EACH ROW EXECUTE FUNCTION cassette_seals_insert();

CREATE TRIGGER cassette_seals_journal AFTER INSERT ON cassette_seals
    FOR EACH ROW EXECUTE FUNCTION cassette_seals_journal();

CREATE TRIGGER cassette_seals_no_change BEFORE UPDATE OR DELETE ON cassette_seals
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_seals_no_truncate BEFORE TRUNCATE ON cassette_seals
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();

-- ==== 60_worker_keys.sql

-- Worker keys: attestations, the signed statements a worker's key makes about a post, a
-- claim, a completion or a release, bound to the ledger's id. A lease claimed signed must
-- be completed, released or requeued with an attestation (the rules on receipts and
-- releases here; the requeue's in cassette_steps_update, 30_steps.sql).
--   * An attestation is checked by one BEFORE INSERT trigger in the order a SQLite
--     package connection meets the rules for the same row (the clock guard, the insert
--     guard, then NOT NULL and the CHECK constraints in column order), so a row breaking
--     several gets SQLite's code. Its id is the next dense id and created_at the
--     transaction's time (cassette_tx_ms()), as for every row here: a signer reads that
--     time first, in the same transaction (cassette_signer_context()), and names it as
--     the statement's `at`.
--   * A requeue's timing needs the clock: on SQLite a TEMP trigger of package connections
--     checks it; here the server has the clock, so every session is held to it
--     (LEASE_NOT_EXPIRED).
--   * The SIGNATURE_REQUIRED guards of receipts and releases fire after the table's own
--     checks (triggers of one event fire in name order: *_insert before *_signature), so
--     a stale or wrong worker still gets its own code, as on SQLite.
--   * cassette_worker attests through cassette_attest(), then acts through the step
--     functions in the same transaction; no role gets a table write privilege.
-- As on SQLite, SQL cannot check an Ed25519 signature: only its shape. Whether it is
-- genuine, and by the key pinned for its worker, is `verify --worker-keys DIR`.

CREATE TABLE cassette_attestations (
    attestation_id bigint PRIMARY KEY CHECK (attestation_id > 0),
    act text NOT NULL,
    run_id text NOT NULL,
    message_id bigint,
    step_id bigint,
    fencing_token bigint,
    worker_id text NOT NULL,
    key_id text NOT NULL,
    signature text NOT NULL,
    created_at bigint NOT NULL
);

CREATE INDEX cassette_attestations_by_message ON cassette_attestations (message_id);

-- Every guard below looks attestations up by step and token (or by message).
CREATE INDEX cassette_attestations_by_step
    ON cassette_attestations (step_id, fencing_token, act, worker_id);

-- Record a signed statement of an act the caller makes next in this transaction; its
-- attestation_id. The triggers hold the law; the signature is verify's to check.
CREATE FUNCTION cassette_attest(p_act text, p_run_id text, p_message_id bigint, p_step_id bigint,
                                p_fencing_token bigint, p_worker_id text, p_key_id text,
                                p_signature text)
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
    PERFORM cassette_tx_ms();
    INSERT INTO cassette_attestations (act, run_id, message_id, step_id, fencing_token,
                                       worker_id, key_id, signature, created_at)
    VALUES (p_act, p_run_id, p_message_id, p_step_id, p_fencing_token, p_worker_id, p_key_id,
            p_signature, 0)
    RETURNING attestation_id INTO made;
    RETURN made;
END $$;

CREATE FUNCTION cassette_attested(p_step_id bigint, p_token bigint, p_act text,
                                  p_worker text, p_key_id text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM cassette_attestations a
                    WHERE a.step_id = p_step_id AND a.fencing_token = p_token AND a.act = p_act
                      AND (p_worker IS NULL OR a.worker_id = p_worker)
                      AND (p_key_id IS NULL OR a.key_id = p_key_id))
$$;

-- Whether the step's lease at this token was claimed signed by its owner: the claim
-- attestation's key_id, or NULL.
CREATE FUNCTION cassette_signed_claim(p_step_id bigint, p_token bigint, p_owner text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT c.key_id FROM cassette_attestations c
     WHERE c.step_id = p_step_id AND c.fencing_token = p_token
       AND c.act = 'claim' AND c.worker_id = p_owner
     LIMIT 1
$$;

-- What a signing worker names in its statements, read first in the transaction that
-- then attests and acts: the transaction's time, taking the head (cassette_tx_ms(); every
-- row of the transaction is dated with it: the statement's `at`), and the ledger's id,
-- read after the head is taken (a volatile function's statements see what committed
-- before them), so it is the id the ledger keeps.
CREATE FUNCTION cassette_signer_context(OUT now_ms bigint, OUT ledger_id text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET standard_conforming_strings = on
SET extra_float_digits = 1
SET bytea_output = 'hex' AS $$
BEGIN
    now_ms := cassette_tx_ms();
    SELECT value INTO ledger_id FROM cassette_meta WHERE key = 'ledger_id';
END $$;

-- An attestation names an act its worker may do now: one message that does not exist
-- yet, or a step in the state the act needs, with the token the act will carry.
CREATE FUNCTION cassette_attestations_insert() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
DECLARE
    given bigint := NEW.attestation_id;
    next_id bigint;
    step cassette_steps;
BEGIN
    NEW.created_at := cassette_tx_ms();  -- first: the head's lock makes max() the last id
    next_id := (SELECT coalesce(max(attestation_id), 0) + 1 FROM cassette_attestations);
    NEW.attestation_id := next_id;
    -- SQLite: the package's TEMP cassette_attestations_clock_guard (TEMP triggers fire
    -- first there); here for every session
    IF NEW.act = 'requeue' AND EXISTS (
        SELECT 1 FROM cassette_steps s
         WHERE s.step_id = NEW.step_id AND s.status = 'LEASED'
           AND s.fencing_token = NEW.fencing_token AND s.lease_expires_at > NEW.created_at) THEN
        PERFORM cassette_refuse('LEASE_NOT_EXPIRED: a requeue is attested only after the lease expired');
    END IF;
    -- SQLite: cassette_attestations_insert_guard
    IF NEW.act IS NULL OR NEW.act NOT IN ('post', 'claim', 'release', 'complete', 'requeue') THEN
        PERFORM cassette_refuse('INVALID_ATTESTATION: act is post, claim, release, complete or requeue');
    END IF;
    IF NOT cassette_name_ok(NEW.worker_id) THEN
        PERFORM cassette_refuse('INVALID_WORKER: worker_id is a string of 1-200 characters');
    END IF;
    IF EXISTS (SELECT 1 FROM cassette_attestations WHERE attestation_id = given) THEN
        PERFORM cassette_refuse('APPEND_ONLY: an attestation with this attestation_id exists');
    END IF;
    IF given IS NOT NULL AND given IS DISTINCT FROM next_id THEN
        PERFORM cassette_refuse('OUT_OF_ORDER: attestation ids are given in order without gaps');
    END IF;
    IF EXISTS (SELECT 1 FROM cassette_attestations
               WHERE act = NEW.act AND message_id = NEW.message_id)
       OR EXISTS (SELECT 1 FROM cassette_attestations
                  WHERE step_id = NEW.step_id AND fencing_token = NEW.fencing_token
                    AND act = NEW.act AND worker_id = NEW.worker_id) THEN
        PERFORM cassette_refuse('APPEND_ONLY: this act is already attested');
    END IF;
    -- a post is attested before its message is inserted, under the next message_id
    IF NEW.act = 'post' AND (NEW.message_id IS NULL
            OR EXISTS (SELECT 1 FROM cassette_messages WHERE message_id >= NEW.message_id)) THEN
        PERFORM cassette_refuse('OUT_OF_ORDER: a post is attested before its message, under the next message_id');
    END IF;
    IF NEW.act IS DISTINCT FROM 'post' THEN
        SELECT * INTO step FROM cassette_steps WHERE step_id = NEW.step_id;
        IF NOT FOUND THEN
            PERFORM cassette_refuse('STEP_NOT_FOUND: the attested step does not exist');
        END IF;
        IF NEW.run_id IS DISTINCT FROM step.run_id THEN
            PERFORM cassette_refuse('RUN_MISMATCH: the step belongs to another run');
        END IF;
        IF NEW.act = 'claim' AND step.status IS DISTINCT FROM 'PENDING' THEN
            PERFORM cassette_refuse('INVALID_ATTESTATION: a claim is attested for a PENDING step');
        END IF;
        IF NEW.act = 'claim' AND NEW.fencing_token IS DISTINCT FROM step.fencing_token + 1 THEN
            PERFORM cassette_refuse('STALE_FENCING_TOKEN: a claim is attested with the step''s next token');
        END IF;
        IF NEW.act IN ('release', 'complete', 'requeue') AND step.status IS DISTINCT FROM 'LEASED' THEN
            PERFORM cassette_refuse('NOT_LEASED: only a LEASED step is released, completed or requeued');
        END IF;
        IF NEW.act IN ('release', 'complete', 'requeue')
           AND NEW.fencing_token IS DISTINCT FROM step.fencing_token THEN
            PERFORM cassette_refuse('STALE_FENCING_TOKEN: the token is not the step''s current token');
        END IF;
        IF NEW.act IN ('release', 'complete') AND NEW.worker_id IS DISTINCT FROM step.lease_owner THEN
            PERFORM cassette_refuse('WRONG_WORKER: only the lease owner releases or completes a step');
        END IF;
    END IF;
    -- NOT NULL, then the CHECK constraints in column order
    IF NEW.act IS NULL OR NEW.run_id IS NULL OR NEW.worker_id IS NULL OR NEW.key_id IS NULL
       OR NEW.signature IS NULL THEN
        PERFORM cassette_refuse('CONSTRAINT_VIOLATION: NOT NULL constraint failed: cassette_attestations');
    END IF;
    IF given <= 0 THEN
        PERFORM cassette_refuse('INVALID_ID: attestation_id is a positive integer');
    END IF;
    IF NOT cassette_name_ok(NEW.run_id) THEN
        PERFORM cassette_refuse('INVALID_RUN_ID: run_id is a string of 1-200 characters');
    END IF;
    IF NEW.key_id !~ '^[0-9a-f]{16}$' THEN
        PERFORM cassette_refuse('INVALID_ATTESTATION: key_id is 16 lowercase hex digits');
    END IF;
    IF NEW.signature !~ '^[A-Za-z0-9+/]{86}==$' THEN
        PERFORM cassette_refuse('INVALID_ATTESTATION: signature is 64 bytes in base64');
    END IF;
    IF (NEW.act = 'post'
        AND (NEW.message_id IS NULL OR NEW.step_id IS NOT NULL OR NEW.fencing_token IS NOT NULL))
       OR (NEW.act <> 'post'
           AND (NEW.message_id IS NOT NULL OR NEW.step_id IS NULL OR NEW.fencing_token IS NULL)) THEN
        PERFORM cassette_refuse('INVALID_ATTESTATION: a post names its message, any other act a step and a token');
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION cassette_attestations_journal() RETURNS trigger
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
BEGIN
    PERFORM cassette_journal_append(TG_TABLE_NAME, TG_OP, cassette_j(NEW.attestation_id),
        '{"attestation_id":' || cassette_j(NEW.attestation_id) || ',"act":' || cassette_j(NEW.act)
        || ',"run_id":' || cassette_j(NEW.run_id) || ',"message_id":' || cassette_j(NEW.message_id)
        || ',"step_id":' || cassette_j(NEW.step_id) || ',"fencing_token":' || cassette_j(NEW.fencing_token)
        || ',"worker_id":' || cassette_j(NEW.worker_id) || ',"key_id":' || cassette_j(NEW.key_id)
        || ',"signature":' || cassette_j(NEW.signature) || ',"created_at":' || cassette_j(NEW.created_at) || '}');
    RETURN NULL;
END $$;

-- A lease claimed signed is completed only with its worker's attestation of the
-- completion (one statement of the trigger, one cached plan).
CREATE FUNCTION cassette_receipts_signature() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
DECLARE
    claim_key text;
BEGIN
    SELECT c.key_id INTO claim_key FROM cassette_attestations c
     WHERE c.step_id = NEW.step_id AND c.fencing_token = NEW.fencing_token
       AND c.act = 'claim' AND c.worker_id = NEW.worker_id
     LIMIT 1;
    IF claim_key IS NOT NULL
       AND NOT cassette_attested(NEW.step_id, NEW.fencing_token, 'complete', NEW.worker_id, claim_key)
       AND NOT (NEW.outcome = 'ABORTED'
                AND cassette_attested(NEW.step_id, NEW.fencing_token, 'requeue', NULL, NULL)) THEN
        PERFORM cassette_refuse('SIGNATURE_REQUIRED: this lease was claimed signed; its worker must attest the completion');
    END IF;
    RETURN NEW;
END $$;

-- A release of a signed lease needs its worker's attested release under the same key.
CREATE FUNCTION cassette_releases_signature() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
DECLARE
    claim_key text := cassette_signed_claim(NEW.step_id, NEW.fencing_token, NEW.worker_id);
BEGIN
    IF claim_key IS NOT NULL
       AND NOT cassette_attested(NEW.step_id, NEW.fencing_token, 'release', NEW.worker_id, claim_key) THEN
        PERFORM cassette_refuse('SIGNATURE_REQUIRED: this lease was claimed signed; its worker must attest the release');
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER cassette_attestations_insert BEFORE INSERT ON cassette_attestations
    FOR EACH ROW EXECUTE FUNCTION cassette_attestations_insert();

CREATE TRIGGER cassette_attestations_journal AFTER INSERT ON cassette_attestations
    FOR EACH ROW EXECUTE FUNCTION cassette_attestations_journal();

CREATE TRIGGER cassette_attestations_no_change BEFORE UPDATE OR DELETE ON cassette_attestations
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_attestations_no_truncate BEFORE TRUNCATE ON cassette_attestations
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_receipts_signature BEFORE INSERT ON cassette_receipts
    FOR EACH ROW EXECUTE FUNCTION cassette_receipts_signature();

CREATE TRIGGER cassette_releases_signature BEFORE INSERT ON cassette_releases
    FOR EACH ROW EXECUTE FUNCTION cassette_releases_signature();

-- ==== 70_roles.sql

-- The ledger's roles and what each may do. Every object of the ledger is the database
-- owner's (the migrations run as it, whoever connects: LAW.md 10b); the owner's
-- SECURITY DEFINER functions are the only way the roles write, so each role's power is
-- the list of functions granted to it below, and every rule those functions pass through
-- is the tables' own (triggers fire for the owner's writes too).
--
-- The three roles are cluster-wide and NOLOGIN: a host's login is granted one of them.
--   cassette_worker   claims, completes, releases and requeues steps, posts messages,
--                     attests with its key
--   cassette_appender appends actions and checkpoints
--   cassette_auditor  reads
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

-- No role may create objects in the ledger's schema. PostgreSQL 15 creates databases
-- that way, but an upgraded cluster or a DBA's grant may not; a function or operator a
-- role plants in `public` could be resolved by the owner's trigger functions (the
-- CVE-2018-1058 pattern). The baseline revokes it, and refuses to finish while any
-- ledger role could still create there through a grant of its own.
REVOKE CREATE ON SCHEMA public FROM PUBLIC;

DO $$
DECLARE
    role_name text;
BEGIN
    FOREACH role_name IN ARRAY ARRAY['cassette_worker', 'cassette_appender', 'cassette_auditor'] LOOP
        IF has_schema_privilege(role_name, 'public', 'CREATE') THEN
            RAISE EXCEPTION 'MIGRATION_FAILED: role % may create objects in schema public; revoke it first', role_name;
        END IF;
    END LOOP;
END $$;

-- Nothing is PUBLIC's: a function is executable by PUBLIC when created, and no table
-- may be.
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC;

-- Every role reads every table: the package reads the schema version (is the ledger
-- current?) and the head (the ledger's time) when it opens, and reading gives away
-- nothing (the ledger is tamper-evident, not secret).
GRANT SELECT ON cassette_migrations, cassette_head, cassette_meta, cassette_journal,
                cassette_messages, cassette_jobs, cassette_steps, cassette_receipts,
                cassette_releases, cassette_seals, cassette_actions, cassette_checkpoints,
                cassette_attestations
   TO cassette_worker, cassette_appender, cassette_auditor;

-- Every role may count the journal (verify and the package's reads of its size); the
-- count reads no row.
GRANT EXECUTE ON FUNCTION cassette_journal_size() TO cassette_worker, cassette_appender, cassette_auditor;

-- A worker: the message and step machine (30_steps.sql), the checks the package asks
-- before taking the head (a claim with nothing PENDING, or an idempotent repeat of a post,
-- writes nothing and waits for no one), and its key's attestations (60_worker_keys.sql).
GRANT EXECUTE ON FUNCTION
    cassette_post(text, text, text, text, text[], integer[], text[]),
    cassette_claim(text, text, integer, bigint),
    cassette_complete(text, bigint, text, bigint, text, text),
    cassette_complete_and_claim(text, bigint, text, bigint, text, text, bigint),
    cassette_release(text, bigint, text, bigint),
    cassette_requeue(text, bigint, bigint),
    cassette_run_has_pending(text),
    cassette_run_has_lease_due(text),
    cassette_posted_under_key(text, text, text, text),
    cassette_signer_context(),
    cassette_attest(text, text, bigint, bigint, bigint, text, text, text)
   TO cassette_worker;

-- An appender: actions and checkpoints (40_actions.sql), and the transaction's time it
-- stamps them with.
GRANT EXECUTE ON FUNCTION
    cassette_append_action(text, text, text, text, text, text, text, text, text, text, text,
                           bigint, text, bigint, bigint, text, text, text, text),
    cassette_save_checkpoint(text, text, text),
    cassette_append_time()
   TO cassette_appender;
