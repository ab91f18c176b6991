-- The current full schema of a cassette ledger (every migration applied).
-- tests/test_migrations.py proves that applying migrations/ from empty gives
-- exactly this schema.
--
-- Every guard below uses only SQLite built-ins, so a raw `sqlite3` connection
-- (foreign keys off, no registered functions) gets the same precise refusal
-- codes as the package. Rules that need the ledger clock or SHA-256 live in
-- schema/connection.sql (TEMP triggers installed by every package connection);
-- the `*_journaled` triggers here make any write that was not journaled by
-- those TEMP triggers fail closed with JOURNAL_REQUIRED.

CREATE TABLE cassette_meta (
    key TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
) STRICT;

CREATE TABLE cassette_migrations (
    version INTEGER PRIMARY KEY NOT NULL CHECK (version > 0),
    name TEXT NOT NULL,
    sha256 TEXT NOT NULL CHECK (length(sha256) = 64)
) STRICT;

CREATE TABLE cassette_messages (
    message_id INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (message_id > 0),
    run_id TEXT NOT NULL CONSTRAINT INVALID_RUN_ID CHECK (length(run_id) BETWEEN 1 AND 200),
    source TEXT NOT NULL
        CONSTRAINT INVALID_SOURCE CHECK (source IN ('USER', 'PLANNER', 'SYSTEM', 'WORKER')),
    idempotency_key TEXT
        CONSTRAINT INVALID_IDEMPOTENCY_KEY CHECK (length(idempotency_key) BETWEEN 1 AND 200),
    payload_json TEXT NOT NULL
        CONSTRAINT INVALID_PAYLOAD CHECK (
            CASE WHEN json_valid(payload_json) THEN json_type(payload_json) = 'object' ELSE 0 END
        ),
    created_at INTEGER NOT NULL,
    UNIQUE (run_id, idempotency_key)
) STRICT;

CREATE TABLE cassette_jobs (
    job_id INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (job_id > 0),
    message_id INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    intent TEXT NOT NULL CONSTRAINT INVALID_INTENT CHECK (length(intent) BETWEEN 1 AND 200),
    ordinal INTEGER NOT NULL CONSTRAINT INVALID_ORDINAL CHECK (ordinal >= 0),
    created_at INTEGER NOT NULL,
    UNIQUE (message_id, ordinal)
) STRICT;

