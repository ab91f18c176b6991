-- The causal chain: actions (plan, step and capability events) with their execution parent
-- and causes, the plan lifecycle, and the checkpoints of paused plans (LAW.md, "Causal
-- chain", "Plan lifecycle"). Large arguments or results live in content-addressed
-- artifact files beside the database; the row then holds {"sha256", "size", "path"}.
--
-- A trigger's frame, as large as its whole program, is allocated and zeroed each time the
-- statement that fires it runs, even when its WHEN clause is false (SQLite 3.40): so the
-- large checks that rarely apply stand on views that store nothing (the readable-JSON and
-- artifact checks on cassette_actions_readable, the lifecycle on cassette_actions_lifecycle)
-- and small gates in the rules insert into those views only when a check can apply. A
-- constant IN list of more than two values is built as a temporary b-tree each time it is
-- evaluated: the write path tests its lists as comparisons instead.

-- ============================================================================
-- cassette_actions

-- An action: a plan, step or capability event with its execution parent, its causes and
-- rationale, its arguments, result and metadata (JSON), its cost and time.
CREATE TABLE cassette_actions (
    action_seq INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (action_seq > 0),
    action_id TEXT NOT NULL UNIQUE
        CONSTRAINT INVALID_ACTION_ID CHECK (
            length(action_id) = 36 AND action_id NOT GLOB '*[^0-9a-f-]*'
            AND substr(action_id, 9, 1) = '-' AND substr(action_id, 14, 1) = '-'
            AND substr(action_id, 19, 1) = '-' AND substr(action_id, 24, 1) = '-'
            AND action_id NOT GLOB '*-*-*-*-*-*'
        ),
    parent_action_id TEXT,
    plan_id TEXT NOT NULL CONSTRAINT INVALID_PLAN_ID CHECK (length(plan_id) BETWEEN 1 AND 200),
    intent_id TEXT NOT NULL
        CONSTRAINT INVALID_INTENT CHECK (length(intent_id) BETWEEN 1 AND 200),
    session_id TEXT
        CONSTRAINT INVALID_SESSION_ID CHECK (length(session_id) BETWEEN 1 AND 200),
    action_type TEXT NOT NULL
        CONSTRAINT INVALID_ACTION_TYPE CHECK (
            action_type = 'PlanStarted' OR action_type = 'PlanCompleted' OR action_type = 'PlanAborted'
            OR action_type = 'PlanPaused' OR action_type = 'PlanResumed' OR action_type = 'PlanStepStarted'
            OR action_type = 'PlanStepCompleted' OR action_type = 'PlanStepFailed' OR action_type = 'PlanStepRetrying'
            OR action_type = 'CapabilityCall' OR action_type = 'CapabilityResult' OR action_type = 'InternalStep'),
    function_name TEXT NOT NULL
        CONSTRAINT INVALID_FUNCTION_NAME CHECK (length(function_name) BETWEEN 1 AND 200),
    arguments_json TEXT
        CONSTRAINT INVALID_ARGUMENTS CHECK (
            arguments_json IS NULL OR CASE WHEN json_valid(arguments_json) THEN json_type(arguments_json) = 'array' ELSE 0 END
        ),
    arguments_artifact TEXT
        CONSTRAINT INVALID_ARTIFACT CHECK (
            arguments_artifact IS NULL OR CASE WHEN json_valid(arguments_artifact)
                 THEN json_type(arguments_artifact, '$.sha256') = 'text'
                      AND json_type(arguments_artifact, '$.size') = 'integer'
                 ELSE 0 END
        ),
    result_json TEXT
        CONSTRAINT INVALID_PAYLOAD CHECK (result_json IS NULL OR json_valid(result_json)),
    result_artifact TEXT
        CONSTRAINT INVALID_ARTIFACT CHECK (
            result_artifact IS NULL OR CASE WHEN json_valid(result_artifact)
                 THEN json_type(result_artifact, '$.sha256') = 'text'
                      AND json_type(result_artifact, '$.size') = 'integer'
                 ELSE 0 END
        ),
    success INTEGER NOT NULL CONSTRAINT INVALID_SUCCESS CHECK (success IN (0, 1)),
    error_message TEXT,
    cost_micros INTEGER NOT NULL CONSTRAINT INVALID_COST CHECK (cost_micros >= 0),
    duration_ms INTEGER NOT NULL CONSTRAINT INVALID_DURATION CHECK (duration_ms >= 0),
    timestamp INTEGER NOT NULL,
    metadata_json TEXT NOT NULL
        CONSTRAINT INVALID_METADATA CHECK (
            CASE WHEN json_valid(metadata_json) THEN json_type(metadata_json) = 'object' ELSE 0 END
        ),
    caused_by TEXT,
    rationale TEXT,
    category TEXT
            CONSTRAINT INVALID_CATEGORY CHECK (
            category IS NULL
            OR category = 'conversation' OR category = 'decision' OR category = 'file_edit'
            OR category = 'tool_use' OR category = 'research'
        ),
    CONSTRAINT INVALID_ARTIFACT CHECK (arguments_json IS NULL OR arguments_artifact IS NULL),
    CONSTRAINT INVALID_ARTIFACT CHECK (result_json IS NULL OR result_artifact IS NULL)
) STRICT;

-- Queryable by plan, intent, type, session, parent, reasoning link, cause, time and function.
CREATE INDEX cassette_actions_by_plan ON cassette_actions (plan_id, action_seq);

CREATE INDEX cassette_actions_by_intent ON cassette_actions (intent_id, action_seq);

CREATE INDEX cassette_actions_by_type ON cassette_actions (action_type, action_seq);

CREATE INDEX cassette_actions_by_session ON cassette_actions (session_id, action_seq)
    WHERE session_id IS NOT NULL;

CREATE INDEX cassette_actions_by_parent ON cassette_actions (parent_action_id, action_seq)
    WHERE parent_action_id IS NOT NULL;

CREATE INDEX cassette_actions_by_link_intent
    ON cassette_actions (json_extract(metadata_json, '$.intent_id'), action_seq)
    WHERE json_extract(metadata_json, '$.intent_id') IS NOT NULL;

CREATE INDEX cassette_actions_by_link_rule
    ON cassette_actions (json_extract(metadata_json, '$.constitutional_rule_id'), action_seq)
    WHERE json_extract(metadata_json, '$.constitutional_rule_id') IS NOT NULL;

CREATE INDEX cassette_actions_by_link_delegation
    ON cassette_actions (json_extract(metadata_json, '$.delegation_decision_id'), action_seq)
    WHERE json_extract(metadata_json, '$.delegation_decision_id') IS NOT NULL;

CREATE INDEX cassette_actions_by_link_attestation
    ON cassette_actions (json_extract(metadata_json, '$.capability_attestation_id'), action_seq)
    WHERE json_extract(metadata_json, '$.capability_attestation_id') IS NOT NULL;

-- Append-only.
CREATE TRIGGER cassette_actions_no_update BEFORE UPDATE ON cassette_actions
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_actions rows cannot be updated'); END;

CREATE TRIGGER cassette_actions_no_delete BEFORE DELETE ON cassette_actions
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_actions rows cannot be deleted'); END;

CREATE INDEX cassette_actions_by_cause ON cassette_actions (caused_by, action_seq)
    WHERE caused_by IS NOT NULL;

-- The plan-level lifecycle actions of a plan, newest last: the plan's state is the type
-- of the last one. Its WHERE clause is comparisons; a query repeats it exactly to use it.
CREATE INDEX cassette_actions_plan_lifecycle ON cassette_actions (plan_id, action_seq)
    WHERE (action_type = 'PlanStarted' OR action_type = 'PlanPaused' OR action_type = 'PlanResumed'
           OR action_type = 'PlanCompleted' OR action_type = 'PlanAborted');

CREATE INDEX cassette_actions_by_time ON cassette_actions (timestamp, action_seq);

CREATE INDEX cassette_actions_by_function ON cassette_actions (function_name, action_seq);

-- The rules every action meets, before it is written: journal, time, dense ids, and the
-- small gates that insert into the views below when their large
-- checks can apply (text that could hold an unreadable number, a deep nesting or a lone
-- surrogate, or an artifact reference).
CREATE TRIGGER cassette_actions_rules BEFORE INSERT ON cassette_actions
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'INVALID_PLAN_BODY: plan_body and plan_hash belong to a PlanStarted action')
        WHEN 2 THEN RAISE(ABORT, 'INVALID_PLAN_BODY: plan_body is text and plan_hash 64 lowercase hex digits')
        WHEN 3 THEN RAISE(ABORT, 'INVALID_METADATA: suggested_causes is an array of at most 20 {action_id, reason} objects')
        WHEN 4 THEN RAISE(ABORT, 'REFERENCE_MISSING: a suggested cause names no earlier action')
        WHEN 5 THEN RAISE(ABORT, 'CAUSE_AFTER_EFFECT: the cause (caused_by) has a later timestamp than its effect')
        WHEN 6 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection')
        WHEN 7 THEN RAISE(ABORT, 'INVALID_TIME: timestamp is an integer of epoch ms before the year 10000')
        WHEN 8 THEN RAISE(ABORT, 'TIME_BACKWARDS: timestamp is an integer no earlier than the ledger''s latest time') END
    FROM (SELECT k.id, CASE
            WHEN (CASE WHEN json_valid(NEW.metadata_json) THEN json_type(NEW.metadata_json, '$.plan_body') END IS NOT NULL
                  OR CASE WHEN json_valid(NEW.metadata_json) THEN json_type(NEW.metadata_json, '$.plan_hash') END IS NOT NULL)
                 AND NEW.action_type IS NOT 'PlanStarted' THEN 1
            WHEN (CASE WHEN json_valid(NEW.metadata_json) THEN json_type(NEW.metadata_json, '$.plan_body') END IS NOT NULL
                  OR CASE WHEN json_valid(NEW.metadata_json) THEN json_type(NEW.metadata_json, '$.plan_hash') END IS NOT NULL)
                 AND (json_type(NEW.metadata_json, '$.plan_body') IS NOT 'text'
                      OR json_type(NEW.metadata_json, '$.plan_hash') IS NOT 'text'
                      OR length(json_extract(NEW.metadata_json, '$.plan_hash')) IS NOT 64
                      OR json_extract(NEW.metadata_json, '$.plan_hash') GLOB '*[^0-9a-f]*') THEN 2
            WHEN CASE WHEN json_valid(NEW.metadata_json) THEN json_type(NEW.metadata_json, '$.suggested_causes') END IS NOT NULL
                 AND (json_type(NEW.metadata_json, '$.suggested_causes') IS NOT 'array'
                      OR json_array_length(NEW.metadata_json, '$.suggested_causes') > 20
                      OR EXISTS (SELECT 1 FROM json_each(NEW.metadata_json, '$.suggested_causes') s
                                 WHERE s.type IS NOT 'object'
                                    OR json_type(s.value, '$.action_id') IS NOT 'text'
                                    OR json_type(s.value, '$.reason') IS NOT 'text'
                                    OR length(json_extract(s.value, '$.reason')) NOT BETWEEN 1 AND 500
                                    OR (SELECT count(*) FROM json_each(s.value)) IS NOT 2)) THEN 3
            WHEN CASE WHEN json_valid(NEW.metadata_json) THEN json_type(NEW.metadata_json, '$.suggested_causes') END IS NOT NULL
                 AND EXISTS (SELECT 1 FROM json_each(NEW.metadata_json, '$.suggested_causes') s
                             WHERE NOT EXISTS (
                                 SELECT 1 FROM cassette_actions c
                                  WHERE c.action_id = json_extract(s.value, '$.action_id')
                                    AND c.action_seq < k.id)) THEN 4
            WHEN NEW.caused_by IS NOT NULL
                 AND (SELECT c.timestamp FROM cassette_actions c WHERE c.action_id = NEW.caused_by)
                     > NEW.timestamp THEN 5
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_actions', 'op', 'INSERT', 'key', NEW.action_id,
                  'row', json_object('action_seq', k.id, 'action_id', NEW.action_id,
                           'parent_action_id', NEW.parent_action_id, 'plan_id', NEW.plan_id,
                           'intent_id', NEW.intent_id, 'session_id', NEW.session_id,
                           'action_type', NEW.action_type, 'function_name', NEW.function_name,
                           'arguments_json', NEW.arguments_json,
                           'arguments_artifact', NEW.arguments_artifact,
                           'result_json', NEW.result_json, 'result_artifact', NEW.result_artifact,
                           'success', NEW.success, 'error_message', NEW.error_message,
                           'cost_micros', NEW.cost_micros, 'duration_ms', NEW.duration_ms,
                           'timestamp', NEW.timestamp, 'metadata_json', NEW.metadata_json,
                           'caused_by', NEW.caused_by, 'rationale', NEW.rationale,
                           'category', NEW.category)) THEN 6
            WHEN typeof(NEW.timestamp) IS NOT 'integer' OR NEW.timestamp > 253402300799999 THEN 7
            WHEN NEW.timestamp < (SELECT ms FROM cassette_ledger_time) THEN 8 END AS broken
          FROM (SELECT CASE WHEN NEW.action_seq = -1 THEN coalesce((SELECT action_seq FROM cassette_actions NOT INDEXED ORDER BY action_seq DESC LIMIT 1), 0) + 1 ELSE NEW.action_seq END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.action_id IS NOT NULL AND NEW.plan_id IS NOT NULL AND NEW.intent_id IS NOT NULL AND NEW.action_type IS NOT NULL AND NEW.function_name IS NOT NULL AND NEW.success IS NOT NULL AND NEW.cost_micros IS NOT NULL AND NEW.duration_ms IS NOT NULL AND NEW.timestamp IS NOT NULL AND NEW.metadata_json IS NOT NULL
      AND (r.id > 0
           AND coalesce(length(NEW.action_id) = 36 AND NEW.action_id NOT GLOB '*[^0-9a-f-]*'
          AND substr(NEW.action_id, 9, 1) = '-' AND substr(NEW.action_id, 14, 1) = '-'
          AND substr(NEW.action_id, 19, 1) = '-' AND substr(NEW.action_id, 24, 1) = '-'
          AND NEW.action_id NOT GLOB '*-*-*-*-*-*', 1)
           AND coalesce(length(NEW.plan_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.intent_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.session_id) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.action_type = 'PlanStarted' OR NEW.action_type = 'PlanCompleted' OR NEW.action_type = 'PlanAborted'
          OR NEW.action_type = 'PlanPaused' OR NEW.action_type = 'PlanResumed' OR NEW.action_type = 'PlanStepStarted'
          OR NEW.action_type = 'PlanStepCompleted' OR NEW.action_type = 'PlanStepFailed' OR NEW.action_type = 'PlanStepRetrying'
          OR NEW.action_type = 'CapabilityCall' OR NEW.action_type = 'CapabilityResult' OR NEW.action_type = 'InternalStep', 1)
           AND coalesce(length(NEW.function_name) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.arguments_json IS NULL OR CASE WHEN json_valid(NEW.arguments_json) THEN json_type(NEW.arguments_json) = 'array' ELSE 0 END, 1)
           AND coalesce(NEW.arguments_artifact IS NULL OR CASE WHEN json_valid(NEW.arguments_artifact)
          THEN json_type(NEW.arguments_artifact, '$.sha256') = 'text' AND json_type(NEW.arguments_artifact, '$.size') = 'integer' ELSE 0 END, 1)
           AND coalesce(NEW.result_json IS NULL OR json_valid(NEW.result_json), 1)
           AND coalesce(NEW.result_artifact IS NULL OR CASE WHEN json_valid(NEW.result_artifact)
          THEN json_type(NEW.result_artifact, '$.sha256') = 'text' AND json_type(NEW.result_artifact, '$.size') = 'integer' ELSE 0 END, 1)
           AND coalesce(NEW.success IN (0, 1), 1)
           AND coalesce(NEW.cost_micros >= 0, 1)
           AND coalesce(NEW.duration_ms >= 0, 1)
           AND coalesce(CASE WHEN json_valid(NEW.metadata_json) THEN json_type(NEW.metadata_json) = 'object' ELSE 0 END, 1)
           AND coalesce(NEW.category IS NULL OR NEW.category = 'conversation' OR NEW.category = 'decision'
          OR NEW.category = 'file_edit' OR NEW.category = 'tool_use' OR NEW.category = 'research', 1)
           AND coalesce(NEW.arguments_json IS NULL OR NEW.arguments_artifact IS NULL, 1)
           AND coalesce(NEW.result_json IS NULL OR NEW.result_artifact IS NULL, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
    INSERT INTO cassette_actions_readable
        (arguments_json, result_json, metadata_json, arguments_artifact, result_artifact)
    SELECT NEW.arguments_json, NEW.result_json, NEW.metadata_json,
           NEW.arguments_artifact, NEW.result_artifact
    FROM (SELECT CASE WHEN NEW.action_seq = -1 THEN coalesce((SELECT action_seq FROM cassette_actions NOT INDEXED ORDER BY action_seq DESC LIMIT 1), 0) + 1 ELSE NEW.action_seq END AS id) AS r
    WHERE (NEW.arguments_json GLOB '*[0-9][eE]*' OR NEW.arguments_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
      OR length(NEW.arguments_json) > 2048 OR instr(lower(NEW.arguments_json), '\ud') > 0
      OR NEW.result_json GLOB '*[0-9][eE]*' OR NEW.result_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
      OR length(NEW.result_json) > 2048 OR instr(lower(NEW.result_json), '\ud') > 0
      OR NEW.metadata_json GLOB '*[0-9][eE]*' OR NEW.metadata_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
      OR length(NEW.metadata_json) > 2048 OR instr(lower(NEW.metadata_json), '\ud') > 0
      OR NEW.arguments_artifact IS NOT NULL OR NEW.result_artifact IS NOT NULL)
      AND NEW.action_id IS NOT NULL AND NEW.plan_id IS NOT NULL AND NEW.intent_id IS NOT NULL AND NEW.action_type IS NOT NULL AND NEW.function_name IS NOT NULL AND NEW.success IS NOT NULL AND NEW.cost_micros IS NOT NULL AND NEW.duration_ms IS NOT NULL AND NEW.timestamp IS NOT NULL AND NEW.metadata_json IS NOT NULL
      AND (r.id > 0
           AND coalesce(length(NEW.action_id) = 36 AND NEW.action_id NOT GLOB '*[^0-9a-f-]*'
          AND substr(NEW.action_id, 9, 1) = '-' AND substr(NEW.action_id, 14, 1) = '-'
          AND substr(NEW.action_id, 19, 1) = '-' AND substr(NEW.action_id, 24, 1) = '-'
          AND NEW.action_id NOT GLOB '*-*-*-*-*-*', 1)
           AND coalesce(length(NEW.plan_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.intent_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.session_id) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.action_type = 'PlanStarted' OR NEW.action_type = 'PlanCompleted' OR NEW.action_type = 'PlanAborted'
          OR NEW.action_type = 'PlanPaused' OR NEW.action_type = 'PlanResumed' OR NEW.action_type = 'PlanStepStarted'
          OR NEW.action_type = 'PlanStepCompleted' OR NEW.action_type = 'PlanStepFailed' OR NEW.action_type = 'PlanStepRetrying'
          OR NEW.action_type = 'CapabilityCall' OR NEW.action_type = 'CapabilityResult' OR NEW.action_type = 'InternalStep', 1)
           AND coalesce(length(NEW.function_name) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.arguments_json IS NULL OR CASE WHEN json_valid(NEW.arguments_json) THEN json_type(NEW.arguments_json) = 'array' ELSE 0 END, 1)
           AND coalesce(NEW.arguments_artifact IS NULL OR CASE WHEN json_valid(NEW.arguments_artifact)
          THEN json_type(NEW.arguments_artifact, '$.sha256') = 'text' AND json_type(NEW.arguments_artifact, '$.size') = 'integer' ELSE 0 END, 1)
           AND coalesce(NEW.result_json IS NULL OR json_valid(NEW.result_json), 1)
           AND coalesce(NEW.result_artifact IS NULL OR CASE WHEN json_valid(NEW.result_artifact)
          THEN json_type(NEW.result_artifact, '$.sha256') = 'text' AND json_type(NEW.result_artifact, '$.size') = 'integer' ELSE 0 END, 1)
           AND coalesce(NEW.success IN (0, 1), 1)
           AND coalesce(NEW.cost_micros >= 0, 1)
           AND coalesce(NEW.duration_ms >= 0, 1)
           AND coalesce(CASE WHEN json_valid(NEW.metadata_json) THEN json_type(NEW.metadata_json) = 'object' ELSE 0 END, 1)
           AND coalesce(NEW.category IS NULL OR NEW.category = 'conversation' OR NEW.category = 'decision'
          OR NEW.category = 'file_edit' OR NEW.category = 'tool_use' OR NEW.category = 'research', 1)
           AND coalesce(NEW.arguments_json IS NULL OR NEW.arguments_artifact IS NULL, 1)
           AND coalesce(NEW.result_json IS NULL OR NEW.result_artifact IS NULL, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: action_seq must follow the last one')
        WHEN 2 THEN RAISE(ABORT, 'OUT_OF_ORDER: an action_seq must be larger than every existing one') END
    FROM (SELECT k.id, CASE
            WHEN k.id > 1 AND NOT EXISTS (SELECT 1 FROM cassette_actions NOT INDEXED WHERE action_seq = k.id - 1) THEN 1
            WHEN EXISTS (SELECT 1 FROM cassette_actions WHERE action_seq > k.id) THEN 2 END AS broken
          FROM (SELECT CASE WHEN NEW.action_seq = -1 THEN coalesce((SELECT action_seq FROM cassette_actions NOT INDEXED ORDER BY action_seq DESC LIMIT 1), 0) + 1 ELSE NEW.action_seq END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.action_id IS NOT NULL AND NEW.plan_id IS NOT NULL AND NEW.intent_id IS NOT NULL AND NEW.action_type IS NOT NULL AND NEW.function_name IS NOT NULL AND NEW.success IS NOT NULL AND NEW.cost_micros IS NOT NULL AND NEW.duration_ms IS NOT NULL AND NEW.timestamp IS NOT NULL AND NEW.metadata_json IS NOT NULL
      AND (r.id > 0
           AND coalesce(length(NEW.action_id) = 36 AND NEW.action_id NOT GLOB '*[^0-9a-f-]*'
          AND substr(NEW.action_id, 9, 1) = '-' AND substr(NEW.action_id, 14, 1) = '-'
          AND substr(NEW.action_id, 19, 1) = '-' AND substr(NEW.action_id, 24, 1) = '-'
          AND NEW.action_id NOT GLOB '*-*-*-*-*-*', 1)
           AND coalesce(length(NEW.plan_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.intent_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.session_id) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.action_type = 'PlanStarted' OR NEW.action_type = 'PlanCompleted' OR NEW.action_type = 'PlanAborted'
          OR NEW.action_type = 'PlanPaused' OR NEW.action_type = 'PlanResumed' OR NEW.action_type = 'PlanStepStarted'
          OR NEW.action_type = 'PlanStepCompleted' OR NEW.action_type = 'PlanStepFailed' OR NEW.action_type = 'PlanStepRetrying'
          OR NEW.action_type = 'CapabilityCall' OR NEW.action_type = 'CapabilityResult' OR NEW.action_type = 'InternalStep', 1)
           AND coalesce(length(NEW.function_name) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.arguments_json IS NULL OR CASE WHEN json_valid(NEW.arguments_json) THEN json_type(NEW.arguments_json) = 'array' ELSE 0 END, 1)
           AND coalesce(NEW.arguments_artifact IS NULL OR CASE WHEN json_valid(NEW.arguments_artifact)
          THEN json_type(NEW.arguments_artifact, '$.sha256') = 'text' AND json_type(NEW.arguments_artifact, '$.size') = 'integer' ELSE 0 END, 1)
           AND coalesce(NEW.result_json IS NULL OR json_valid(NEW.result_json), 1)
           AND coalesce(NEW.result_artifact IS NULL OR CASE WHEN json_valid(NEW.result_artifact)
          THEN json_type(NEW.result_artifact, '$.sha256') = 'text' AND json_type(NEW.result_artifact, '$.size') = 'integer' ELSE 0 END, 1)
           AND coalesce(NEW.success IN (0, 1), 1)
           AND coalesce(NEW.cost_micros >= 0, 1)
           AND coalesce(NEW.duration_ms >= 0, 1)
           AND coalesce(CASE WHEN json_valid(NEW.metadata_json) THEN json_type(NEW.metadata_json) = 'object' ELSE 0 END, 1)
           AND coalesce(NEW.category IS NULL OR NEW.category = 'conversation' OR NEW.category = 'decision'
          OR NEW.category = 'file_edit' OR NEW.category = 'tool_use' OR NEW.category = 'research', 1)
           AND coalesce(NEW.arguments_json IS NULL OR NEW.arguments_artifact IS NULL, 1)
           AND coalesce(NEW.result_json IS NULL OR NEW.result_artifact IS NULL, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

-- An action_seq and an action_id are used once; a parent exists before its child, so the
-- execution tree is acyclic by construction.
CREATE TRIGGER cassette_actions_insert_guard BEFORE INSERT ON cassette_actions
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: an action with this action_seq exists')
    WHERE EXISTS (SELECT 1 FROM cassette_actions WHERE action_seq = NEW.action_seq);
    SELECT RAISE(ABORT, 'APPEND_ONLY: an action with this action_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_actions WHERE action_id = NEW.action_id);
    SELECT RAISE(ABORT, 'REFERENCE_MISSING: the parent action does not exist')
    WHERE NEW.parent_action_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM cassette_actions WHERE action_id = NEW.parent_action_id);
END;

-- A cause must exist before its effect, so cause chains are acyclic by construction.
CREATE TRIGGER cassette_actions_cause_guard BEFORE INSERT ON cassette_actions
WHEN NEW.caused_by IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'REFERENCE_MISSING: the cause (caused_by) does not exist')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_actions WHERE action_id = NEW.caused_by);
END;

-- The gate of the lifecycle guard: only a Plan* action or a checkpoint reference pays
-- for it.
CREATE TRIGGER cassette_actions_lifecycle_gate BEFORE INSERT ON cassette_actions
WHEN NEW.action_type GLOB 'Plan*'
  OR CASE WHEN json_valid(NEW.metadata_json)
          THEN json_extract(NEW.metadata_json, '$.checkpoint_id') IS NOT NULL END
BEGIN
    INSERT INTO cassette_actions_lifecycle (plan_id, action_type, parent_action_id, metadata_json)
    VALUES (NEW.plan_id, NEW.action_type, NEW.parent_action_id, NEW.metadata_json);
END;

-- Created after the lifecycle gate so that it fires first: an action of a finished plan
-- is always PLAN_FINISHED.
CREATE TRIGGER cassette_actions_plan_finished BEFORE INSERT ON cassette_actions
BEGIN
    SELECT RAISE(ABORT, 'PLAN_FINISHED: the plan has completed or aborted')
    WHERE (SELECT action_type FROM cassette_actions
           WHERE plan_id = NEW.plan_id
             AND (action_type = 'PlanStarted' OR action_type = 'PlanPaused'
                  OR action_type = 'PlanResumed' OR action_type = 'PlanCompleted'
                  OR action_type = 'PlanAborted')
           ORDER BY action_seq DESC LIMIT 1) IN ('PlanCompleted', 'PlanAborted');
END;

-- ============================================================================
-- cassette_actions_readable

-- Stores nothing: inserting into it runs the readable-JSON and artifact checks of an action
-- (INSTEAD OF triggers, newest first) and keeps no row. SQLite accepts as JSON what the
-- API cannot read back: {"a": 1e400} (an infinite double), integers beyond 64 bits,
-- nesting deeper than 1024 (SQLite allows 2000), and lone surrogate escapes such as
-- "\ud800". Nesting: wrapped in 976 more levels, a document deeper than 1024 exceeds
-- SQLite's 2000.
CREATE VIEW cassette_actions_readable
    (arguments_json, result_json, metadata_json, arguments_artifact, result_artifact)
AS SELECT NULL, NULL, NULL, NULL, NULL WHERE 0;

CREATE TRIGGER cassette_actions_readable_arguments INSTEAD OF INSERT ON cassette_actions_readable
WHEN NEW.arguments_json GLOB '*[0-9][eE]*' OR NEW.arguments_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.arguments_json) > 2048 OR instr(lower(NEW.arguments_json), '\ud') > 0
BEGIN
    SELECT RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
    WHERE json_valid(NEW.arguments_json) AND (
        (length(NEW.arguments_json) > 2048
         AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.arguments_json
                            || replace(hex(zeroblob(975)), '00', ']') || ']'))
        OR EXISTS (
            SELECT 1 FROM json_tree(NEW.arguments_json)
            WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
               OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
               OR (instr(lower(NEW.arguments_json), '\ud') > 0 AND (
                   (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                   OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))))));
END;

CREATE TRIGGER cassette_actions_readable_result INSTEAD OF INSERT ON cassette_actions_readable
WHEN NEW.result_json GLOB '*[0-9][eE]*' OR NEW.result_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.result_json) > 2048 OR instr(lower(NEW.result_json), '\ud') > 0
BEGIN
    SELECT RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
    WHERE json_valid(NEW.result_json) AND (
        (length(NEW.result_json) > 2048
         AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.result_json
                            || replace(hex(zeroblob(975)), '00', ']') || ']'))
        OR EXISTS (
            SELECT 1 FROM json_tree(NEW.result_json)
            WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
               OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
               OR (instr(lower(NEW.result_json), '\ud') > 0 AND (
                   (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                   OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))))));
END;

CREATE TRIGGER cassette_actions_readable_metadata INSTEAD OF INSERT ON cassette_actions_readable
WHEN NEW.metadata_json GLOB '*[0-9][eE]*' OR NEW.metadata_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.metadata_json) > 2048 OR instr(lower(NEW.metadata_json), '\ud') > 0
BEGIN
    SELECT RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
    WHERE json_valid(NEW.metadata_json) AND (
        (length(NEW.metadata_json) > 2048
         AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.metadata_json
                            || replace(hex(zeroblob(975)), '00', ']') || ']'))
        OR EXISTS (
            SELECT 1 FROM json_tree(NEW.metadata_json)
            WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
               OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
               OR (instr(lower(NEW.metadata_json), '\ud') > 0 AND (
                   (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                   OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))))));
