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