CREATE TABLE cassette_steps (
    step_id INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (step_id > 0),
    job_id INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    message_id INTEGER NOT NULL,
    job_ordinal INTEGER NOT NULL,
    ordinal INTEGER NOT NULL CONSTRAINT INVALID_ORDINAL CHECK (ordinal >= 0),
    status TEXT NOT NULL
        CONSTRAINT INVALID_STATUS CHECK (status IN ('PENDING', 'LEASED', 'COMMITTED')),
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

-- Claim order: oldest message by insertion sequence, then job ordinal, then step ordinal.
CREATE INDEX cassette_steps_claimable
    ON cassette_steps (run_id, message_id, job_ordinal, ordinal)
    WHERE status = 'PENDING';

CREATE INDEX cassette_steps_leased
    ON cassette_steps (run_id, lease_expires_at)
    WHERE status = 'LEASED';

CREATE INDEX cassette_steps_by_run_status ON cassette_steps (run_id, status);

CREATE TABLE cassette_receipts (
    receipt_id INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (receipt_id > 0),
    step_id INTEGER NOT NULL UNIQUE,
    job_id INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    worker_id TEXT NOT NULL CONSTRAINT INVALID_WORKER CHECK (length(worker_id) BETWEEN 1 AND 200),
    fencing_token INTEGER NOT NULL,
    outcome TEXT NOT NULL
        CONSTRAINT INVALID_OUTCOME CHECK (outcome IN ('SUCCESS', 'FAILURE', 'ABORTED')),
    receipt_json TEXT NOT NULL
        CONSTRAINT INVALID_PAYLOAD CHECK (
            CASE WHEN json_valid(receipt_json) THEN json_type(receipt_json) = 'object' ELSE 0 END
        ),
    created_at INTEGER NOT NULL
) STRICT;

CREATE INDEX cassette_receipts_by_run ON cassette_receipts (run_id, outcome);

-- A lease holder giving its step back before expiry. Recording the release is
-- what allows LEASED -> PENDING for an unexpired lease.
CREATE TABLE cassette_releases (
    release_id INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (release_id > 0),
    step_id INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    worker_id TEXT NOT NULL CONSTRAINT INVALID_WORKER CHECK (length(worker_id) BETWEEN 1 AND 200),
    fencing_token INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    UNIQUE (step_id, fencing_token)
) STRICT;

-- The one hash chain of the whole ledger (LAW.md, "Journal encoding").
CREATE TABLE cassette_journal (
    seq INTEGER PRIMARY KEY CONSTRAINT JOURNAL_BROKEN CHECK (seq >= 0),
    body TEXT NOT NULL CONSTRAINT JOURNAL_BROKEN CHECK (json_valid(body)),
    leaf_hash BLOB NOT NULL CONSTRAINT JOURNAL_BROKEN CHECK (length(leaf_hash) = 32),
    chain_hash BLOB NOT NULL CONSTRAINT JOURNAL_BROKEN CHECK (length(chain_hash) = 32),
    tbl TEXT GENERATED ALWAYS AS (json_extract(body, '$.table')) VIRTUAL,
    row_key ANY GENERATED ALWAYS AS (json_extract(body, '$.key')) VIRTUAL
) STRICT;

CREATE INDEX cassette_journal_by_row ON cassette_journal (tbl, row_key, seq);

-- ---------------------------------------------------------------- append-only

CREATE TRIGGER cassette_meta_no_update BEFORE UPDATE ON cassette_meta
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_meta rows cannot be updated'); END;
CREATE TRIGGER cassette_meta_no_delete BEFORE DELETE ON cassette_meta
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_meta rows cannot be deleted'); END;
-- Written only by the package's migration runner: a connection without the
-- package's functions (a raw shell) cannot add rows here.
CREATE TRIGGER cassette_meta_insert_guard BEFORE INSERT ON cassette_meta
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_meta rows cannot be replaced')
    WHERE EXISTS (SELECT 1 FROM cassette_meta WHERE key = NEW.key);
    SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: only a cassette connection migrates the ledger')
    WHERE NOT EXISTS (SELECT 1 FROM pragma_function_list WHERE name = 'cassette_chain_hash');
END;

CREATE TRIGGER cassette_migrations_no_update BEFORE UPDATE ON cassette_migrations
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be updated'); END;
CREATE TRIGGER cassette_migrations_no_delete BEFORE DELETE ON cassette_migrations
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be deleted'); END;
-- Written only by the package's migration runner: a connection without the
-- package's functions (a raw shell) cannot add rows here.
CREATE TRIGGER cassette_migrations_insert_guard BEFORE INSERT ON cassette_migrations
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be replaced')
    WHERE EXISTS (SELECT 1 FROM cassette_migrations WHERE version = NEW.version);
    SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: only a cassette connection migrates the ledger')
    WHERE NOT EXISTS (SELECT 1 FROM pragma_function_list WHERE name = 'cassette_chain_hash');
END;

CREATE TRIGGER cassette_messages_no_update BEFORE UPDATE ON cassette_messages
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_messages rows cannot be updated'); END;
CREATE TRIGGER cassette_messages_no_delete BEFORE DELETE ON cassette_messages
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_messages rows cannot be deleted'); END;

CREATE TRIGGER cassette_jobs_no_update BEFORE UPDATE ON cassette_jobs
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_jobs rows cannot be updated'); END;
CREATE TRIGGER cassette_jobs_no_delete BEFORE DELETE ON cassette_jobs
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_jobs rows cannot be deleted'); END;

CREATE TRIGGER cassette_steps_no_delete BEFORE DELETE ON cassette_steps
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_steps rows cannot be deleted'); END;

CREATE TRIGGER cassette_receipts_no_update BEFORE UPDATE ON cassette_receipts
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_receipts rows cannot be updated'); END;
CREATE TRIGGER cassette_receipts_no_delete BEFORE DELETE ON cassette_receipts
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_receipts rows cannot be deleted'); END;

CREATE TRIGGER cassette_releases_no_update BEFORE UPDATE ON cassette_releases
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_releases rows cannot be updated'); END;
CREATE TRIGGER cassette_releases_no_delete BEFORE DELETE ON cassette_releases
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_releases rows cannot be deleted'); END;

CREATE TRIGGER cassette_journal_no_update BEFORE UPDATE ON cassette_journal
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_journal rows cannot be updated'); END;
CREATE TRIGGER cassette_journal_no_delete BEFORE DELETE ON cassette_journal
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_journal rows cannot be deleted'); END;

-- ------------------------------------------------------------------ messages

CREATE TRIGGER cassette_messages_insert_guard BEFORE INSERT ON cassette_messages
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: a message with this message_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_messages WHERE message_id = NEW.message_id);
    SELECT RAISE(ABORT, 'IDEMPOTENCY_CONFLICT: a message with this run_id and idempotency_key exists')
    WHERE NEW.idempotency_key IS NOT NULL
      AND EXISTS (SELECT 1 FROM cassette_messages
                  WHERE run_id = NEW.run_id AND idempotency_key = NEW.idempotency_key);