END;

CREATE TRIGGER cassette_actions_readable_arguments_artifact INSTEAD OF INSERT ON cassette_actions_readable
WHEN NEW.arguments_artifact GLOB '*[0-9][eE]*' OR NEW.arguments_artifact GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.arguments_artifact) > 2048 OR instr(lower(NEW.arguments_artifact), '\ud') > 0
BEGIN
    SELECT RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
    WHERE json_valid(NEW.arguments_artifact) AND (
        (length(NEW.arguments_artifact) > 2048
         AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.arguments_artifact
                            || replace(hex(zeroblob(975)), '00', ']') || ']'))
        OR EXISTS (
            SELECT 1 FROM json_tree(NEW.arguments_artifact)
            WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
               OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
               OR (instr(lower(NEW.arguments_artifact), '\ud') > 0 AND (
                   (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                   OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))))));
END;

CREATE TRIGGER cassette_actions_readable_result_artifact INSTEAD OF INSERT ON cassette_actions_readable
WHEN NEW.result_artifact GLOB '*[0-9][eE]*' OR NEW.result_artifact GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.result_artifact) > 2048 OR instr(lower(NEW.result_artifact), '\ud') > 0
BEGIN
    SELECT RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
    WHERE json_valid(NEW.result_artifact) AND (
        (length(NEW.result_artifact) > 2048
         AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.result_artifact
                            || replace(hex(zeroblob(975)), '00', ']') || ']'))
        OR EXISTS (
            SELECT 1 FROM json_tree(NEW.result_artifact)
            WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
               OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
               OR (instr(lower(NEW.result_artifact), '\ud') > 0 AND (
                   (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                   OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))))));
