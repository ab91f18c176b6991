-- 0002: the causal chain. Actions (plan, step and capability events) with their
-- execution parent, queryable by plan, intent and session; journaled like every
-- ledger table. Large arguments or results live in content-addressed artifact
-- files beside the database; the row then holds {"sha256", "size", "path"}.

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
        CONSTRAINT INVALID_ACTION_TYPE CHECK (action_type IN (
            'PlanStarted', 'PlanCompleted', 'PlanAborted', 'PlanPaused', 'PlanResumed',
            'PlanStepStarted', 'PlanStepCompleted', 'PlanStepFailed', 'PlanStepRetrying',
            'CapabilityCall', 'CapabilityResult', 'InternalStep')),
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
    CONSTRAINT INVALID_ARTIFACT CHECK (arguments_json IS NULL OR arguments_artifact IS NULL),
    CONSTRAINT INVALID_ARTIFACT CHECK (result_json IS NULL OR result_artifact IS NULL)
) STRICT;

CREATE INDEX cassette_actions_by_plan ON cassette_actions (plan_id, action_seq);
CREATE INDEX cassette_actions_by_intent ON cassette_actions (intent_id, action_seq);
CREATE INDEX cassette_actions_by_type ON cassette_actions (action_type, action_seq);
CREATE INDEX cassette_actions_by_session ON cassette_actions (session_id, action_seq)
    WHERE session_id IS NOT NULL;
CREATE INDEX cassette_actions_by_parent ON cassette_actions (parent_action_id, action_seq)
    WHERE parent_action_id IS NOT NULL;
-- The reasoning links an orchestrator may put in metadata.
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

CREATE TRIGGER cassette_actions_no_update BEFORE UPDATE ON cassette_actions
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_actions rows cannot be updated'); END;
CREATE TRIGGER cassette_actions_no_delete BEFORE DELETE ON cassette_actions
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_actions rows cannot be deleted'); END;

-- A parent must exist before its child, so the execution tree is acyclic by construction.
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

CREATE TRIGGER cassette_actions_in_order AFTER INSERT ON cassette_actions
-- (a rowid range probe: max() would let the planner pick a covering index and scan it)
WHEN EXISTS (SELECT 1 FROM cassette_actions WHERE action_seq > NEW.action_seq)
BEGIN SELECT RAISE(ABORT, 'OUT_OF_ORDER: an action_seq must be larger than every existing one'); END;

CREATE TRIGGER cassette_actions_journaled AFTER INSERT ON cassette_actions
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal
                 WHERE tbl = 'cassette_actions' AND row_key = +NEW.action_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;