END;

-- Messages are claimed in insertion order, so a new message must sort last.
CREATE TRIGGER cassette_messages_in_order AFTER INSERT ON cassette_messages
-- (a rowid range probe: max() would let the planner pick a covering index and scan it)
WHEN EXISTS (SELECT 1 FROM cassette_messages WHERE message_id > NEW.message_id)
BEGIN SELECT RAISE(ABORT, 'OUT_OF_ORDER: a message_id must be larger than every existing one'); END;

-- ---------------------------------------------------------------------- jobs

CREATE TRIGGER cassette_jobs_insert_guard BEFORE INSERT ON cassette_jobs
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: a job with this job_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_jobs WHERE job_id = NEW.job_id);
    SELECT RAISE(ABORT, 'APPEND_ONLY: a job with this message_id and ordinal exists')
    WHERE EXISTS (SELECT 1 FROM cassette_jobs
                  WHERE message_id = NEW.message_id AND ordinal = NEW.ordinal);
    SELECT RAISE(ABORT, 'REFERENCE_MISSING: the job''s message does not exist')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_messages WHERE message_id = NEW.message_id);
    SELECT RAISE(ABORT, 'RUN_MISMATCH: a job''s run_id must equal its message''s run_id')
    WHERE NEW.run_id IS NOT (SELECT run_id FROM cassette_messages WHERE message_id = NEW.message_id);
END;

-- --------------------------------------------------------------------- steps

CREATE TRIGGER cassette_steps_insert_guard BEFORE INSERT ON cassette_steps
BEGIN
    SELECT RAISE(ABORT, 'INVALID_STATUS: status is PENDING, LEASED or COMMITTED')
    WHERE NEW.status IS NULL OR NEW.status NOT IN ('PENDING', 'LEASED', 'COMMITTED');
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

-- The step state machine: PENDING -> LEASED (claim), LEASED -> COMMITTED
-- (only by a receipt), LEASED -> PENDING (requeue or release). Nothing else.
CREATE TRIGGER cassette_steps_update_guard BEFORE UPDATE ON cassette_steps
BEGIN
    SELECT RAISE(ABORT, 'INVALID_STATUS: status is PENDING, LEASED or COMMITTED')
    WHERE NEW.status IS NULL OR NEW.status NOT IN ('PENDING', 'LEASED', 'COMMITTED');
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

-- ------------------------------------------------------------------ receipts

CREATE TRIGGER cassette_receipts_insert_guard BEFORE INSERT ON cassette_receipts
BEGIN
    SELECT RAISE(ABORT, 'INVALID_WORKER: worker_id is a string of 1-200 characters')
    WHERE typeof(NEW.worker_id) IS NOT 'text' OR length(NEW.worker_id) NOT BETWEEN 1 AND 200;
    SELECT RAISE(ABORT, 'INVALID_OUTCOME: outcome is SUCCESS, FAILURE or ABORTED')
    WHERE NEW.outcome IS NULL OR NEW.outcome NOT IN ('SUCCESS', 'FAILURE', 'ABORTED');
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

-- Inserting the receipt is what commits the step.
CREATE TRIGGER cassette_receipts_commit_step AFTER INSERT ON cassette_receipts
BEGIN
    UPDATE cassette_steps SET status = 'COMMITTED' WHERE step_id = NEW.step_id;
END;

-- ------------------------------------------------------------------ releases

