-- Migration 0010: the write path's SQL, cheaper (issue 12, fifth pass; docs/BENCHMARKS.md).
--
-- Two costs of SQLite 3.40 that the law's rules paid on every write. A trigger's frame,
-- as large as its whole program, is allocated and zeroed each time the statement that
-- fires it runs, even when its WHEN clause is false (the test is inside the program): the
-- large checks of an action that rarely apply move behind small gates. A constant IN list
-- of more than two values is built as a temporary b-tree each time it is evaluated: those
-- on the write path become comparisons. Nothing here changes what is refused, with which
-- code, or in which order (tests/test_attacks_0010.py compares a version-9 ledger with its
-- migrated copy); journal bodies, hashes, tree nodes and seals are untouched.

-- ----------------------------------------------------- readable JSON, behind a gate
-- The five readable-JSON checks of an action and its artifact-reference check (0005) are
-- large programs that almost never do anything: only text that could hold an unreadable
-- number, a deep nesting or a lone surrogate, or an artifact reference, needs them. They
-- move, with their text, onto the view cassette_actions_readable, which stores nothing:
-- inserting into it runs them (INSTEAD OF triggers) and keeps no row. The action's gate
-- trigger (cassette_actions_readable_gate, created with the table below), small, inserts
-- the action's five columns into it only when one of the old prefilters holds. Same
-- checks, same messages, same order: the six fire newest first as before, and the gate
-- takes their place among the action's AFTER INSERT triggers.

CREATE VIEW cassette_actions_readable
    (arguments_json, result_json, metadata_json, arguments_artifact, result_artifact)
AS SELECT NULL, NULL, NULL, NULL, NULL WHERE 0;

DROP TRIGGER cassette_actions_readable_arguments;
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

DROP TRIGGER cassette_actions_readable_result;
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

DROP TRIGGER cassette_actions_readable_metadata;
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

DROP TRIGGER cassette_actions_readable_arguments_artifact;
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

DROP TRIGGER cassette_actions_readable_result_artifact;
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

DROP TRIGGER cassette_actions_artifact_refs;
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

-- ------------------------------------------------------ the plan lifecycle, gated
-- The lifecycle guard of 0003 is the largest program on an action's insert and does
-- nothing for the common action (its WHEN: a Plan* type or a checkpoint reference). It
-- moves onto the view cassette_actions_lifecycle (stores nothing); a small BEFORE trigger
-- with the same WHEN (cassette_actions_lifecycle_gate, created with the table below, in
-- the guard's place) inserts the four columns it reads. Its text is 0003's but for its
-- lookups of a plan's lifecycle actions: they repeat the WHERE clause of the partial index
-- cassette_actions_plan_lifecycle, which is comparisons now (below), as a query must to
-- use a partial index.

CREATE VIEW cassette_actions_lifecycle (plan_id, action_type, parent_action_id, metadata_json)
AS SELECT NULL, NULL, NULL, NULL WHERE 0;

DROP TRIGGER cassette_actions_lifecycle_guard;
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

-- ------------------------------------------------ constant lists as comparisons
-- A constant IN list of more than two values is built as a temporary b-tree every time
-- its program runs. Steps and receipts test status and outcome that way on every claim,
-- completion and step insert, twice each: in the table's CHECK constraint and in its
-- guard trigger; messages test their source in a CHECK on every post. The same tests as
-- comparisons: in the CHECK, `x = 'A' OR ...` (a NULL passes a CHECK either way, and NOT
-- NULL refuses it first, as before); in the guards, `x IS NOT 'A' AND ...` (a NULL fails
-- each, as it failed the IS NULL before).
-- A CHECK constraint changes only with its table: the three tables are rebuilt as 0008
-- rebuilt the journal (legacy renaming leaves the other tables' triggers and the ledger-time view
-- naming them, which are the rebuilt tables by the end; rows are copied unchanged, with
-- their ids), and every index and trigger of theirs is created again with its text, in
-- the order the migrations before made them, so that each event's triggers fire in the
-- order they did. Only these differ from what 0001-0009 made: the three CHECKs, and the
-- line with the list in each of cassette_steps_insert_guard, cassette_steps_update_guard
-- and cassette_receipts_insert_guard.

PRAGMA legacy_alter_table = ON;

ALTER TABLE cassette_messages RENAME TO cassette_messages_before_0010;
CREATE TABLE cassette_messages (
    message_id INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (message_id > 0),
    run_id TEXT NOT NULL CONSTRAINT INVALID_RUN_ID CHECK (length(run_id) BETWEEN 1 AND 200),
    source TEXT NOT NULL
        CONSTRAINT INVALID_SOURCE CHECK (
            source = 'USER' OR source = 'PLANNER' OR source = 'SYSTEM' OR source = 'WORKER'),
    idempotency_key TEXT
        CONSTRAINT INVALID_IDEMPOTENCY_KEY CHECK (length(idempotency_key) BETWEEN 1 AND 200),
    payload_json TEXT NOT NULL
        CONSTRAINT INVALID_PAYLOAD CHECK (
            CASE WHEN json_valid(payload_json) THEN json_type(payload_json) = 'object' ELSE 0 END
        ),
    created_at INTEGER NOT NULL,
    UNIQUE (run_id, idempotency_key)
) STRICT;
INSERT INTO cassette_messages SELECT * FROM cassette_messages_before_0010 ORDER BY message_id;
DROP TABLE cassette_messages_before_0010;

CREATE TRIGGER cassette_messages_no_update BEFORE UPDATE ON cassette_messages
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_messages rows cannot be updated'); END;

CREATE TRIGGER cassette_messages_no_delete BEFORE DELETE ON cassette_messages
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_messages rows cannot be deleted'); END;

CREATE TRIGGER cassette_messages_insert_guard BEFORE INSERT ON cassette_messages
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: a message with this message_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_messages WHERE message_id = NEW.message_id);
    SELECT RAISE(ABORT, 'IDEMPOTENCY_CONFLICT: a message with this run_id and idempotency_key exists')
    WHERE NEW.idempotency_key IS NOT NULL
      AND EXISTS (SELECT 1 FROM cassette_messages
                  WHERE run_id = NEW.run_id AND idempotency_key = NEW.idempotency_key);
