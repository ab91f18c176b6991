-- The causal chain on PostgreSQL: cassette_actions and cassette_checkpoints with the law of
-- the SQLite ledger's migrations 0002, 0003, 0005, 0007 and 0010 and the package's TEMP
-- triggers (LAW.md sections 6 and 6a), held by the server for every session.
--   * Each table has one BEFORE INSERT trigger that runs every check in the order SQLite
--     meets them for the same row (its BEFORE triggers newest first, then NOT NULL and the
--     CHECK constraints in column order, then its AFTER triggers newest first), so an input
--     breaking several rules is refused with the code SQLite gives it. The AFTER checks
--     see nothing here that SQLite's would not: every earlier row, not this one.
--   * Ids and times are the server's, as in 0001: action_seq and checkpoint_seq are the
--     next dense id under the head's lock; `timestamp` and created_at are cassette_tx_ms().
--     A given id is refused where SQLite refuses it: an existing one APPEND_ONLY, one not
--     positive INVALID_ID, any other than the next OUT_OF_ORDER.
--   * SHA-256 is the server's: PLAN_HASH_MISMATCH and CHECKPOINT_MISMATCH hold for every
--     session, not only the package's connections (on SQLite they are TEMP triggers).
--   * The journal is written by AFTER INSERT triggers with bodies byte-identical to the
--     json_object() bodies of SQLite's cassette_actions_journal and
--     cassette_checkpoints_journal (schema/connection.sql): every column is TEXT or INTEGER
--     there (success is 0/1, cost is integer micro-units), so bigint and text print alike.
-- Known differences, all on input the API never sends: JSON with a key twice is read by
-- its last value here and by its first on SQLite; a metadata document SQLite finds valid
-- but unreadable (a lone surrogate, a number beyond a double) is refused INVALID_PAYLOAD
-- here even where SQLite would first name another rule its values break.

-- ------------------------------------------------------------------ JSON helpers