END;

-- A reference names content by its hash: 64 lowercase hex digits, a size, and a path
-- relative to the ledger's folder that ends in that hash and never climbs out of it.
CREATE TRIGGER cassette_actions_artifact_refs INSTEAD OF INSERT ON cassette_actions_readable
WHEN NEW.arguments_artifact IS NOT NULL OR NEW.result_artifact IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'INVALID_ARTIFACT: a reference is {"sha256": 64 hex digits, "size": n >= 0, "path": "<folder>/<sha256>"}')
    FROM (SELECT NEW.arguments_artifact AS ref UNION ALL SELECT NEW.result_artifact)
    WHERE ref IS NOT NULL
      AND NOT coalesce(CASE WHEN json_valid(ref) AND json_type(ref) = 'object' THEN
              json_type(ref, '$.sha256') = 'text'
              AND length(json_extract(ref, '$.sha256')) = 64
              AND json_extract(ref, '$.sha256') NOT GLOB '*[^0-9a-f]*'
              AND json_type(ref, '$.size') = 'integer' AND json_extract(ref, '$.size') >= 0
              AND (json_type(ref, '$.path') IS NULL OR (
                   json_type(ref, '$.path') = 'text'
                   AND json_extract(ref, '$.path') NOT GLOB '/*'
                   AND '/' || json_extract(ref, '$.path') || '/' NOT GLOB '*/../*'
                   AND '/' || json_extract(ref, '$.path') || '/' NOT GLOB '*/./*'
                   AND instr(json_extract(ref, '$.path'), char(92)) = 0
                   AND json_extract(ref, '$.path') GLOB '*/' || json_extract(ref, '$.sha256')))
          END, 0);