END;

CREATE TRIGGER cassette_messages_in_order AFTER INSERT ON cassette_messages
-- (a rowid range probe: max() would let the planner pick a covering index and scan it)
WHEN EXISTS (SELECT 1 FROM cassette_messages WHERE message_id > NEW.message_id)
BEGIN SELECT RAISE(ABORT, 'OUT_OF_ORDER: a message_id must be larger than every existing one'); END;

CREATE TRIGGER cassette_messages_dense AFTER INSERT ON cassette_messages
WHEN NEW.message_id > 1
 AND NOT EXISTS (SELECT 1 FROM cassette_messages NOT INDEXED WHERE message_id = NEW.message_id - 1)
BEGIN SELECT RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: message_id must follow the last one'); END;

CREATE TRIGGER cassette_messages_readable AFTER INSERT ON cassette_messages
WHEN NEW.payload_json GLOB '*[0-9][eE]*' OR NEW.payload_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.payload_json) > 2048 OR instr(lower(NEW.payload_json), '\ud') > 0
BEGIN
    SELECT RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
    WHERE json_valid(NEW.payload_json) AND (
        (length(NEW.payload_json) > 2048
         AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.payload_json
                            || replace(hex(zeroblob(975)), '00', ']') || ']'))
        OR EXISTS (
            SELECT 1 FROM json_tree(NEW.payload_json)
            WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
               OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
               OR (instr(lower(NEW.payload_json), '\ud') > 0 AND (
                   (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                   OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))))));
END;

CREATE TRIGGER cassette_messages_time AFTER INSERT ON cassette_messages
WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999
  OR NEW.created_at < (SELECT ms FROM cassette_ledger_time) OR NEW.created_at < (SELECT created_at FROM cassette_messages NOT INDEXED WHERE message_id = NEW.message_id - 1)
BEGIN
    SELECT RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
    WHERE typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999;
    SELECT RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time');
END;

CREATE TRIGGER cassette_messages_journaled AFTER INSERT ON cassette_messages
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal INDEXED BY cassette_journal_by_row
                 WHERE tbl = 'cassette_messages' AND row_key = +NEW.message_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

ALTER TABLE cassette_steps RENAME TO cassette_steps_before_0010;
CREATE TABLE cassette_steps (
    step_id INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (step_id > 0),
    job_id INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    message_id INTEGER NOT NULL,
    job_ordinal INTEGER NOT NULL,
    ordinal INTEGER NOT NULL CONSTRAINT INVALID_ORDINAL CHECK (ordinal >= 0),
    status TEXT NOT NULL
        CONSTRAINT INVALID_STATUS CHECK (status = 'PENDING' OR status = 'LEASED' OR status = 'COMMITTED'),
    lease_owner TEXT,
    lease_expires_at INTEGER,
    fencing_token INTEGER NOT NULL CONSTRAINT INVALID_TOKEN CHECK (fencing_token >= 0),
    payload_json TEXT NOT NULL
        CONSTRAINT INVALID_PAYLOAD CHECK (
            CASE WHEN json_valid(payload_json) THEN json_type(payload_json) = 'object' ELSE 0 END
        ),
    created_at INTEGER NOT NULL,
    UNIQUE (job_id, ordinal)
) STRICT;
INSERT INTO cassette_steps SELECT * FROM cassette_steps_before_0010 ORDER BY step_id;
DROP TABLE cassette_steps_before_0010;