CREATE TRIGGER cassette_releases_insert_guard BEFORE INSERT ON cassette_releases
BEGIN
    SELECT RAISE(ABORT, 'INVALID_WORKER: worker_id is a string of 1-200 characters')
    WHERE typeof(NEW.worker_id) IS NOT 'text' OR length(NEW.worker_id) NOT BETWEEN 1 AND 200;
    SELECT RAISE(ABORT, 'APPEND_ONLY: a release with this release_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_releases WHERE release_id = NEW.release_id);
    SELECT RAISE(ABORT, 'APPEND_ONLY: a release of this step with this token exists')
    WHERE EXISTS (SELECT 1 FROM cassette_releases
                  WHERE step_id = NEW.step_id AND fencing_token = NEW.fencing_token);
    SELECT RAISE(ABORT, 'STEP_NOT_FOUND: the released step does not exist')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'RUN_MISMATCH: the step belongs to another run')
    WHERE NEW.run_id IS NOT (SELECT run_id FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'NOT_LEASED: only a LEASED step can be released')
    WHERE (SELECT status FROM cassette_steps WHERE step_id = NEW.step_id) IS NOT 'LEASED';
    SELECT RAISE(ABORT, 'STALE_FENCING_TOKEN: the token is not the step''s current token')
    WHERE NEW.fencing_token IS NOT (SELECT fencing_token FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'WRONG_WORKER: only the lease owner releases a step')
    WHERE NEW.worker_id IS NOT (SELECT lease_owner FROM cassette_steps WHERE step_id = NEW.step_id);
END;

CREATE TRIGGER cassette_releases_requeue_step AFTER INSERT ON cassette_releases
BEGIN
    UPDATE cassette_steps SET status = 'PENDING', lease_owner = NULL, lease_expires_at = NULL
    WHERE step_id = NEW.step_id;
END;

-- ------------------------------------------------------------------- journal

-- The journal accepts only the next seq with correct hashes. The hash checks
-- call the package's SHA-256 functions, so a connection without them cannot
-- insert journal rows at all (it fails closed with "no such function").
CREATE TRIGGER cassette_journal_insert_guard BEFORE INSERT ON cassette_journal
BEGIN
    SELECT RAISE(ABORT, 'JOURNAL_BROKEN: a journal entry continues the sequence and the chain')
    WHERE NEW.seq IS NOT coalesce((SELECT max(seq) FROM cassette_journal) + 1, 0)
       OR NEW.leaf_hash IS NOT cassette_leaf_hash(NEW.body)
       OR NEW.chain_hash IS NOT cassette_chain_hash(
              NEW.seq,
              coalesce((SELECT chain_hash FROM cassette_journal WHERE seq = NEW.seq - 1),
                       zeroblob(32)),
              NEW.leaf_hash);
END;

-- ------------------------------------------------------ fail closed: journaled

-- These run after the TEMP journaling triggers of a package connection (SQLite
-- runs TEMP triggers first). A connection without them wrote no journal row,
-- so its write is refused here. The unary + drops the column's affinity, which
-- would otherwise keep SQLite from using the row_key part of the index.
CREATE TRIGGER cassette_messages_journaled AFTER INSERT ON cassette_messages
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal
                 WHERE tbl = 'cassette_messages' AND row_key = +NEW.message_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

CREATE TRIGGER cassette_jobs_journaled AFTER INSERT ON cassette_jobs
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal
                 WHERE tbl = 'cassette_jobs' AND row_key = +NEW.job_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

CREATE TRIGGER cassette_steps_journaled AFTER INSERT ON cassette_steps
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal
                 WHERE tbl = 'cassette_steps' AND row_key = +NEW.step_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

CREATE TRIGGER cassette_steps_update_journaled AFTER UPDATE ON cassette_steps
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal
                 WHERE seq = (SELECT max(seq) FROM cassette_journal)
                   AND tbl = 'cassette_steps' AND row_key = +NEW.step_id
                   AND json_extract(body, '$.row.status') IS NEW.status
                   AND json_extract(body, '$.row.fencing_token') IS NEW.fencing_token)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

CREATE TRIGGER cassette_receipts_journaled AFTER INSERT ON cassette_receipts
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal
                 WHERE tbl = 'cassette_receipts' AND row_key = +NEW.receipt_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

CREATE TRIGGER cassette_releases_journaled AFTER INSERT ON cassette_releases
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal
                 WHERE tbl = 'cassette_releases' AND row_key = +NEW.release_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

-- ===================================================================== 0002

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

-- ===================================================================== 0003
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


