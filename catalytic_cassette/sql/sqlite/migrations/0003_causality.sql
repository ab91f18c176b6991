-- 0003: why it happened. Causes and rationale on actions, the plan lifecycle
-- enforced per plan_id, and content-addressed checkpoints of paused plans.

ALTER TABLE cassette_actions ADD COLUMN caused_by TEXT;
ALTER TABLE cassette_actions ADD COLUMN rationale TEXT;
ALTER TABLE cassette_actions ADD COLUMN category TEXT
    CONSTRAINT INVALID_CATEGORY CHECK (
        category IS NULL
        OR category IN ('conversation', 'decision', 'file_edit', 'tool_use', 'research')
    );

CREATE INDEX cassette_actions_by_cause ON cassette_actions (caused_by, action_seq)
    WHERE caused_by IS NOT NULL;

-- The plan-level lifecycle actions of a plan, newest last: the plan's state is the type
-- of the last one.
CREATE INDEX cassette_actions_plan_lifecycle ON cassette_actions (plan_id, action_seq)
    WHERE action_type IN ('PlanStarted', 'PlanPaused', 'PlanResumed', 'PlanCompleted', 'PlanAborted');

-- Serialized execution contexts of paused plans, content-addressed:
-- checkpoint_id = 'cp-' || lowercase hex SHA-256 of the UTF-8 bytes of context_json,
-- checked by schema/connection.sql (it needs SHA-256). context_json is the canonical
-- JSON {"context": ..., "plan_id": ...}, so equal contexts of one plan share an id.
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

-- A cause must exist before its effect, so cause chains are acyclic by construction.
CREATE TRIGGER cassette_actions_cause_guard BEFORE INSERT ON cassette_actions
WHEN NEW.caused_by IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'REFERENCE_MISSING: the cause (caused_by) does not exist')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_actions WHERE action_id = NEW.caused_by);
END;

-- The plan lifecycle (LAW.md, "Plan lifecycle"). The state of a plan is the type of
-- its last plan-level lifecycle action: none, PlanStarted or PlanResumed (running),
-- PlanPaused (paused), PlanCompleted or PlanAborted (finished). Every action of a
-- finished plan is refused; the other rules concern lifecycle actions and checkpoint
-- references only, so the common actions (capability calls) skip them.
CREATE TRIGGER cassette_actions_lifecycle_guard BEFORE INSERT ON cassette_actions
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
                    AND action_type IN ('PlanStarted', 'PlanPaused', 'PlanResumed',
                                        'PlanCompleted', 'PlanAborted'));
    SELECT RAISE(ABORT, 'PLAN_NOT_STARTED: the first lifecycle action of a plan is PlanStarted')
    WHERE NEW.action_type GLOB 'Plan*' AND NEW.action_type IS NOT 'PlanStarted'
      AND NOT EXISTS (SELECT 1 FROM cassette_actions
                      WHERE plan_id = NEW.plan_id
                        AND action_type IN ('PlanStarted', 'PlanPaused', 'PlanResumed',
                                            'PlanCompleted', 'PlanAborted'));
    SELECT RAISE(ABORT, 'PLAN_NOT_PAUSED: PlanResumed only while the plan is paused')
    WHERE NEW.action_type = 'PlanResumed'
      AND (SELECT action_type FROM cassette_actions
           WHERE plan_id = NEW.plan_id
             AND action_type IN ('PlanStarted', 'PlanPaused', 'PlanResumed', 'PlanCompleted',
                                 'PlanAborted')
           ORDER BY action_seq DESC LIMIT 1) IS NOT 'PlanPaused';
    SELECT RAISE(ABORT, 'PLAN_NOT_RUNNING: the plan is paused')
    WHERE NEW.action_type IN ('PlanPaused', 'PlanCompleted', 'PlanStepStarted',
                              'PlanStepCompleted', 'PlanStepFailed', 'PlanStepRetrying')
      AND (SELECT action_type FROM cassette_actions
           WHERE plan_id = NEW.plan_id
             AND action_type IN ('PlanStarted', 'PlanPaused', 'PlanResumed', 'PlanCompleted',
                                 'PlanAborted')
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

-- Created after the lifecycle guard so that it fires first (SQLite runs the newest
-- trigger of an event first): an action of a finished plan is always PLAN_FINISHED.
CREATE TRIGGER cassette_actions_plan_finished BEFORE INSERT ON cassette_actions
BEGIN
    SELECT RAISE(ABORT, 'PLAN_FINISHED: the plan has completed or aborted')
    WHERE (SELECT action_type FROM cassette_actions
           WHERE plan_id = NEW.plan_id
             AND action_type IN ('PlanStarted', 'PlanPaused', 'PlanResumed', 'PlanCompleted',
                                 'PlanAborted')
           ORDER BY action_seq DESC LIMIT 1) IN ('PlanCompleted', 'PlanAborted');
END;

CREATE TRIGGER cassette_checkpoints_no_update BEFORE UPDATE ON cassette_checkpoints
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_checkpoints rows cannot be updated'); END;
CREATE TRIGGER cassette_checkpoints_no_delete BEFORE DELETE ON cassette_checkpoints
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_checkpoints rows cannot be deleted'); END;

CREATE TRIGGER cassette_checkpoints_insert_guard BEFORE INSERT ON cassette_checkpoints
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: a checkpoint with this checkpoint_seq exists')
    WHERE EXISTS (SELECT 1 FROM cassette_checkpoints WHERE checkpoint_seq = NEW.checkpoint_seq);
    SELECT RAISE(ABORT, 'APPEND_ONLY: a checkpoint with this checkpoint_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_checkpoints WHERE checkpoint_id = NEW.checkpoint_id);
END;

CREATE TRIGGER cassette_checkpoints_journaled AFTER INSERT ON cassette_checkpoints
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal
                 WHERE tbl = 'cassette_checkpoints' AND row_key = +NEW.checkpoint_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;