CREATE INDEX cassette_steps_claimable
    ON cassette_steps (run_id, message_id, job_ordinal, ordinal)
    WHERE status = 'PENDING';

CREATE INDEX cassette_steps_leased
    ON cassette_steps (run_id, lease_expires_at)
    WHERE status = 'LEASED';

CREATE INDEX cassette_steps_by_run_status ON cassette_steps (run_id, status);

CREATE TRIGGER cassette_steps_no_delete BEFORE DELETE ON cassette_steps
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_steps rows cannot be deleted'); END;

CREATE TRIGGER cassette_steps_update_journaled AFTER UPDATE ON cassette_steps
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal
                 WHERE seq = (SELECT max(seq) FROM cassette_journal)
                   AND tbl = 'cassette_steps' AND row_key = +NEW.step_id
                   AND json_extract(body, '$.row.status') IS NEW.status
                   AND json_extract(body, '$.row.fencing_token') IS NEW.fencing_token)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

CREATE TRIGGER cassette_steps_dense AFTER INSERT ON cassette_steps
WHEN NEW.step_id > 1
 AND NOT EXISTS (SELECT 1 FROM cassette_steps NOT INDEXED WHERE step_id = NEW.step_id - 1)
BEGIN SELECT RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: step_id must follow the last one'); END;

CREATE TRIGGER cassette_steps_readable AFTER INSERT ON cassette_steps
WHEN NEW.payload_json GLOB '*[0-9][eE]*' OR NEW.payload_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.payload_json) > 2048 OR instr(lower(NEW.payload_json), '\ud') > 0
BEGIN
    SELECT RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
    WHERE json_valid(NEW.payload_json) AND (
        (length(NEW.payload_json) > 2048
         AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.payload_json
                            || replace(hex(zeroblob(975)), '00', ']') || ']'))
        OR EXISTS (
            SELECT 1 FROM json_tree(NEW.payload_json)
            WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
               OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
               OR (instr(lower(NEW.payload_json), '\ud') > 0 AND (
                   (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                   OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))))));
END;

CREATE TRIGGER cassette_steps_time AFTER INSERT ON cassette_steps
WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999
  OR NEW.created_at < (SELECT ms FROM cassette_ledger_time) OR NEW.created_at < (SELECT created_at FROM cassette_steps NOT INDEXED WHERE step_id = NEW.step_id - 1)
BEGIN
    SELECT RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
    WHERE typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999;
    SELECT RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time');
END;

CREATE TRIGGER cassette_steps_lease_time AFTER UPDATE ON cassette_steps
WHEN OLD.status = 'PENDING' AND NEW.status IS 'LEASED'
 AND typeof(NEW.lease_expires_at) = 'integer'
 AND (NEW.lease_expires_at <= (SELECT ms FROM cassette_ledger_time)
      OR NEW.lease_expires_at > 253402300799999 + 2592000000)
BEGIN SELECT RAISE(ABORT, 'INVALID_TTL: a lease expires after the ledger''s latest time, within 30 days of a time before the year 10000'); END;

CREATE TRIGGER cassette_steps_journaled AFTER INSERT ON cassette_steps
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal INDEXED BY cassette_journal_by_row
                 WHERE tbl = 'cassette_steps' AND row_key = +NEW.step_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

