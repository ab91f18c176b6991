-- 0007: the ledger as a live source. Indexes for newest-first and time queries, a
-- cause never later than its effect, suggested causes kept apart from observed ones,
-- and a plan's body archived (with its SHA-256) on its PlanStarted action. Nothing
-- here adds a column: the journal body of an action, and so every signature and
-- every older ledger, keep their encoding.

CREATE INDEX cassette_actions_by_time ON cassette_actions (timestamp, action_seq);
CREATE INDEX cassette_actions_by_function ON cassette_actions (function_name, action_seq);

-- An effect recorded before its cause is refused, for every connection (LAW.md 6c).
-- AFTER INSERT, so that the rules of 0002 and 0003 keep their precedence.
CREATE TRIGGER cassette_actions_cause_in_time AFTER INSERT ON cassette_actions
WHEN NEW.caused_by IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'CAUSE_AFTER_EFFECT: the cause (caused_by) has a later timestamp than its effect')
    WHERE (SELECT c.timestamp FROM cassette_actions c WHERE c.action_id = NEW.caused_by)
          > NEW.timestamp;
END;

-- metadata.suggested_causes: what detect_dependencies proposed when the action was
-- appended, never an observed cause. An array of at most 20 objects, each naming an
-- earlier action by action_id and saying why in reason (1-500 characters).
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

-- metadata.plan_body (text) archives a plan on its PlanStarted action, with
-- metadata.plan_hash = lowercase hex SHA-256 of its UTF-8 bytes. The hash itself is
-- checked by schema/connection.sql (it needs SHA-256); the form is checked here.
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

-- This migration records itself, once (see 0005).
DROP TRIGGER cassette_migrations_insert_guard;
CREATE TRIGGER cassette_migrations_insert_guard BEFORE INSERT ON cassette_migrations
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be replaced')
    WHERE EXISTS (SELECT 1 FROM cassette_migrations WHERE version = NEW.version);
    SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: only a cassette connection migrates the ledger')
    WHERE NOT EXISTS (SELECT 1 FROM pragma_function_list WHERE name = 'cassette_chain_hash');
    SELECT RAISE(ABORT, 'MIGRATION_FAILED: only the migration being applied records itself')
    WHERE NEW.version IS NOT 7 OR NEW.name IS NOT 'live'
       OR typeof(NEW.sha256) IS NOT 'text' OR length(NEW.sha256) IS NOT 64
       OR NEW.sha256 GLOB '*[^0-9a-f]*';
END;