END;

-- ============================================================================
-- cassette_actions_lifecycle

-- Stores nothing: inserting into it runs the plan lifecycle.
CREATE VIEW cassette_actions_lifecycle (plan_id, action_type, parent_action_id, metadata_json)
AS SELECT NULL, NULL, NULL, NULL WHERE 0;

-- The plan lifecycle (LAW.md, "Plan lifecycle"). The state of a plan is the type of its
-- last plan-level lifecycle action: none, PlanStarted or PlanResumed (running), PlanPaused
-- (paused), PlanCompleted or PlanAborted (finished). Every action of a finished plan is
-- refused; the other rules concern lifecycle actions and checkpoint references only.
CREATE TRIGGER cassette_actions_lifecycle_guard INSTEAD OF INSERT ON cassette_actions_lifecycle
WHEN NEW.action_type GLOB 'Plan*'
  OR CASE WHEN json_valid(NEW.metadata_json)
          THEN json_extract(NEW.metadata_json, '$.checkpoint_id') IS NOT NULL END
BEGIN
    SELECT RAISE(ABORT, 'INVALID_METADATA: metadata_json must be a JSON object')
    WHERE CASE WHEN json_valid(NEW.metadata_json)
               THEN json_type(NEW.metadata_json) IS NOT 'object' ELSE 1 END;
    SELECT RAISE(ABORT, 'PLAN_ALREADY_STARTED: a plan starts once')
    WHERE NEW.action_type = 'PlanStarted'
      AND EXISTS (SELECT 1 FROM cassette_actions
                  WHERE plan_id = NEW.plan_id
                    AND (action_type = 'PlanStarted' OR action_type = 'PlanPaused'
                         OR action_type = 'PlanResumed' OR action_type = 'PlanCompleted'
                         OR action_type = 'PlanAborted'));
    SELECT RAISE(ABORT, 'PLAN_NOT_STARTED: the first lifecycle action of a plan is PlanStarted')
    WHERE NEW.action_type GLOB 'Plan*' AND NEW.action_type IS NOT 'PlanStarted'
      AND NOT EXISTS (SELECT 1 FROM cassette_actions
                      WHERE plan_id = NEW.plan_id
                        AND (action_type = 'PlanStarted' OR action_type = 'PlanPaused'
                             OR action_type = 'PlanResumed' OR action_type = 'PlanCompleted'
                             OR action_type = 'PlanAborted'));
    SELECT RAISE(ABORT, 'PLAN_NOT_PAUSED: PlanResumed only while the plan is paused')
    WHERE NEW.action_type = 'PlanResumed'
      AND (SELECT action_type FROM cassette_actions
           WHERE plan_id = NEW.plan_id
             AND (action_type = 'PlanStarted' OR action_type = 'PlanPaused'
                  OR action_type = 'PlanResumed' OR action_type = 'PlanCompleted'
                  OR action_type = 'PlanAborted')
           ORDER BY action_seq DESC LIMIT 1) IS NOT 'PlanPaused';
    SELECT RAISE(ABORT, 'PLAN_NOT_RUNNING: the plan is paused')
    WHERE NEW.action_type IN ('PlanPaused', 'PlanCompleted', 'PlanStepStarted',
                              'PlanStepCompleted', 'PlanStepFailed', 'PlanStepRetrying')
      AND (SELECT action_type FROM cassette_actions
           WHERE plan_id = NEW.plan_id
             AND (action_type = 'PlanStarted' OR action_type = 'PlanPaused'
                  OR action_type = 'PlanResumed' OR action_type = 'PlanCompleted'
                  OR action_type = 'PlanAborted')
           ORDER BY action_seq DESC LIMIT 1) = 'PlanPaused';
    -- A step event names its PlanStepStarted action as its parent.
    SELECT RAISE(ABORT, 'STEP_NOT_STARTED: a step event''s parent is the PlanStepStarted of its step in this plan')
    WHERE NEW.action_type IN ('PlanStepCompleted', 'PlanStepFailed', 'PlanStepRetrying')
      AND NOT EXISTS (SELECT 1 FROM cassette_actions s
                      WHERE s.action_id = NEW.parent_action_id
                        AND s.action_type = 'PlanStepStarted' AND s.plan_id = NEW.plan_id);
    SELECT RAISE(ABORT, 'STEP_FINISHED: the step has already completed or failed')
    WHERE NEW.action_type IN ('PlanStepCompleted', 'PlanStepFailed', 'PlanStepRetrying')
      AND EXISTS (SELECT 1 FROM cassette_actions c
                  WHERE c.parent_action_id = NEW.parent_action_id
                    AND c.action_type IN ('PlanStepCompleted', 'PlanStepFailed'));
    SELECT RAISE(ABORT, 'RETRIES_EXHAUSTED: the step declared fewer retries (metadata retries.max)')
    WHERE NEW.action_type = 'PlanStepRetrying'
      AND (SELECT count(*) FROM cassette_actions c
           WHERE c.parent_action_id = NEW.parent_action_id
             AND c.action_type = 'PlanStepRetrying')
          >= coalesce((SELECT json_extract(s.metadata_json, '$.retries.max')
                       FROM cassette_actions s WHERE s.action_id = NEW.parent_action_id), 0);
    SELECT RAISE(ABORT, 'INVALID_POLICY: retries.max and timeout_ms are non-negative integers')
    WHERE NEW.action_type = 'PlanStepStarted'
      AND ((json_type(NEW.metadata_json, '$.retries') IS NOT NULL
            AND (json_type(NEW.metadata_json, '$.retries.max') IS NOT 'integer'
                 OR json_extract(NEW.metadata_json, '$.retries.max') < 0))
           OR (json_type(NEW.metadata_json, '$.timeout_ms') IS NOT NULL
               AND (json_type(NEW.metadata_json, '$.timeout_ms') IS NOT 'integer'
                    OR json_extract(NEW.metadata_json, '$.timeout_ms') < 0)));
    SELECT RAISE(ABORT, 'REFERENCE_MISSING: metadata.checkpoint_id names no checkpoint of this plan')
    WHERE json_extract(NEW.metadata_json, '$.checkpoint_id') IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM cassette_checkpoints k
                      WHERE k.checkpoint_id = json_extract(NEW.metadata_json, '$.checkpoint_id')
                        AND k.plan_id = NEW.plan_id);