CREATE TRIGGER cassette_steps_insert_guard BEFORE INSERT ON cassette_steps
BEGIN
    SELECT RAISE(ABORT, 'INVALID_STATUS: status is PENDING, LEASED or COMMITTED')
    WHERE NEW.status IS NOT 'PENDING' AND NEW.status IS NOT 'LEASED' AND NEW.status IS NOT 'COMMITTED';
    SELECT RAISE(ABORT, 'INVALID_TOKEN: a fencing token is a non-negative integer')
    WHERE typeof(NEW.fencing_token) IS NOT 'integer' OR NEW.fencing_token < 0;
    SELECT RAISE(ABORT, 'APPEND_ONLY: a step with this step_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'APPEND_ONLY: a step with this job_id and ordinal exists')
    WHERE EXISTS (SELECT 1 FROM cassette_steps WHERE job_id = NEW.job_id AND ordinal = NEW.ordinal);
    SELECT RAISE(ABORT, 'REFERENCE_MISSING: the step''s job does not exist')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_jobs WHERE job_id = NEW.job_id);
    SELECT RAISE(ABORT, 'RUN_MISMATCH: a step''s run_id must equal its job''s run_id')
    WHERE NEW.run_id IS NOT (SELECT run_id FROM cassette_jobs WHERE job_id = NEW.job_id);
    SELECT RAISE(ABORT, 'REFERENCE_MISMATCH: a step''s message_id and job_ordinal must equal its job''s')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_jobs WHERE job_id = NEW.job_id
                      AND message_id IS NEW.message_id AND ordinal IS NEW.job_ordinal);
    SELECT RAISE(ABORT, 'ILLEGAL_TRANSITION: a step is inserted as PENDING')
    WHERE NEW.status IS NOT 'PENDING';
    SELECT RAISE(ABORT, 'LEASE_FIELDS_LOCKED: a step is inserted with token 0 and no lease')
    WHERE NEW.fencing_token IS NOT 0 OR NEW.lease_owner IS NOT NULL
       OR NEW.lease_expires_at IS NOT NULL;
END;

CREATE TRIGGER cassette_steps_update_guard BEFORE UPDATE ON cassette_steps
BEGIN
    SELECT RAISE(ABORT, 'INVALID_STATUS: status is PENDING, LEASED or COMMITTED')
    WHERE NEW.status IS NOT 'PENDING' AND NEW.status IS NOT 'LEASED' AND NEW.status IS NOT 'COMMITTED';
    SELECT RAISE(ABORT, 'INVALID_TOKEN: a fencing token is a non-negative integer')
    WHERE typeof(NEW.fencing_token) IS NOT 'integer' OR NEW.fencing_token < 0;
    SELECT RAISE(ABORT, 'IMMUTABLE_FIELD: only status, lease fields and fencing_token of a step change')
    WHERE NEW.step_id IS NOT OLD.step_id OR NEW.job_id IS NOT OLD.job_id
       OR NEW.run_id IS NOT OLD.run_id OR NEW.message_id IS NOT OLD.message_id
       OR NEW.job_ordinal IS NOT OLD.job_ordinal OR NEW.ordinal IS NOT OLD.ordinal
       OR NEW.payload_json IS NOT OLD.payload_json OR NEW.created_at IS NOT OLD.created_at;
    SELECT RAISE(ABORT, 'LEASE_FIELDS_LOCKED: lease fields change only with a claim or a requeue')
    WHERE NEW.status IS OLD.status
      AND (NEW.lease_owner IS NOT OLD.lease_owner OR NEW.lease_expires_at IS NOT OLD.lease_expires_at
           OR NEW.fencing_token IS NOT OLD.fencing_token);
    SELECT RAISE(ABORT, 'ILLEGAL_TRANSITION: allowed are PENDING->LEASED, LEASED->COMMITTED, LEASED->PENDING')
    WHERE NOT ((OLD.status = 'PENDING' AND NEW.status IS 'LEASED')
            OR (OLD.status = 'LEASED' AND NEW.status IS 'COMMITTED')
            OR (OLD.status = 'LEASED' AND NEW.status IS 'PENDING'));
    SELECT RAISE(ABORT, 'LEASE_FIELDS_LOCKED: a claim sets lease_owner and lease_expires_at and adds 1 to the token')
    WHERE OLD.status = 'PENDING' AND NEW.status IS 'LEASED'
      AND (NEW.lease_owner IS NULL OR length(NEW.lease_owner) NOT BETWEEN 1 AND 200
           OR typeof(NEW.lease_expires_at) IS NOT 'integer'
           OR NEW.fencing_token IS NOT OLD.fencing_token + 1);
    SELECT RAISE(ABORT, 'LEASE_FIELDS_LOCKED: a requeue clears the lease and keeps the token')
    WHERE OLD.status = 'LEASED' AND NEW.status IS 'PENDING'
      AND (NEW.lease_owner IS NOT NULL OR NEW.lease_expires_at IS NOT NULL
           OR NEW.fencing_token IS NOT OLD.fencing_token);
    SELECT RAISE(ABORT, 'LEASE_FIELDS_LOCKED: committing keeps the lease fields and the token')
    WHERE OLD.status = 'LEASED' AND NEW.status IS 'COMMITTED'
      AND (NEW.lease_owner IS NOT OLD.lease_owner OR NEW.lease_expires_at IS NOT OLD.lease_expires_at
           OR NEW.fencing_token IS NOT OLD.fencing_token);
    SELECT RAISE(ABORT, 'RECEIPT_REQUIRED: a step is committed only by inserting its receipt')
    WHERE OLD.status = 'LEASED' AND NEW.status IS 'COMMITTED'
      AND NOT EXISTS (SELECT 1 FROM cassette_receipts r WHERE r.step_id = OLD.step_id
                      AND r.fencing_token = OLD.fencing_token AND r.worker_id = OLD.lease_owner);