-- ===================================================================== 0004
-- A complete aligned subtree of `2^level` leaves whose last leaf is journal seq
-- `leaf_end`. The key orders nodes as they complete (by their last leaf, then level), so
-- verify reads them in one pass beside the journal. Leaves (level 0) are the journal's
-- own leaf_hash column.
CREATE TABLE cassette_tree_nodes (
    leaf_end INTEGER NOT NULL CONSTRAINT TREE_BROKEN CHECK (leaf_end >= 1),
    level INTEGER NOT NULL CONSTRAINT TREE_BROKEN CHECK (level BETWEEN 1 AND 62),
    hash BLOB NOT NULL CONSTRAINT TREE_BROKEN CHECK (length(hash) = 32),
    CONSTRAINT TREE_BROKEN CHECK ((leaf_end + 1) % (1 << level) = 0),
    PRIMARY KEY (leaf_end, level)
) STRICT, WITHOUT ROWID;

CREATE TRIGGER cassette_tree_nodes_no_update BEFORE UPDATE ON cassette_tree_nodes
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_tree_nodes rows cannot be updated'); END;

CREATE TRIGGER cassette_tree_nodes_no_delete BEFORE DELETE ON cassette_tree_nodes
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_tree_nodes rows cannot be deleted'); END;

-- A node is the hash of its two children, which must exist. The hash check calls the
-- package's cassette_node_hash, so a connection without it cannot add nodes at all
-- (it fails closed with "no such function"), like the journal.
CREATE TRIGGER cassette_tree_nodes_insert_guard BEFORE INSERT ON cassette_tree_nodes
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: this tree node exists')
    WHERE EXISTS (SELECT 1 FROM cassette_tree_nodes
                  WHERE leaf_end = NEW.leaf_end AND level = NEW.level);
    SELECT RAISE(ABORT, 'TREE_BROKEN: a tree node is the hash of its two existing children')
    WHERE NEW.hash IS NOT cassette_node_hash(
        CASE WHEN NEW.level = 1
             THEN (SELECT leaf_hash FROM cassette_journal WHERE seq = NEW.leaf_end - 1)
             ELSE (SELECT hash FROM cassette_tree_nodes
                   WHERE leaf_end = NEW.leaf_end - (1 << (NEW.level - 1))
                     AND level = NEW.level - 1) END,
        CASE WHEN NEW.level = 1
             THEN (SELECT leaf_hash FROM cassette_journal WHERE seq = NEW.leaf_end)
             ELSE (SELECT hash FROM cassette_tree_nodes
                   WHERE leaf_end = NEW.leaf_end AND level = NEW.level - 1) END);
END;

-- Appending leaf `seq` completes the subtrees of 2, 4, 8, ... leaves that end at it:
-- level l completes when (seq + 1) is a multiple of 2^l. One statement computes them
-- bottom up, each from its completed left sibling and the node below it.
CREATE TRIGGER cassette_journal_grow_tree AFTER INSERT ON cassette_journal
WHEN NEW.seq % 2 = 1
BEGIN
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT NEW.seq, level, hash FROM (
        WITH RECURSIVE up(level, hash) AS (
            SELECT 1, cassette_node_hash(
                (SELECT leaf_hash FROM cassette_journal WHERE seq = NEW.seq - 1), NEW.leaf_hash)
            UNION ALL
            SELECT up.level + 1, cassette_node_hash(
                (SELECT hash FROM cassette_tree_nodes
                 WHERE leaf_end = NEW.seq - (1 << up.level) AND level = up.level),
                up.hash)
            FROM up WHERE (NEW.seq + 1) % (1 << (up.level + 1)) = 0
        )
        SELECT level, hash FROM up ORDER BY level
    );
END;

-- A seal: a signed checkpoint (c2sp.org/tlog-checkpoint in a c2sp.org/signed-note) of the
-- first `tree_size` journal entries, as written to the file kept outside the ledger.
-- Recording it journals it, so a seal of size n is itself journal entry n or later.
CREATE TABLE cassette_seals (
    seal_id INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (seal_id > 0),
    tree_size INTEGER NOT NULL CONSTRAINT INVALID_SEAL CHECK (tree_size >= 1),
    root_hex TEXT NOT NULL
        CONSTRAINT INVALID_SEAL CHECK (length(root_hex) = 64 AND root_hex NOT GLOB '*[^0-9a-f]*'),
    origin TEXT NOT NULL
        CONSTRAINT INVALID_SEAL CHECK (
            length(origin) BETWEEN 1 AND 200 AND origin NOT GLOB '*[' || char(9, 10, 13, 32, 43) || ']*'
        ),
    key_id TEXT NOT NULL
        CONSTRAINT INVALID_SEAL CHECK (length(key_id) = 8 AND key_id NOT GLOB '*[^0-9a-f]*'),
    note TEXT NOT NULL
        CONSTRAINT INVALID_SEAL CHECK (
            substr(note, 1, length(origin) + length(tree_size) + 2)
                = origin || char(10) || tree_size || char(10)
        ),
    created_at INTEGER NOT NULL
) STRICT;