END;

-- ============================================================================
-- cassette_checkpoints

-- Serialized execution contexts of paused plans, content-addressed:
-- checkpoint_id = 'cp-' || lowercase hex SHA-256 of the UTF-8 bytes of context_json (the
-- TEMP hash guard below checks it). context_json is the canonical JSON
-- {"context": ..., "plan_id": ...}, so equal contexts of one plan share an id.
CREATE TABLE cassette_checkpoints (
    checkpoint_seq INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (checkpoint_seq > 0),
    checkpoint_id TEXT NOT NULL UNIQUE
        CONSTRAINT INVALID_CHECKPOINT_ID CHECK (
            length(checkpoint_id) = 67 AND substr(checkpoint_id, 1, 3) = 'cp-'
            AND substr(checkpoint_id, 4) NOT GLOB '*[^0-9a-f]*'
        ),
    plan_id TEXT NOT NULL CONSTRAINT INVALID_PLAN_ID CHECK (length(plan_id) BETWEEN 1 AND 200),
    context_json TEXT NOT NULL
        CONSTRAINT INVALID_PAYLOAD CHECK (
            CASE WHEN json_valid(context_json)
                 THEN json_extract(context_json, '$.plan_id') IS plan_id ELSE 0 END
        ),
    created_at INTEGER NOT NULL
) STRICT;