END;

CREATE TRIGGER cassette_steps_signature_guard BEFORE UPDATE ON cassette_steps
WHEN OLD.status = 'LEASED' AND NEW.status IS 'PENDING'
 AND NEW.lease_owner IS NULL AND NEW.lease_expires_at IS NULL
 AND NEW.fencing_token IS OLD.fencing_token
BEGIN
    SELECT RAISE(ABORT, 'SIGNATURE_REQUIRED: this lease was claimed signed; a requeue must be attested')
    FROM cassette_attestations c
    WHERE c.step_id = OLD.step_id AND c.fencing_token = OLD.fencing_token
      AND c.act = 'claim' AND c.worker_id = OLD.lease_owner
      AND NOT EXISTS (SELECT 1 FROM cassette_releases r
                      WHERE r.step_id = OLD.step_id AND r.fencing_token = OLD.fencing_token)
      AND NOT EXISTS (SELECT 1 FROM cassette_attestations q
                      WHERE q.step_id = OLD.step_id AND q.fencing_token = OLD.fencing_token
                        AND q.act = 'requeue');
END;

ALTER TABLE cassette_receipts RENAME TO cassette_receipts_before_0010;
CREATE TABLE cassette_receipts (
    receipt_id INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (receipt_id > 0),
    step_id INTEGER NOT NULL UNIQUE,
    job_id INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    worker_id TEXT NOT NULL CONSTRAINT INVALID_WORKER CHECK (length(worker_id) BETWEEN 1 AND 200),
    fencing_token INTEGER NOT NULL,
    outcome TEXT NOT NULL
        CONSTRAINT INVALID_OUTCOME CHECK (outcome = 'SUCCESS' OR outcome = 'FAILURE' OR outcome = 'ABORTED'),
    receipt_json TEXT NOT NULL
        CONSTRAINT INVALID_PAYLOAD CHECK (
            CASE WHEN json_valid(receipt_json) THEN json_type(receipt_json) = 'object' ELSE 0 END
        ),
    created_at INTEGER NOT NULL
) STRICT;
INSERT INTO cassette_receipts SELECT * FROM cassette_receipts_before_0010 ORDER BY receipt_id;
DROP TABLE cassette_receipts_before_0010;

CREATE INDEX cassette_receipts_by_run ON cassette_receipts (run_id, outcome);

CREATE TRIGGER cassette_receipts_no_update BEFORE UPDATE ON cassette_receipts
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_receipts rows cannot be updated'); END;

CREATE TRIGGER cassette_receipts_no_delete BEFORE DELETE ON cassette_receipts
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_receipts rows cannot be deleted'); END;

CREATE TRIGGER cassette_receipts_commit_step AFTER INSERT ON cassette_receipts
BEGIN
    UPDATE cassette_steps SET status = 'COMMITTED' WHERE step_id = NEW.step_id;
END;

CREATE TRIGGER cassette_receipts_dense AFTER INSERT ON cassette_receipts
WHEN NEW.receipt_id > 1
 AND NOT EXISTS (SELECT 1 FROM cassette_receipts NOT INDEXED WHERE receipt_id = NEW.receipt_id - 1)
BEGIN SELECT RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: receipt_id must follow the last one'); END;

CREATE TRIGGER cassette_receipts_readable AFTER INSERT ON cassette_receipts
WHEN NEW.receipt_json GLOB '*[0-9][eE]*' OR NEW.receipt_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.receipt_json) > 2048 OR instr(lower(NEW.receipt_json), '\ud') > 0
BEGIN
    SELECT RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
    WHERE json_valid(NEW.receipt_json) AND (
        (length(NEW.receipt_json) > 2048
         AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.receipt_json
                            || replace(hex(zeroblob(975)), '00', ']') || ']'))
        OR EXISTS (
            SELECT 1 FROM json_tree(NEW.receipt_json)
            WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
               OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
               OR (instr(lower(NEW.receipt_json), '\ud') > 0 AND (
                   (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                   OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))))));