-- The json type of a document as json_typeof names it (object, array, string, number,
-- boolean, null), or NULL when the text is not JSON (SQLite's json_valid()).
CREATE FUNCTION cassette_json_type(doc text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN json_typeof(doc::json);
EXCEPTION WHEN others THEN
    RETURN NULL;
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

-- Fixes two bugs of 0001's version, which refused payloads and receipts SQLite accepts
-- (INVALID_PAYLOAD): one holding the escape \u0000 (the API writes it for a string with
-- U+0000; jsonb cannot hold it), and one holding a real written with an exponent that
-- jsonb prints as a long integer (1.5e300 read as an integer beyond 64 bits). Same rule
-- otherwise: a JSON object the API can read back.
CREATE OR REPLACE FUNCTION cassette_readable_object(doc text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(cassette_json_type(doc) = 'object' AND cassette_readable_json(doc), false)
$$;

-- Append one entry whose key is given as JSON (key_json: 7, or "a-uuid") and stored in
-- row_key as SQLite's generated column holds it (json_extract of the key: 7, a-uuid).
-- The four-argument form of 0001 (integer keys, where the two spellings are one) now
-- calls this one; the entry is the same.
CREATE FUNCTION cassette_journal_append(tbl text, op text, key_json text, row_key text, row_json text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    body text := '{"table":' || cassette_j(tbl) || ',"op":' || cassette_j(op)
                 || ',"key":' || key_json || ',"row":' || row_json || '}';
    leaf bytea := sha256('\x00'::bytea || convert_to(body, 'UTF8'));
    entry_seq bigint;
    chain bytea;
BEGIN
    UPDATE cassette_head
       SET next_seq = next_seq + 1,
           chain_hash = sha256('\x02'::bytea || int8send(next_seq) || chain_hash || leaf)
    RETURNING next_seq - 1, chain_hash INTO entry_seq, chain;
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash, tbl, row_key)
    VALUES (entry_seq, body, leaf, chain, tbl, row_key);
END $$;

CREATE OR REPLACE FUNCTION cassette_journal_append(tbl text, op text, row_key text, row_json text)
RETURNS void LANGUAGE sql AS $$
    SELECT cassette_journal_append(tbl, op, row_key, row_key, row_json)
$$;

CREATE FUNCTION cassette_sha256_hex(value text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT encode(sha256(convert_to(value, 'UTF8')), 'hex') $$;

-- ------------------------------------------------------------------ checkpoints

CREATE TABLE cassette_checkpoints (
    checkpoint_seq bigint PRIMARY KEY CHECK (checkpoint_seq > 0),
    checkpoint_id text NOT NULL UNIQUE,
    plan_id text NOT NULL,
    context_json text NOT NULL,
    created_at bigint NOT NULL
);
CREATE INDEX cassette_checkpoints_by_plan ON cassette_checkpoints (plan_id, checkpoint_seq);

CREATE FUNCTION cassette_checkpoints_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
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
CREATE TRIGGER cassette_checkpoints_insert BEFORE INSERT ON cassette_checkpoints
    FOR EACH ROW EXECUTE FUNCTION cassette_checkpoints_insert();

CREATE FUNCTION cassette_checkpoints_journal() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cassette_journal_append(TG_TABLE_NAME, TG_OP, cassette_j(NEW.checkpoint_id), NEW.checkpoint_id,
        '{"checkpoint_seq":' || cassette_j(NEW.checkpoint_seq) || ',"checkpoint_id":' || cassette_j(NEW.checkpoint_id)
        || ',"plan_id":' || cassette_j(NEW.plan_id) || ',"context_json":' || cassette_j(NEW.context_json)
        || ',"created_at":' || cassette_j(NEW.created_at) || '}');
    RETURN NULL;
END $$;
CREATE TRIGGER cassette_checkpoints_journal AFTER INSERT ON cassette_checkpoints
    FOR EACH ROW EXECUTE FUNCTION cassette_checkpoints_journal();

-- --------------------------------------------------------------------- actions

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
CREATE INDEX cassette_actions_by_plan ON cassette_actions (plan_id, action_seq);
CREATE INDEX cassette_actions_by_intent ON cassette_actions (intent_id, action_seq);
CREATE INDEX cassette_actions_by_type ON cassette_actions (action_type, action_seq);
CREATE INDEX cassette_actions_by_session ON cassette_actions (session_id, action_seq)
    WHERE session_id IS NOT NULL;
CREATE INDEX cassette_actions_by_parent ON cassette_actions (parent_action_id, action_seq)
    WHERE parent_action_id IS NOT NULL;
CREATE INDEX cassette_actions_by_cause ON cassette_actions (caused_by, action_seq)
    WHERE caused_by IS NOT NULL;
CREATE INDEX cassette_actions_plan_lifecycle ON cassette_actions (plan_id, action_seq)
    WHERE action_type IN ('PlanStarted', 'PlanPaused', 'PlanResumed', 'PlanCompleted', 'PlanAborted');
CREATE INDEX cassette_actions_by_time ON cassette_actions ("timestamp", action_seq);
CREATE INDEX cassette_actions_by_function ON cassette_actions (function_name, action_seq);

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

-- SQLite's cassette_actions_lifecycle_guard (0003, moved behind a gate by 0010).
CREATE FUNCTION cassette_actions_lifecycle(a cassette_actions, meta json) RETURNS void
LANGUAGE plpgsql AS $$
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
LANGUAGE plpgsql AS $$
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
CREATE TRIGGER cassette_actions_insert BEFORE INSERT ON cassette_actions
    FOR EACH ROW EXECUTE FUNCTION cassette_actions_insert();

CREATE FUNCTION cassette_actions_journal() RETURNS trigger
LANGUAGE plpgsql AS $$
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
CREATE TRIGGER cassette_actions_journal AFTER INSERT ON cassette_actions
    FOR EACH ROW EXECUTE FUNCTION cassette_actions_journal();

-- ------------------------------------------------------------------ append-only

CREATE TRIGGER cassette_actions_no_change BEFORE UPDATE OR DELETE ON cassette_actions
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();
CREATE TRIGGER cassette_checkpoints_no_change BEFORE UPDATE OR DELETE ON cassette_checkpoints
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();
CREATE TRIGGER cassette_actions_no_truncate BEFORE TRUNCATE ON cassette_actions
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();
CREATE TRIGGER cassette_checkpoints_no_truncate BEFORE TRUNCATE ON cassette_checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();

-- ------------------------------------------------------- the appender's functions

-- Append one action; its seq and time (the transaction's). The triggers hold the law.
CREATE FUNCTION cassette_append_action(
    p_action_id text, p_parent_action_id text, p_plan_id text, p_intent_id text,
    p_session_id text, p_action_type text, p_function_name text, p_arguments_json text,
    p_arguments_artifact text, p_result_json text, p_result_artifact text, p_success bigint,
    p_error_message text, p_cost_micros bigint, p_duration_ms bigint, p_metadata_json text,
    p_caused_by text, p_rationale text, p_category text,
    OUT action_seq bigint, OUT action_time bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
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

-- Store a checkpoint unless this id holds it already (then nothing is written); another
-- context under the id is CHECKPOINT_MISMATCH. Returns the id.
CREATE FUNCTION cassette_save_checkpoint(p_checkpoint_id text, p_plan_id text, p_context_json text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    stored text;
BEGIN
    PERFORM cassette_tx_ms();
    SELECT context_json INTO stored FROM cassette_checkpoints WHERE checkpoint_id = p_checkpoint_id;
    IF FOUND THEN
        IF stored IS DISTINCT FROM p_context_json THEN
            RAISE EXCEPTION 'CHECKPOINT_MISMATCH: % holds another context than its id names', p_checkpoint_id;
        END IF;
        RETURN p_checkpoint_id;
    END IF;
    INSERT INTO cassette_checkpoints (checkpoint_id, plan_id, context_json, created_at)
    VALUES (p_checkpoint_id, p_plan_id, p_context_json, 0);
    RETURN p_checkpoint_id;
END $$;

REVOKE ALL ON ALL TABLES IN SCHEMA public FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC;
GRANT SELECT ON cassette_actions, cassette_checkpoints
   TO cassette_worker, cassette_appender, cassette_auditor;
-- Every role opens the ledger through the package, which reads the schema version first
-- (0002 granted no role this read, so only the owner could open it).
GRANT SELECT ON cassette_migrations TO cassette_worker, cassette_appender, cassette_auditor;
GRANT EXECUTE ON FUNCTION
    cassette_append_action(text, text, text, text, text, text, text, text, text, text, text,
                           bigint, text, bigint, bigint, text, text, text, text),
    cassette_save_checkpoint(text, text, text)
   TO cassette_appender;