CREATE INDEX cassette_checkpoints_by_plan ON cassette_checkpoints (plan_id, checkpoint_seq);

-- Append-only.
CREATE TRIGGER cassette_checkpoints_no_update BEFORE UPDATE ON cassette_checkpoints
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_checkpoints rows cannot be updated'); END;

CREATE TRIGGER cassette_checkpoints_no_delete BEFORE DELETE ON cassette_checkpoints
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_checkpoints rows cannot be deleted'); END;

-- The rules every checkpoint meets (journal, time, readable JSON, dense ids): see
-- 20_messages.sql, cassette_messages_rules.
CREATE TRIGGER cassette_checkpoints_rules BEFORE INSERT ON cassette_checkpoints
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection')
        WHEN 2 THEN RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
        WHEN 3 THEN RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time')
        WHEN 4 THEN RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
        WHEN 5 THEN RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: checkpoint_seq must follow the last one') END
    FROM (SELECT k.id, CASE
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_checkpoints', 'op', 'INSERT', 'key', NEW.checkpoint_id,
                  'row', json_object('checkpoint_seq', k.id, 'checkpoint_id', NEW.checkpoint_id,
                           'plan_id', NEW.plan_id, 'context_json', NEW.context_json,
                           'created_at', NEW.created_at)) THEN 1
            WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999 THEN 2
            WHEN NEW.created_at < (SELECT ms FROM cassette_ledger_time) THEN 3
            WHEN (NEW.context_json GLOB '*[0-9][eE]*' OR NEW.context_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
                  OR length(NEW.context_json) > 2048 OR instr(lower(NEW.context_json), '\ud') > 0)
             AND json_valid(NEW.context_json) AND (
                 (length(NEW.context_json) > 2048
                  AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.context_json
                                     || replace(hex(zeroblob(975)), '00', ']') || ']'))
                 OR EXISTS (
                     SELECT 1 FROM json_tree(NEW.context_json)
                     WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
                        OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
                        OR (instr(lower(NEW.context_json), '\ud') > 0 AND (
                            (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                            OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*')))))) THEN 4
            WHEN k.id > 1 AND NOT EXISTS (SELECT 1 FROM cassette_checkpoints NOT INDEXED WHERE checkpoint_seq = k.id - 1) THEN 5 END AS broken
          FROM (SELECT CASE WHEN NEW.checkpoint_seq = -1 THEN coalesce((SELECT checkpoint_seq FROM cassette_checkpoints NOT INDEXED ORDER BY checkpoint_seq DESC LIMIT 1), 0) + 1 ELSE NEW.checkpoint_seq END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.checkpoint_id IS NOT NULL AND NEW.plan_id IS NOT NULL AND NEW.context_json IS NOT NULL AND NEW.created_at IS NOT NULL
      AND (r.id > 0
           AND coalesce(length(NEW.checkpoint_id) = 67 AND substr(NEW.checkpoint_id, 1, 3) = 'cp-'
          AND substr(NEW.checkpoint_id, 4) NOT GLOB '*[^0-9a-f]*', 1)
           AND coalesce(length(NEW.plan_id) BETWEEN 1 AND 200, 1)
           AND coalesce(CASE WHEN json_valid(NEW.context_json)
               THEN json_extract(NEW.context_json, '$.plan_id') IS NEW.plan_id ELSE 0 END, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

-- A checkpoint_seq and a checkpoint_id are used once.
CREATE TRIGGER cassette_checkpoints_insert_guard BEFORE INSERT ON cassette_checkpoints
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: a checkpoint with this checkpoint_seq exists')
    WHERE EXISTS (SELECT 1 FROM cassette_checkpoints WHERE checkpoint_seq = NEW.checkpoint_seq);
    SELECT RAISE(ABORT, 'APPEND_ONLY: a checkpoint with this checkpoint_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_checkpoints WHERE checkpoint_id = NEW.checkpoint_id);
END;

-- ==== TEMP: installed on every package connection, not kept in the file ====

-- The journal triggers of actions and checkpoints (the encoding: 50_journal.sql, TEMP
-- section), and the hash checks that need SHA-256: a checkpoint's id is its content's hash;
-- a plan archived on its PlanStarted action carries the SHA-256 of its body (LAW.md 6c).

CREATE TEMP TRIGGER cassette_actions_journal BEFORE INSERT ON main.cassette_actions
-- (only a row its NOT NULL and CHECK constraints will take: 50_journal.sql, TEMP section)
WHEN NEW.action_id IS NOT NULL AND NEW.plan_id IS NOT NULL AND NEW.intent_id IS NOT NULL AND NEW.action_type IS NOT NULL AND NEW.function_name IS NOT NULL AND NEW.success IS NOT NULL AND NEW.cost_micros IS NOT NULL AND NEW.duration_ms IS NOT NULL AND NEW.timestamp IS NOT NULL AND NEW.metadata_json IS NOT NULL
 AND ((NEW.action_seq > 0 OR NEW.action_seq = -1)
           AND coalesce(length(NEW.action_id) = 36 AND NEW.action_id NOT GLOB '*[^0-9a-f-]*'
          AND substr(NEW.action_id, 9, 1) = '-' AND substr(NEW.action_id, 14, 1) = '-'
          AND substr(NEW.action_id, 19, 1) = '-' AND substr(NEW.action_id, 24, 1) = '-'
          AND NEW.action_id NOT GLOB '*-*-*-*-*-*', 1)
           AND coalesce(length(NEW.plan_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.intent_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.session_id) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.action_type = 'PlanStarted' OR NEW.action_type = 'PlanCompleted' OR NEW.action_type = 'PlanAborted'
          OR NEW.action_type = 'PlanPaused' OR NEW.action_type = 'PlanResumed' OR NEW.action_type = 'PlanStepStarted'
          OR NEW.action_type = 'PlanStepCompleted' OR NEW.action_type = 'PlanStepFailed' OR NEW.action_type = 'PlanStepRetrying'
          OR NEW.action_type = 'CapabilityCall' OR NEW.action_type = 'CapabilityResult' OR NEW.action_type = 'InternalStep', 1)
           AND coalesce(length(NEW.function_name) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.success IN (0, 1), 1)
           AND coalesce(NEW.cost_micros >= 0, 1)
           AND coalesce(NEW.duration_ms >= 0, 1)
           AND coalesce(NEW.category IS NULL OR NEW.category = 'conversation' OR NEW.category = 'decision'
          OR NEW.category = 'file_edit' OR NEW.category = 'tool_use' OR NEW.category = 'research', 1)
           AND coalesce(NEW.arguments_json IS NULL OR NEW.arguments_artifact IS NULL, 1)
           AND coalesce(NEW.result_json IS NULL OR NEW.result_artifact IS NULL, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints))
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_actions', 'op', 'INSERT', 'key', NEW.action_id,
                           'row', json_object(
                               'action_seq', k.id, 'action_id', NEW.action_id,
                               'parent_action_id', NEW.parent_action_id, 'plan_id', NEW.plan_id,
                               'intent_id', NEW.intent_id, 'session_id', NEW.session_id,
                               'action_type', NEW.action_type, 'function_name', NEW.function_name,
                               'arguments_json', NEW.arguments_json,
                               'arguments_artifact', NEW.arguments_artifact,
                               'result_json', NEW.result_json, 'result_artifact', NEW.result_artifact,
                               'success', NEW.success, 'error_message', NEW.error_message,
                               'cost_micros', NEW.cost_micros, 'duration_ms', NEW.duration_ms,
                               'timestamp', NEW.timestamp, 'metadata_json', NEW.metadata_json,
                               'caused_by', NEW.caused_by, 'rationale', NEW.rationale,
                               'category', NEW.category)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h,
                     (SELECT CASE WHEN NEW.action_seq = -1
                                  THEN coalesce((SELECT action_seq FROM cassette_actions NOT INDEXED
                                                 ORDER BY action_seq DESC LIMIT 1), 0) + 1
                                  ELSE NEW.action_seq END AS id) k
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END;

CREATE TEMP TRIGGER cassette_actions_plan_hash_guard BEFORE INSERT ON main.cassette_actions
-- (only a well-formed pair: a malformed one is INVALID_PLAN_BODY, from the rules)
WHEN NEW.action_type = 'PlanStarted' AND json_valid(NEW.metadata_json)
 AND json_type(NEW.metadata_json, '$.plan_body') = 'text'
 AND length(json_extract(NEW.metadata_json, '$.plan_hash')) = 64
 AND json_extract(NEW.metadata_json, '$.plan_hash') NOT GLOB '*[^0-9a-f]*'
 AND json_extract(NEW.metadata_json, '$.plan_hash')
     IS NOT cassette_sha256_hex(json_extract(NEW.metadata_json, '$.plan_body'))
BEGIN
    SELECT RAISE(ABORT, 'PLAN_HASH_MISMATCH: plan_hash must be the SHA-256 of plan_body');
END;

CREATE TEMP TRIGGER cassette_checkpoints_hash_guard BEFORE INSERT ON main.cassette_checkpoints
WHEN NEW.checkpoint_id IS NOT 'cp-' || cassette_sha256_hex(NEW.context_json)
BEGIN
    SELECT RAISE(ABORT, 'CHECKPOINT_MISMATCH: checkpoint_id must be cp- and the SHA-256 of context_json');
END;

CREATE TEMP TRIGGER cassette_checkpoints_journal BEFORE INSERT ON main.cassette_checkpoints
-- (only a row its NOT NULL and CHECK constraints will take: 50_journal.sql, TEMP section)
WHEN NEW.checkpoint_id IS NOT NULL AND NEW.plan_id IS NOT NULL AND NEW.context_json IS NOT NULL AND NEW.created_at IS NOT NULL
 AND ((NEW.checkpoint_seq > 0 OR NEW.checkpoint_seq = -1)
           AND coalesce(length(NEW.checkpoint_id) = 67 AND substr(NEW.checkpoint_id, 1, 3) = 'cp-'
          AND substr(NEW.checkpoint_id, 4) NOT GLOB '*[^0-9a-f]*', 1)
           AND coalesce(length(NEW.plan_id) BETWEEN 1 AND 200, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints))
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_checkpoints', 'op', 'INSERT',
                           'key', NEW.checkpoint_id,
                           'row', json_object(
                               'checkpoint_seq', k.id,
                               'checkpoint_id', NEW.checkpoint_id, 'plan_id', NEW.plan_id,
                               'context_json', NEW.context_json,
                               'created_at', NEW.created_at)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h,
                     (SELECT CASE WHEN NEW.checkpoint_seq = -1
                                  THEN coalesce((SELECT checkpoint_seq FROM cassette_checkpoints NOT INDEXED
                                                 ORDER BY checkpoint_seq DESC LIMIT 1), 0) + 1
                                  ELSE NEW.checkpoint_seq END AS id) k
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END;