END;

CREATE TRIGGER cassette_receipts_time AFTER INSERT ON cassette_receipts
WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999
  OR NEW.created_at < (SELECT ms FROM cassette_ledger_time) OR NEW.created_at < (SELECT created_at FROM cassette_receipts NOT INDEXED WHERE receipt_id = NEW.receipt_id - 1)
BEGIN
    SELECT RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
    WHERE typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999;
    SELECT RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time');
END;

CREATE TRIGGER cassette_receipts_journaled AFTER INSERT ON cassette_receipts
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal INDEXED BY cassette_journal_by_row
                 WHERE tbl = 'cassette_receipts' AND row_key = +NEW.receipt_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

CREATE TRIGGER cassette_receipts_insert_guard BEFORE INSERT ON cassette_receipts
BEGIN
    SELECT RAISE(ABORT, 'INVALID_WORKER: worker_id is a string of 1-200 characters')
    WHERE typeof(NEW.worker_id) IS NOT 'text' OR length(NEW.worker_id) NOT BETWEEN 1 AND 200;
    SELECT RAISE(ABORT, 'INVALID_OUTCOME: outcome is SUCCESS, FAILURE or ABORTED')
    WHERE NEW.outcome IS NOT 'SUCCESS' AND NEW.outcome IS NOT 'FAILURE' AND NEW.outcome IS NOT 'ABORTED';
    SELECT RAISE(ABORT, 'APPEND_ONLY: a receipt with this receipt_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_receipts WHERE receipt_id = NEW.receipt_id);
    SELECT RAISE(ABORT, 'STEP_NOT_FOUND: the receipt''s step does not exist')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'DUPLICATE_RECEIPT: this step already has its receipt')
    WHERE EXISTS (SELECT 1 FROM cassette_receipts WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'RUN_MISMATCH: the step belongs to another run')
    WHERE NEW.run_id IS NOT (SELECT run_id FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'REFERENCE_MISMATCH: a receipt''s job_id must be its step''s job')
    WHERE NEW.job_id IS NOT (SELECT job_id FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'NOT_LEASED: only a LEASED step takes a receipt')
    WHERE (SELECT status FROM cassette_steps WHERE step_id = NEW.step_id) IS NOT 'LEASED';
    SELECT RAISE(ABORT, 'STALE_FENCING_TOKEN: the token is not the step''s current token')
    WHERE NEW.fencing_token IS NOT (SELECT fencing_token FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'WRONG_WORKER: only the lease owner completes a step')
    WHERE NEW.worker_id IS NOT (SELECT lease_owner FROM cassette_steps WHERE step_id = NEW.step_id);
END;

CREATE TRIGGER cassette_receipts_signature_guard BEFORE INSERT ON cassette_receipts
WHEN EXISTS (SELECT 1 FROM cassette_steps s
             WHERE s.step_id = NEW.step_id AND s.status = 'LEASED'
               AND s.run_id IS NEW.run_id AND s.job_id IS NEW.job_id
               AND s.fencing_token IS NEW.fencing_token AND s.lease_owner IS NEW.worker_id)
BEGIN
    SELECT RAISE(ABORT, 'SIGNATURE_REQUIRED: this lease was claimed signed; its worker must attest the completion')
    FROM cassette_attestations c
    WHERE c.step_id = NEW.step_id AND c.fencing_token = NEW.fencing_token
      AND c.act = 'claim' AND c.worker_id = NEW.worker_id
      AND NOT EXISTS (SELECT 1 FROM cassette_attestations a
                      WHERE a.step_id = NEW.step_id AND a.fencing_token = NEW.fencing_token
                        AND a.act = 'complete' AND a.worker_id = c.worker_id
                        AND a.key_id = c.key_id)
      AND NOT (NEW.outcome IS 'ABORTED'
               AND EXISTS (SELECT 1 FROM cassette_attestations q
                           WHERE q.step_id = NEW.step_id AND q.fencing_token = NEW.fencing_token
                             AND q.act = 'requeue'));
END;

PRAGMA legacy_alter_table = OFF;

