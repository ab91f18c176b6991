-- 0001: the message cassette (messages -> jobs -> steps -> receipts), step
-- releases, ledger metadata and the single hash-chained journal.
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