CREATE TRIGGER cassette_seals_no_update BEFORE UPDATE ON cassette_seals
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_seals rows cannot be updated'); END;

CREATE TRIGGER cassette_seals_no_delete BEFORE DELETE ON cassette_seals
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_seals rows cannot be deleted'); END;

-- The sealed root must be the root of the ledger's first tree_size entries. The root
-- of n leaves folds the complete subtrees of n's binary digits, smallest first: for
-- bit b, the subtree of 2^b leaves ending at leaf ((n >> (b + 1)) << (b + 1)) + 2^b - 1.
-- Calls cassette_node_hash, so only a package connection records seals. One trigger, so
-- the checks run in this order (SQLite fires the newest BEFORE trigger first).
CREATE TRIGGER cassette_seals_insert_guard BEFORE INSERT ON cassette_seals
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: a seal with this seal_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_seals WHERE seal_id = NEW.seal_id);
    SELECT RAISE(ABORT, 'OUT_OF_ORDER: a seal_id must be larger than every existing one')
    WHERE EXISTS (SELECT 1 FROM cassette_seals WHERE seal_id > NEW.seal_id);
    SELECT RAISE(ABORT, 'INVALID_SEAL: a seal covers at least one entry')
    WHERE typeof(NEW.tree_size) IS NOT 'integer' OR NEW.tree_size < 1;
    SELECT RAISE(ABORT, 'INVALID_SEAL: a seal covers at most the entries the journal has')
    WHERE NEW.tree_size > coalesce((SELECT max(seq) + 1 FROM cassette_journal), 0);
    SELECT RAISE(ABORT, 'SEAL_MISMATCH: the sealed root is not the ledger''s root at that size')
    WHERE NEW.root_hex IS NOT (
        SELECT lower(hex(acc)) FROM (
            WITH RECURSIVE fold(b, started, acc) AS (
                SELECT 0, 0, NULL
                UNION ALL
                SELECT b + 1,
                       started OR (NEW.tree_size >> b) & 1,
                       CASE WHEN (NEW.tree_size >> b) & 1 = 0 THEN acc
                            WHEN b = 0 THEN (SELECT leaf_hash FROM cassette_journal
                                             WHERE seq = NEW.tree_size - 1)
                            WHEN started THEN cassette_node_hash(
                                (SELECT hash FROM cassette_tree_nodes
                                 WHERE level = b AND leaf_end = ((NEW.tree_size >> (b + 1)) << (b + 1))
                                                                + (1 << b) - 1),
                                acc)
                            ELSE (SELECT hash FROM cassette_tree_nodes
                                  WHERE level = b AND leaf_end = ((NEW.tree_size >> (b + 1)) << (b + 1))
                                                                 + (1 << b) - 1) END
                FROM fold WHERE (NEW.tree_size >> b) > 0
            )
            SELECT acc FROM fold ORDER BY b DESC LIMIT 1
        )
    );
END;

CREATE TRIGGER cassette_seals_journaled AFTER INSERT ON cassette_seals
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal
                 WHERE tbl = 'cassette_seals' AND row_key = +NEW.seal_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

-- ===================================================================== 0005

-- 0005: the ledger as a live source. Indexes for newest-first and time queries, a
-- cause never later than its effect, suggested causes kept apart from observed ones,
-- and a plan's body archived (with its SHA-256) on its PlanStarted action. Nothing
-- here adds a column: the journal body of an action, and so every signature and
-- every older ledger, keep their encoding.

CREATE INDEX cassette_actions_by_time ON cassette_actions (timestamp, action_seq);
CREATE INDEX cassette_actions_by_function ON cassette_actions (function_name, action_seq);

-- An effect recorded before its cause is refused, for every connection (LAW.md 6b).
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