-- ------------------------------------------------------------- actions, rebuilt
-- The same reason for actions: a CHECK of 12 action types and one of 5 categories are
-- comparisons now, and the table is rebuilt like steps and receipts above: every index and
-- trigger created again with its text, in its order. The WHERE clause of the partial
-- index cassette_actions_plan_lifecycle (evaluated on every insert) is comparisons too,
-- and so, to keep using that index, is the same test in cassette_actions_plan_finished
-- (run on every insert), in the lifecycle guard above and in the package's plan_state
-- query. Otherwise the text differs from what 0002-0009 left in two places only: the seven
-- checks moved above are not on the table any more, and the two gates stand where the
-- checks they gate stood.

PRAGMA legacy_alter_table = ON;

ALTER TABLE cassette_actions RENAME TO cassette_actions_before_0010;

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

INSERT INTO cassette_actions SELECT * FROM cassette_actions_before_0010 ORDER BY action_seq;

DROP TABLE cassette_actions_before_0010;

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

CREATE TRIGGER cassette_actions_no_update BEFORE UPDATE ON cassette_actions
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_actions rows cannot be updated'); END;

CREATE TRIGGER cassette_actions_no_delete BEFORE DELETE ON cassette_actions
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_actions rows cannot be deleted'); END;

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

CREATE INDEX cassette_actions_by_cause ON cassette_actions (caused_by, action_seq)
    WHERE caused_by IS NOT NULL;

CREATE INDEX cassette_actions_plan_lifecycle ON cassette_actions (plan_id, action_seq)
    WHERE (action_type = 'PlanStarted' OR action_type = 'PlanPaused' OR action_type = 'PlanResumed'
           OR action_type = 'PlanCompleted' OR action_type = 'PlanAborted');

CREATE TRIGGER cassette_actions_cause_guard BEFORE INSERT ON cassette_actions
WHEN NEW.caused_by IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'REFERENCE_MISSING: the cause (caused_by) does not exist')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_actions WHERE action_id = NEW.caused_by);
END;

CREATE TRIGGER cassette_actions_dense AFTER INSERT ON cassette_actions
WHEN NEW.action_seq > 1
 AND NOT EXISTS (SELECT 1 FROM cassette_actions NOT INDEXED WHERE action_seq = NEW.action_seq - 1)
BEGIN SELECT RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: action_seq must follow the last one'); END;

CREATE INDEX cassette_actions_by_time ON cassette_actions (timestamp, action_seq);

CREATE INDEX cassette_actions_by_function ON cassette_actions (function_name, action_seq);

-- The gate of the readable-JSON and artifact checks (moved onto cassette_actions_readable
-- above), where they stood among the AFTER INSERT triggers.
CREATE TRIGGER cassette_actions_readable_gate AFTER INSERT ON cassette_actions
WHEN NEW.arguments_json GLOB '*[0-9][eE]*' OR NEW.arguments_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.arguments_json) > 2048 OR instr(lower(NEW.arguments_json), '\ud') > 0
  OR NEW.result_json GLOB '*[0-9][eE]*' OR NEW.result_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.result_json) > 2048 OR instr(lower(NEW.result_json), '\ud') > 0
  OR NEW.metadata_json GLOB '*[0-9][eE]*' OR NEW.metadata_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.metadata_json) > 2048 OR instr(lower(NEW.metadata_json), '\ud') > 0
  OR NEW.arguments_artifact IS NOT NULL OR NEW.result_artifact IS NOT NULL
BEGIN
    INSERT INTO cassette_actions_readable
        (arguments_json, result_json, metadata_json, arguments_artifact, result_artifact)
    VALUES (NEW.arguments_json, NEW.result_json, NEW.metadata_json,
            NEW.arguments_artifact, NEW.result_artifact);
END;

CREATE TRIGGER cassette_actions_time AFTER INSERT ON cassette_actions
WHEN typeof(NEW.timestamp) IS NOT 'integer' OR NEW.timestamp > 253402300799999
  OR NEW.timestamp < (SELECT ms FROM cassette_ledger_time) OR NEW.timestamp < (SELECT timestamp FROM cassette_actions NOT INDEXED WHERE action_seq = NEW.action_seq - 1)
BEGIN
    SELECT RAISE(ABORT, 'INVALID_TIME: timestamp is an integer of epoch ms before the year 10000')
    WHERE typeof(NEW.timestamp) IS NOT 'integer' OR NEW.timestamp > 253402300799999;
    SELECT RAISE(ABORT, 'TIME_BACKWARDS: timestamp is an integer no earlier than the ledger''s latest time');
END;

CREATE TRIGGER cassette_actions_journaled AFTER INSERT ON cassette_actions
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal INDEXED BY cassette_journal_by_row
                 WHERE tbl = 'cassette_actions' AND row_key = +NEW.action_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

CREATE TRIGGER cassette_actions_cause_in_time AFTER INSERT ON cassette_actions
WHEN NEW.caused_by IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'CAUSE_AFTER_EFFECT: the cause (caused_by) has a later timestamp than its effect')
    WHERE (SELECT c.timestamp FROM cassette_actions c WHERE c.action_id = NEW.caused_by)
          > NEW.timestamp;
END;

CREATE TRIGGER cassette_actions_suggested_causes AFTER INSERT ON cassette_actions
WHEN json_type(NEW.metadata_json, '$.suggested_causes') IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'INVALID_METADATA: suggested_causes is an array of at most 20 {action_id, reason} objects')
    WHERE json_type(NEW.metadata_json, '$.suggested_causes') IS NOT 'array'
       OR json_array_length(NEW.metadata_json, '$.suggested_causes') > 20
       OR EXISTS (SELECT 1 FROM json_each(NEW.metadata_json, '$.suggested_causes') s
                  WHERE s.type IS NOT 'object'
                     OR json_type(s.value, '$.action_id') IS NOT 'text'
                     OR json_type(s.value, '$.reason') IS NOT 'text'
                     OR length(json_extract(s.value, '$.reason')) NOT BETWEEN 1 AND 500
                     OR (SELECT count(*) FROM json_each(s.value)) IS NOT 2);
    SELECT RAISE(ABORT, 'REFERENCE_MISSING: a suggested cause names no earlier action')
    WHERE EXISTS (SELECT 1 FROM json_each(NEW.metadata_json, '$.suggested_causes') s
                  WHERE NOT EXISTS (
                      SELECT 1 FROM cassette_actions c
                       WHERE c.action_id = json_extract(s.value, '$.action_id')
                         AND c.action_seq < NEW.action_seq));
END;

CREATE TRIGGER cassette_actions_plan_body AFTER INSERT ON cassette_actions
WHEN json_type(NEW.metadata_json, '$.plan_body') IS NOT NULL
  OR json_type(NEW.metadata_json, '$.plan_hash') IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'INVALID_PLAN_BODY: plan_body and plan_hash belong to a PlanStarted action')
    WHERE NEW.action_type IS NOT 'PlanStarted';
    SELECT RAISE(ABORT, 'INVALID_PLAN_BODY: plan_body is text and plan_hash 64 lowercase hex digits')
    WHERE json_type(NEW.metadata_json, '$.plan_body') IS NOT 'text'
       OR json_type(NEW.metadata_json, '$.plan_hash') IS NOT 'text'
       OR length(json_extract(NEW.metadata_json, '$.plan_hash')) IS NOT 64
       OR json_extract(NEW.metadata_json, '$.plan_hash') GLOB '*[^0-9a-f]*';
END;

-- The gate of the lifecycle guard (moved onto cassette_actions_lifecycle above), where it
-- stood among the BEFORE INSERT triggers: plan_finished, created after it, still fires first.
CREATE TRIGGER cassette_actions_lifecycle_gate BEFORE INSERT ON cassette_actions
WHEN NEW.action_type GLOB 'Plan*'
  OR CASE WHEN json_valid(NEW.metadata_json)
          THEN json_extract(NEW.metadata_json, '$.checkpoint_id') IS NOT NULL END
BEGIN
    INSERT INTO cassette_actions_lifecycle (plan_id, action_type, parent_action_id, metadata_json)
    VALUES (NEW.plan_id, NEW.action_type, NEW.parent_action_id, NEW.metadata_json);
END;

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

PRAGMA legacy_alter_table = OFF;

-- This migration records itself, once (see 0005).
DROP TRIGGER cassette_migrations_insert_guard;
CREATE TRIGGER cassette_migrations_insert_guard BEFORE INSERT ON cassette_migrations
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be replaced')
    WHERE EXISTS (SELECT 1 FROM cassette_migrations WHERE version = NEW.version);
    SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: only a cassette connection migrates the ledger')
    WHERE NOT EXISTS (SELECT 1 FROM pragma_function_list WHERE name = 'cassette_chain_hash');
    SELECT RAISE(ABORT, 'MIGRATION_FAILED: only the migration being applied records itself')
    WHERE NEW.version IS NOT 10 OR NEW.name IS NOT 'sql_levers'
       OR typeof(NEW.sha256) IS NOT 'text' OR length(NEW.sha256) IS NOT 64
       OR NEW.sha256 GLOB '*[^0-9a-f]*';
END;
