-- Migration 0001, the baseline of release 0.1.0: every object a ledger file keeps.
-- Generated from the concern files of schema/, never edited:
--   python -m catalytic_cassette.migrate baseline
-- (tests/test_schema_files.py fails when it differs from them). schema/ is the authority
-- and carries the reasons; a later migration changes a ledger from the baseline on, and
-- the concern files change with it.

-- -------------------- schema/10_ledger.sql

-- The ledger's own tables: its metadata, the migrations it has taken, and its time.
--
-- Every rule of the ledger lives in these schema files, one per concern, and holds for any
-- connection: the rules a ledger file keeps are written with SQLite built-ins only, so a
-- raw `sqlite3` connection (foreign keys off, no registered functions) gets the same
-- precise refusal codes as the package; a rule needs a built-in for that, and reads no
-- function a client could register under the same name. The rules that need the package's
-- SQL functions (its clock, SHA-256) are TEMP triggers each package connection installs:
-- they stand at the end of their concern's file, after the TEMP line. A write that those
-- TEMP triggers did not journal is refused by the file's own rules (JOURNAL_REQUIRED), so
-- a connection without them fails closed.
--
-- Order is meaning. SQLite fires a connection's TEMP triggers before the file's, and of a
-- table's triggers for one event the newest first; the file's order here is the order the
-- triggers of each table are created in (tests/test_schema_files.py pins it). Each table
-- has its immutability triggers, then a `<table>_rules` trigger (journal, time, dense ids,
-- readable JSON: the rules every row meets), then the guards that fire before it (their
-- codes name what a row broke, before the rules ask whether it was journaled).
--
-- Every rule is checked before the row is written: a client's own TEMP trigger ending in
-- RAISE(IGNORE) after the insert would end the row's remaining AFTER triggers with the
-- row kept; in a BEFORE trigger IGNORE drops the row, which is no bypass. Only the
-- consequences of a row (a receipt commits its step, a release requeues it, an entry
-- grows the tree) are AFTER triggers.
--
-- Lookups name their index (INDEXED BY) or read the table itself (NOT INDEXED), so that
-- planner statistics written by anyone (ANALYZE, sqlite_stat1) cannot turn them into
-- scans. LAW.md states the law these files implement.

-- ============================================================================
-- cassette_meta

-- format and ledger_id: what the package reads to know the file; written once, at creation.
CREATE TABLE cassette_meta (
    key TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
) STRICT;

-- The ledger's own name for the default seal origin. A verifier never trusts it: it
-- pins the origin it expects (LAW.md, "Seals").
INSERT INTO cassette_meta (key, value) VALUES ('ledger_id', lower(hex(randomblob(16))));

-- Metadata and migrations are append-only.
CREATE TRIGGER cassette_meta_no_update BEFORE UPDATE ON cassette_meta
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_meta rows cannot be updated'); END;

CREATE TRIGGER cassette_meta_no_delete BEFORE DELETE ON cassette_meta
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_meta rows cannot be deleted'); END;

-- Written only by the package's migration runner (a connection without the package's
-- functions, a raw shell, cannot add rows), never replaced, and only the two keys: the
-- format, and a ledger_id of 32 lowercase hex digits.
CREATE TRIGGER cassette_meta_insert_guard BEFORE INSERT ON cassette_meta
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_meta rows cannot be replaced')
    WHERE EXISTS (SELECT 1 FROM cassette_meta WHERE key = NEW.key);
    SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: only a cassette connection migrates the ledger')
    WHERE NOT EXISTS (SELECT 1 FROM pragma_function_list WHERE name = 'cassette_chain_hash');
    SELECT RAISE(ABORT, 'MIGRATION_FAILED: cassette_meta holds only format and ledger_id')
    WHERE NOT ((NEW.key IS 'format' AND NEW.value IS 'catalytic-cassette')
            OR (NEW.key IS 'ledger_id' AND length(NEW.value) = 32
                AND NEW.value NOT GLOB '*[^0-9a-f]*'));
END;

-- ============================================================================
-- cassette_migrations

-- One row per migration the ledger has taken: version, name, and the SHA-256 of its text
-- (a file whose rows are not the package's was made by another build: SCHEMA_UNRELEASED).
CREATE TABLE cassette_migrations (
    version INTEGER PRIMARY KEY NOT NULL CHECK (version > 0),
    name TEXT NOT NULL,
    sha256 TEXT NOT NULL CHECK (length(sha256) = 64)
) STRICT;

CREATE TRIGGER cassette_migrations_no_update BEFORE UPDATE ON cassette_migrations
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be updated'); END;

CREATE TRIGGER cassette_migrations_no_delete BEFORE DELETE ON cassette_migrations
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be deleted'); END;

-- A migration records itself, once: each migration re-creates this guard naming its own
-- version and name, so nobody can record a version the package does not ship (a version
-- from the future would refuse every open). The package's functions must be present, as
-- for cassette_meta.
CREATE TRIGGER cassette_migrations_insert_guard BEFORE INSERT ON cassette_migrations
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be replaced')
    WHERE EXISTS (SELECT 1 FROM cassette_migrations WHERE version = NEW.version);
    SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: only a cassette connection migrates the ledger')
    WHERE NOT EXISTS (SELECT 1 FROM pragma_function_list WHERE name = 'cassette_chain_hash');
    SELECT RAISE(ABORT, 'MIGRATION_FAILED: only the migration being applied records itself')
    WHERE NEW.version IS NOT 1 OR NEW.name IS NOT 'baseline'
       OR typeof(NEW.sha256) IS NOT 'text' OR length(NEW.sha256) IS NOT 64
       OR NEW.sha256 GLOB '*[^0-9a-f]*';
END;

-- ============================================================================
-- cassette_ledger_time

-- The ledger's time is the latest time it has recorded: the newest row of each dated table
-- (ids are dense and times never decrease, so the newest row holds the latest time). No
-- write is dated before it (each table's rules). Honest writers date their rows
-- max(their clock, ledger time), so someone else's future date never blocks them; verify
-- reports dates in the future and large forward jumps (LAW.md, "Time").
CREATE VIEW cassette_ledger_time (ms) AS
SELECT max(
    coalesce((SELECT created_at FROM cassette_messages NOT INDEXED ORDER BY message_id DESC LIMIT 1), 0),
    coalesce((SELECT created_at FROM cassette_jobs NOT INDEXED ORDER BY job_id DESC LIMIT 1), 0),
    coalesce((SELECT created_at FROM cassette_steps NOT INDEXED ORDER BY step_id DESC LIMIT 1), 0),
    coalesce((SELECT created_at FROM cassette_receipts NOT INDEXED ORDER BY receipt_id DESC LIMIT 1), 0),
    coalesce((SELECT created_at FROM cassette_releases NOT INDEXED ORDER BY release_id DESC LIMIT 1), 0),
    coalesce((SELECT timestamp FROM cassette_actions NOT INDEXED ORDER BY action_seq DESC LIMIT 1), 0),
    coalesce((SELECT created_at FROM cassette_checkpoints NOT INDEXED ORDER BY checkpoint_seq DESC LIMIT 1), 0),
    coalesce((SELECT created_at FROM cassette_seals NOT INDEXED ORDER BY seal_id DESC LIMIT 1), 0),
    coalesce((SELECT created_at FROM cassette_attestations NOT INDEXED ORDER BY attestation_id DESC LIMIT 1), 0));

-- -------------------- schema/20_messages.sql

-- Messages and the jobs they carry: what is asked of the workers (LAW.md, "Messages").
-- A message is posted once per idempotency key; its jobs, and their steps (30_steps.sql),
-- are written with it in one transaction. Both tables are append-only.

-- ============================================================================
-- cassette_messages

-- A message: its run, its source (USER, AGENT or SYSTEM), its payload (a JSON object) and an
-- optional idempotency key, unique per run: posting it again returns the first message.
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

-- Append-only.
CREATE TRIGGER cassette_messages_no_update BEFORE UPDATE ON cassette_messages
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_messages rows cannot be updated'); END;

CREATE TRIGGER cassette_messages_no_delete BEFORE DELETE ON cassette_messages
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_messages rows cannot be deleted'); END;

-- The rules every row meets, checked before it is written, in this order: its journal
-- entry is the journal's last (JOURNAL_REQUIRED: only a package connection journals), its
-- time is readable and not before the ledger's, its JSON can be read back by the API,
-- its id is the next one (dense ids: a row at 2^63 - 1 would make every later insert
-- fail). A NULL id reads -1 in a BEFORE trigger: the next id, which SQLite then gives the
-- row. A row that breaks a NOT NULL or CHECK constraint is left to it (SQLite tests
-- those after the BEFORE triggers), so it gets the constraint's code.
CREATE TRIGGER cassette_messages_rules BEFORE INSERT ON cassette_messages
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection')
        WHEN 2 THEN RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
        WHEN 3 THEN RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time')
        WHEN 4 THEN RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
        WHEN 5 THEN RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: message_id must follow the last one')
        WHEN 6 THEN RAISE(ABORT, 'OUT_OF_ORDER: a message_id must be larger than every existing one') END
    FROM (SELECT k.id, CASE
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_messages', 'op', 'INSERT', 'key', k.id,
                  'row', json_object('message_id', k.id, 'run_id', NEW.run_id, 'source', NEW.source,
                           'idempotency_key', NEW.idempotency_key,
                           'payload_json', NEW.payload_json, 'created_at', NEW.created_at)) THEN 1
            WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999 THEN 2
            WHEN NEW.created_at < (SELECT ms FROM cassette_ledger_time) THEN 3
            WHEN (NEW.payload_json GLOB '*[0-9][eE]*' OR NEW.payload_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
                  OR length(NEW.payload_json) > 2048 OR instr(lower(NEW.payload_json), '\ud') > 0)
             AND json_valid(NEW.payload_json) AND (
                 (length(NEW.payload_json) > 2048
                  AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.payload_json
                                     || replace(hex(zeroblob(975)), '00', ']') || ']'))
                 OR EXISTS (
                     SELECT 1 FROM json_tree(NEW.payload_json)
                     WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
                        OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
                        OR (instr(lower(NEW.payload_json), '\ud') > 0 AND (
                            (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                            OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*')))))) THEN 4
            WHEN k.id > 1 AND NOT EXISTS (SELECT 1 FROM cassette_messages NOT INDEXED WHERE message_id = k.id - 1) THEN 5
            WHEN EXISTS (SELECT 1 FROM cassette_messages WHERE message_id > k.id) THEN 6 END AS broken
          FROM (SELECT CASE WHEN NEW.message_id = -1 THEN coalesce((SELECT message_id FROM cassette_messages NOT INDEXED ORDER BY message_id DESC LIMIT 1), 0) + 1 ELSE NEW.message_id END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.run_id IS NOT NULL AND NEW.source IS NOT NULL AND NEW.payload_json IS NOT NULL AND NEW.created_at IS NOT NULL
      AND (r.id > 0
           AND coalesce(length(NEW.run_id) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.source = 'USER' OR NEW.source = 'PLANNER' OR NEW.source = 'SYSTEM' OR NEW.source = 'WORKER', 1)
           AND coalesce(length(NEW.idempotency_key) BETWEEN 1 AND 200, 1)
           AND coalesce(CASE WHEN json_valid(NEW.payload_json) THEN json_type(NEW.payload_json) = 'object' ELSE 0 END, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

-- A message_id is used once, and an idempotency key once per run (posting with it again
-- returns the first message, in the package). Fires before the rules.
CREATE TRIGGER cassette_messages_insert_guard BEFORE INSERT ON cassette_messages
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: a message with this message_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_messages WHERE message_id = NEW.message_id);
    SELECT RAISE(ABORT, 'IDEMPOTENCY_CONFLICT: a message with this run_id and idempotency_key exists')
    WHERE NEW.idempotency_key IS NOT NULL
      AND EXISTS (SELECT 1 FROM cassette_messages
                  WHERE run_id = NEW.run_id AND idempotency_key = NEW.idempotency_key);
END;

-- ============================================================================
-- cassette_jobs

-- A job of a message: an intent and its ordinal in the message, created with it.
CREATE TABLE cassette_jobs (
    job_id INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (job_id > 0),
    message_id INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    intent TEXT NOT NULL CONSTRAINT INVALID_INTENT CHECK (length(intent) BETWEEN 1 AND 200),
    ordinal INTEGER NOT NULL CONSTRAINT INVALID_ORDINAL CHECK (ordinal >= 0),
    created_at INTEGER NOT NULL,
    UNIQUE (message_id, ordinal)
) STRICT;

-- Append-only.
CREATE TRIGGER cassette_jobs_no_update BEFORE UPDATE ON cassette_jobs
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_jobs rows cannot be updated'); END;

CREATE TRIGGER cassette_jobs_no_delete BEFORE DELETE ON cassette_jobs
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_jobs rows cannot be deleted'); END;

-- The rules every row meets (journal, time, dense ids): see cassette_messages_rules.
CREATE TRIGGER cassette_jobs_rules BEFORE INSERT ON cassette_jobs
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection')
        WHEN 2 THEN RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
        WHEN 3 THEN RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time')
        WHEN 4 THEN RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: job_id must follow the last one') END
    FROM (SELECT k.id, CASE
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_jobs', 'op', 'INSERT', 'key', k.id,
                  'row', json_object('job_id', k.id, 'message_id', NEW.message_id, 'run_id', NEW.run_id,
                           'intent', NEW.intent, 'ordinal', NEW.ordinal,
                           'created_at', NEW.created_at)) THEN 1
            WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999 THEN 2
            WHEN NEW.created_at < (SELECT ms FROM cassette_ledger_time) THEN 3
            WHEN k.id > 1 AND NOT EXISTS (SELECT 1 FROM cassette_jobs NOT INDEXED WHERE job_id = k.id - 1) THEN 4 END AS broken
          FROM (SELECT CASE WHEN NEW.job_id = -1 THEN coalesce((SELECT job_id FROM cassette_jobs NOT INDEXED ORDER BY job_id DESC LIMIT 1), 0) + 1 ELSE NEW.job_id END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.message_id IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.intent IS NOT NULL AND NEW.ordinal IS NOT NULL AND NEW.created_at IS NOT NULL
      AND (r.id > 0
           AND coalesce(length(NEW.intent) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.ordinal >= 0, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

-- A job is written once per (message, ordinal), under an existing message of its run.
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

-- -------------------- schema/30_steps.sql

-- Steps, receipts and releases: the step machine, its leases and fencing (LAW.md,
-- sections 3-5). The whole law of a step is in this file, TEMP triggers included.
--
-- A step is PENDING, LEASED or COMMITTED:
--   PENDING -> LEASED     a claim: sets lease_owner and lease_expires_at, adds 1 to the
--                         fencing token (so a stale holder's token no longer matches)
--   LEASED  -> COMMITTED  only by inserting its receipt, with the current token, by the
--                         lease owner, before the lease expired (or ABORTED after it)
--   LEASED  -> PENDING    a requeue of an expired lease, or a release (its holder giving
--                         it back early); the lease is cleared and the token kept
-- Nothing else: no other transition, no field of a step changes outside one of these,
-- and no row of a step, receipt or release is deleted.
-- A step whose lease was claimed signed (60_worker_keys.sql) ends only by its worker's
-- attested act or by an attested requeue.
-- What needs the clock (a lease's length, expiry) is checked against the transaction's
-- time by the TEMP triggers below; the rest holds on any connection.

-- ============================================================================
-- cassette_steps

-- A step of a job: its payload, its state, and its lease (owner, expiry, fencing token).
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

-- Claim order: oldest message by insertion sequence, then job ordinal, then step ordinal.
CREATE INDEX cassette_steps_claimable
    ON cassette_steps (run_id, message_id, job_ordinal, ordinal)
    WHERE status = 'PENDING';

-- The leases of a run by expiry: what a requeue finds.
CREATE INDEX cassette_steps_leased
    ON cassette_steps (run_id, lease_expires_at)
    WHERE status = 'LEASED';

CREATE INDEX cassette_steps_by_run_status ON cassette_steps (run_id, status);

-- No step is deleted; updates are the machine's transitions only (below).
CREATE TRIGGER cassette_steps_no_delete BEFORE DELETE ON cassette_steps
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_steps rows cannot be deleted'); END;

-- The rules every inserted step meets (journal, time, readable JSON, dense ids): see
-- 20_messages.sql, cassette_messages_rules.
CREATE TRIGGER cassette_steps_rules BEFORE INSERT ON cassette_steps
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection')
        WHEN 2 THEN RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
        WHEN 3 THEN RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time')
        WHEN 4 THEN RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
        WHEN 5 THEN RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: step_id must follow the last one') END
    FROM (SELECT k.id, CASE
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_steps', 'op', 'INSERT', 'key', k.id,
                  'row', json_object('step_id', k.id, 'job_id', NEW.job_id, 'run_id', NEW.run_id,
                           'message_id', NEW.message_id, 'job_ordinal', NEW.job_ordinal,
                           'ordinal', NEW.ordinal, 'status', NEW.status,
                           'lease_owner', NEW.lease_owner,
                           'lease_expires_at', NEW.lease_expires_at,
                           'fencing_token', NEW.fencing_token, 'payload_json', NEW.payload_json,
                           'created_at', NEW.created_at)) THEN 1
            WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999 THEN 2
            WHEN NEW.created_at < (SELECT ms FROM cassette_ledger_time) THEN 3
            WHEN (NEW.payload_json GLOB '*[0-9][eE]*' OR NEW.payload_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
                  OR length(NEW.payload_json) > 2048 OR instr(lower(NEW.payload_json), '\ud') > 0)
             AND json_valid(NEW.payload_json) AND (
                 (length(NEW.payload_json) > 2048
                  AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.payload_json
                                     || replace(hex(zeroblob(975)), '00', ']') || ']'))
                 OR EXISTS (
                     SELECT 1 FROM json_tree(NEW.payload_json)
                     WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
                        OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
                        OR (instr(lower(NEW.payload_json), '\ud') > 0 AND (
                            (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                            OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*')))))) THEN 4
            WHEN k.id > 1 AND NOT EXISTS (SELECT 1 FROM cassette_steps NOT INDEXED WHERE step_id = k.id - 1) THEN 5 END AS broken
          FROM (SELECT CASE WHEN NEW.step_id = -1 THEN coalesce((SELECT step_id FROM cassette_steps NOT INDEXED ORDER BY step_id DESC LIMIT 1), 0) + 1 ELSE NEW.step_id END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.job_id IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.message_id IS NOT NULL AND NEW.job_ordinal IS NOT NULL AND NEW.ordinal IS NOT NULL AND NEW.status IS NOT NULL AND NEW.fencing_token IS NOT NULL AND NEW.payload_json IS NOT NULL AND NEW.created_at IS NOT NULL
      AND (r.id > 0
           AND coalesce(NEW.ordinal >= 0, 1)
           AND coalesce(NEW.status = 'PENDING' OR NEW.status = 'LEASED' OR NEW.status = 'COMMITTED', 1)
           AND coalesce(NEW.fencing_token >= 0, 1)
           AND coalesce(CASE WHEN json_valid(NEW.payload_json) THEN json_type(NEW.payload_json) = 'object' ELSE 0 END, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

-- The rules every transition meets: a claim's lease expires after the ledger's latest
-- time and within 30 days of it (INVALID_TTL: the writer's clock is the TEMP guard's), and
-- the journal's last entry is the step's new revision (JOURNAL_REQUIRED on a connection
-- that did not journal it). They fire last, after the guards below have named what a
-- change broke.
CREATE TRIGGER cassette_steps_update_rules BEFORE UPDATE ON cassette_steps
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'INVALID_TTL: a lease expires after the ledger''s latest time, within 30 days of a time before the year 10000')
        WHEN 2 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection') END
    FROM (SELECT CASE
            WHEN OLD.status = 'PENDING' AND NEW.status IS 'LEASED'
                 AND typeof(NEW.lease_expires_at) = 'integer'
                 AND (NEW.lease_expires_at <= (SELECT ms FROM cassette_ledger_time)
                      OR NEW.lease_expires_at > 253402300799999 + 2592000000) THEN 1
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_steps', 'op', 'UPDATE', 'key', NEW.step_id,
                  'row', json_object('step_id', NEW.step_id, 'job_id', NEW.job_id, 'run_id', NEW.run_id,
                           'message_id', NEW.message_id, 'job_ordinal', NEW.job_ordinal,
                           'ordinal', NEW.ordinal, 'status', NEW.status,
                           'lease_owner', NEW.lease_owner,
                           'lease_expires_at', NEW.lease_expires_at,
                           'fencing_token', NEW.fencing_token, 'payload_json', NEW.payload_json,
                           'created_at', NEW.created_at)) THEN 2 END AS broken
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.job_id IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.message_id IS NOT NULL AND NEW.job_ordinal IS NOT NULL AND NEW.ordinal IS NOT NULL AND NEW.status IS NOT NULL AND NEW.fencing_token IS NOT NULL AND NEW.payload_json IS NOT NULL AND NEW.created_at IS NOT NULL
      AND (NEW.step_id > 0
           AND coalesce(NEW.ordinal >= 0, 1)
           AND coalesce(NEW.status = 'PENDING' OR NEW.status = 'LEASED' OR NEW.status = 'COMMITTED', 1)
           AND coalesce(NEW.fencing_token >= 0, 1)
           AND coalesce(CASE WHEN json_valid(NEW.payload_json) THEN json_type(NEW.payload_json) = 'object' ELSE 0 END, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

-- A step is inserted PENDING, with token 0 and no lease, under an existing job of its run
-- and message, once per (job, ordinal).
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

-- The step machine. Only status, the lease fields and fencing_token change; each
-- transition is one of the three allowed, and changes exactly the fields it must:
--   claim    PENDING -> LEASED: sets lease_owner and lease_expires_at, token + 1
--   requeue  LEASED -> PENDING: clears the lease, keeps the token
--   commit   LEASED -> COMMITTED: keeps the lease and the token, only with its receipt
-- The allow-list is law.EDGES (tests/test_law.py reads it out of this text).
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

-- A signed lease goes back to PENDING only by its worker's (attested) release or by an
-- attested requeue. Expiry needs the clock: the requeue's timing is checked by a TEMP
-- trigger (60_worker_keys.sql) and by verify --worker-keys.
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

-- ============================================================================
-- cassette_receipts

-- The receipt of a step: its worker, the token it held, the outcome and the result.
-- One per step.
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

CREATE INDEX cassette_receipts_by_run ON cassette_receipts (run_id, outcome);

-- Append-only.
CREATE TRIGGER cassette_receipts_no_update BEFORE UPDATE ON cassette_receipts
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_receipts rows cannot be updated'); END;

CREATE TRIGGER cassette_receipts_no_delete BEFORE DELETE ON cassette_receipts
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_receipts rows cannot be deleted'); END;

-- Inserting the receipt is what commits the step (the step's update is journaled after
-- the receipt's entry, by the step's own rules).
CREATE TRIGGER cassette_receipts_commit_step AFTER INSERT ON cassette_receipts
BEGIN
    UPDATE cassette_steps SET status = 'COMMITTED' WHERE step_id = NEW.step_id;
END;

-- The rules every receipt meets (journal, time, readable JSON, dense ids): see
-- 20_messages.sql, cassette_messages_rules.
CREATE TRIGGER cassette_receipts_rules BEFORE INSERT ON cassette_receipts
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection')
        WHEN 2 THEN RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
        WHEN 3 THEN RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time')
        WHEN 4 THEN RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
        WHEN 5 THEN RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: receipt_id must follow the last one') END
    FROM (SELECT k.id, CASE
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_receipts', 'op', 'INSERT', 'key', k.id,
                  'row', json_object('receipt_id', k.id, 'step_id', NEW.step_id, 'job_id', NEW.job_id,
                           'run_id', NEW.run_id, 'worker_id', NEW.worker_id,
                           'fencing_token', NEW.fencing_token, 'outcome', NEW.outcome,
                           'receipt_json', NEW.receipt_json, 'created_at', NEW.created_at)) THEN 1
            WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999 THEN 2
            WHEN NEW.created_at < (SELECT ms FROM cassette_ledger_time) THEN 3
            WHEN (NEW.receipt_json GLOB '*[0-9][eE]*' OR NEW.receipt_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
                  OR length(NEW.receipt_json) > 2048 OR instr(lower(NEW.receipt_json), '\ud') > 0)
             AND json_valid(NEW.receipt_json) AND (
                 (length(NEW.receipt_json) > 2048
                  AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.receipt_json
                                     || replace(hex(zeroblob(975)), '00', ']') || ']'))
                 OR EXISTS (
                     SELECT 1 FROM json_tree(NEW.receipt_json)
                     WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
                        OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
                        OR (instr(lower(NEW.receipt_json), '\ud') > 0 AND (
                            (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                            OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*')))))) THEN 4
            WHEN k.id > 1 AND NOT EXISTS (SELECT 1 FROM cassette_receipts NOT INDEXED WHERE receipt_id = k.id - 1) THEN 5 END AS broken
          FROM (SELECT CASE WHEN NEW.receipt_id = -1 THEN coalesce((SELECT receipt_id FROM cassette_receipts NOT INDEXED ORDER BY receipt_id DESC LIMIT 1), 0) + 1 ELSE NEW.receipt_id END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.step_id IS NOT NULL AND NEW.job_id IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.worker_id IS NOT NULL AND NEW.fencing_token IS NOT NULL AND NEW.outcome IS NOT NULL AND NEW.receipt_json IS NOT NULL AND NEW.created_at IS NOT NULL
      AND (r.id > 0
           AND coalesce(length(NEW.worker_id) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.outcome = 'SUCCESS' OR NEW.outcome = 'FAILURE' OR NEW.outcome = 'ABORTED', 1)
           AND coalesce(CASE WHEN json_valid(NEW.receipt_json) THEN json_type(NEW.receipt_json) = 'object' ELSE 0 END, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

-- Fencing: a receipt is taken only for an existing LEASED step of its run and job, with
-- the step's current token, from its lease owner, once. A stale holder (whose lease was
-- requeued and claimed again) carries an old token and is refused.
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

-- A receipt for a lease whose claim its worker attested needs that worker's attested
-- completion under the same key; an ABORTED receipt may instead follow an attested
-- requeue (max attempts reached after expiry, LAW.md section 4). The WHEN clause lets
-- every other rule name its own code first: this fires only on a receipt they accept.
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

-- ============================================================================
-- cassette_releases

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

-- Append-only.
CREATE TRIGGER cassette_releases_no_update BEFORE UPDATE ON cassette_releases
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_releases rows cannot be updated'); END;

CREATE TRIGGER cassette_releases_no_delete BEFORE DELETE ON cassette_releases
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_releases rows cannot be deleted'); END;

-- Recording the release is what requeues the step (journaled after the release's entry).
CREATE TRIGGER cassette_releases_requeue_step AFTER INSERT ON cassette_releases
BEGIN
    UPDATE cassette_steps SET status = 'PENDING', lease_owner = NULL, lease_expires_at = NULL
    WHERE step_id = NEW.step_id;
END;

-- The rules every release meets (journal, time, dense ids): see
-- 20_messages.sql, cassette_messages_rules.
CREATE TRIGGER cassette_releases_rules BEFORE INSERT ON cassette_releases
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection')
        WHEN 2 THEN RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
        WHEN 3 THEN RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time')
        WHEN 4 THEN RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: release_id must follow the last one') END
    FROM (SELECT k.id, CASE
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_releases', 'op', 'INSERT', 'key', k.id,
                  'row', json_object('release_id', k.id, 'step_id', NEW.step_id, 'run_id', NEW.run_id,
                           'worker_id', NEW.worker_id, 'fencing_token', NEW.fencing_token,
                           'created_at', NEW.created_at)) THEN 1
            WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999 THEN 2
            WHEN NEW.created_at < (SELECT ms FROM cassette_ledger_time) THEN 3
            WHEN k.id > 1 AND NOT EXISTS (SELECT 1 FROM cassette_releases NOT INDEXED WHERE release_id = k.id - 1) THEN 4 END AS broken
          FROM (SELECT CASE WHEN NEW.release_id = -1 THEN coalesce((SELECT release_id FROM cassette_releases NOT INDEXED ORDER BY release_id DESC LIMIT 1), 0) + 1 ELSE NEW.release_id END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.step_id IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.worker_id IS NOT NULL AND NEW.fencing_token IS NOT NULL AND NEW.created_at IS NOT NULL
      AND (r.id > 0
           AND coalesce(length(NEW.worker_id) BETWEEN 1 AND 200, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

-- Only the lease owner releases, with the current token, a LEASED step of its run; a
-- step is released once per token.
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

-- A release of a signed lease needs its worker's attested release under the same key.
CREATE TRIGGER cassette_releases_signature_guard BEFORE INSERT ON cassette_releases
WHEN EXISTS (SELECT 1 FROM cassette_steps s
             WHERE s.step_id = NEW.step_id AND s.status = 'LEASED' AND s.run_id IS NEW.run_id
               AND s.fencing_token IS NEW.fencing_token AND s.lease_owner IS NEW.worker_id)
BEGIN
    SELECT RAISE(ABORT, 'SIGNATURE_REQUIRED: this lease was claimed signed; its worker must attest the release')
    FROM cassette_attestations c
    WHERE c.step_id = NEW.step_id AND c.fencing_token = NEW.fencing_token
      AND c.act = 'claim' AND c.worker_id = NEW.worker_id
      AND NOT EXISTS (SELECT 1 FROM cassette_attestations a
                      WHERE a.step_id = NEW.step_id AND a.fencing_token = NEW.fencing_token
                        AND a.act = 'release' AND a.worker_id = c.worker_id
                        AND a.key_id = c.key_id);
END;

-- -------------------- schema/40_actions.sql

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

-- -------------------- schema/50_journal.sql

-- The journal, its Merkle tree and the seals over it (LAW.md, "Journal encoding", "Merkle
-- tree", "Seals").
--
-- The journal is the one hash chain of the whole ledger: every row of every ledger table is
-- one entry, written before the row by the package's TEMP journal triggers (in each
-- table's file), and each table's rules refuse a row whose entry is not the journal's
-- last. The RFC 9162 Merkle tree over the entries' leaf hashes is stored a block of 256
-- leaves at a time; a seal is a signed checkpoint of the first tree_size entries,
-- recorded in the ledger (journaled like any row) and written to a file kept outside it.

-- ============================================================================
-- cassette_journal

-- seq, body (canonical JSON of the row), leaf_hash = SHA-256(0x00 || body), and
-- chain_hash over the previous one; tbl and row_key are stored from the body, for the
-- by-row index (verify checks they are the body's).
CREATE TABLE cassette_journal (
    seq INTEGER PRIMARY KEY CONSTRAINT JOURNAL_BROKEN CHECK (seq >= 0),
    body TEXT NOT NULL CONSTRAINT JOURNAL_BROKEN CHECK (json_valid(body)),
    leaf_hash BLOB NOT NULL CONSTRAINT JOURNAL_BROKEN CHECK (length(leaf_hash) = 32),
    chain_hash BLOB NOT NULL CONSTRAINT JOURNAL_BROKEN CHECK (length(chain_hash) = 32),
    tbl TEXT GENERATED ALWAYS AS (json_extract(body, '$.table')) STORED,
    row_key ANY GENERATED ALWAYS AS (json_extract(body, '$.key')) STORED
) STRICT;

CREATE INDEX cassette_journal_by_row ON cassette_journal (tbl, row_key, seq);

-- Append-only.
CREATE TRIGGER cassette_journal_no_update BEFORE UPDATE ON cassette_journal
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_journal rows cannot be updated'); END;

CREATE TRIGGER cassette_journal_no_delete BEFORE DELETE ON cassette_journal
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_journal rows cannot be deleted'); END;

-- The journal accepts only the next seq with correct hashes. The hash checks call the
-- package's SHA-256 functions, so a connection without them cannot insert journal rows
-- at all (it fails closed with "no such function").
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

-- The entry that ends an aligned block of 256 leaves (seq % 256 = 255) stores the block's
-- level-1 nodes (cassette_tree_nodes_grow adds the ones above them), after healing the
-- blocks just before it that a connection left without nodes (walking back one probe per
-- block, oldest first), and fails closed if the block's root is not then stored. Kept
-- short on purpose: SQLite allocates and zeroes a frame as large as a trigger's program
-- for every row it fires on, even when its WHEN clause is false.
CREATE TRIGGER cassette_journal_grow_tree AFTER INSERT ON cassette_journal
WHEN NEW.seq % 256 = 255
BEGIN
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT r.seq, 1, cassette_node_hash(l.leaf_hash, r.leaf_hash)
    FROM cassette_journal AS r NOT INDEXED
    JOIN cassette_journal AS l NOT INDEXED ON l.seq = r.seq - 1
    WHERE r.seq BETWEEN (
            WITH RECURSIVE skipped(first) AS (
                SELECT NEW.seq - 255
                UNION ALL
                SELECT first - 256 FROM skipped
                WHERE first > 0 AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes
                                                WHERE leaf_end = first - 1 AND level = 8)
            )
            SELECT min(first) FROM skipped)
        AND NEW.seq
      AND r.seq % 2 = 1
      AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = r.seq AND level = 1)
    ORDER BY r.seq;
    SELECT RAISE(ABORT, 'TREE_BROKEN: a complete block of the journal stores its tree nodes')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = NEW.seq AND level = 8);
END;

-- ============================================================================
-- cassette_tree_nodes

-- A complete aligned subtree of `2^level` leaves whose last leaf is journal seq
-- `leaf_end`. The key orders nodes as they complete (by their last leaf, then level), so
-- verify reads them in one pass beside the journal. Leaves (level 0) are the journal's
-- own leaf_hash column. The nodes of the last, incomplete block are never stored:
-- whoever needs them computes them from its leaves (at most 255).
CREATE TABLE cassette_tree_nodes (
    leaf_end INTEGER NOT NULL CONSTRAINT TREE_BROKEN CHECK (leaf_end >= 1),
    level INTEGER NOT NULL CONSTRAINT TREE_BROKEN CHECK (level BETWEEN 1 AND 62),
    hash BLOB NOT NULL CONSTRAINT TREE_BROKEN CHECK (length(hash) = 32),
    CONSTRAINT TREE_BROKEN CHECK ((leaf_end + 1) % (1 << level) = 0),
    PRIMARY KEY (leaf_end, level)
) STRICT, WITHOUT ROWID;

-- Append-only.
CREATE TRIGGER cassette_tree_nodes_no_update BEFORE UPDATE ON cassette_tree_nodes
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_tree_nodes rows cannot be updated'); END;

-- A node is the hash of its two children, which must exist. The hash check calls the
-- package's cassette_node_hash, so a connection without it cannot add nodes at all.
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

-- A node covers only complete blocks of journaled entries: the nodes of the incomplete
-- block are nobody's to store, so nobody can plant one over other writers' entries
-- before the block that completes them.
CREATE TRIGGER cassette_tree_nodes_bounded BEFORE INSERT ON cassette_tree_nodes
BEGIN
    SELECT RAISE(ABORT, 'TREE_BROKEN: a tree node covers only complete blocks of journaled entries')
    WHERE typeof(NEW.leaf_end) IS NOT 'integer'
       OR NEW.leaf_end >= coalesce((SELECT seq + 1 - (seq + 1) % 256 FROM cassette_journal
                                    NOT INDEXED ORDER BY seq DESC LIMIT 1), 0);
END;

CREATE TRIGGER cassette_tree_nodes_no_delete BEFORE DELETE ON cassette_tree_nodes
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_tree_nodes rows cannot be deleted'); END;

-- A level-1 node completes every node above it that ends at the same entry, bottom up,
-- each from its stored left sibling and the node below it: one statement, so nothing
-- depends on recursive_triggers. Where a left sibling is missing the climb stops (the
-- seal stores the rest, tree.heal) and the append goes on: no append depends on a node a
-- connection could keep from being stored.
CREATE TRIGGER cassette_tree_nodes_grow AFTER INSERT ON cassette_tree_nodes
WHEN NEW.level = 1 AND NEW.leaf_end % 4 = 3
BEGIN
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT NEW.leaf_end, level, hash FROM (
        WITH RECURSIVE up(level, hash) AS (
            SELECT 1, NEW.hash
            UNION ALL
            SELECT up.level + 1, cassette_node_hash(sibling.hash, up.hash)
            FROM up JOIN cassette_tree_nodes AS sibling
              ON sibling.leaf_end = NEW.leaf_end - (1 << up.level) AND sibling.level = up.level
            WHERE (NEW.leaf_end + 1) % (1 << (up.level + 1)) = 0
        )
        SELECT level, hash FROM up WHERE level > 1 ORDER BY level
    ) AS above
    WHERE NOT EXISTS (SELECT 1 FROM cassette_tree_nodes
                      WHERE leaf_end = NEW.leaf_end AND level = above.level);
END;

-- ============================================================================
-- cassette_seals

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

-- Append-only.
CREATE TRIGGER cassette_seals_no_update BEFORE UPDATE ON cassette_seals
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_seals rows cannot be updated'); END;

CREATE TRIGGER cassette_seals_no_delete BEFORE DELETE ON cassette_seals
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_seals rows cannot be deleted'); END;

-- The rules every seal meets (journal, time, dense ids): see
-- 20_messages.sql, cassette_messages_rules.
CREATE TRIGGER cassette_seals_rules BEFORE INSERT ON cassette_seals
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection')
        WHEN 2 THEN RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
        WHEN 3 THEN RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time')
        WHEN 4 THEN RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: seal_id must follow the last one') END
    FROM (SELECT k.id, CASE
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_seals', 'op', 'INSERT', 'key', k.id,
                  'row', json_object('seal_id', k.id, 'tree_size', NEW.tree_size, 'root_hex', NEW.root_hex,
                           'origin', NEW.origin, 'key_id', NEW.key_id, 'note', NEW.note,
                           'created_at', NEW.created_at)) THEN 1
            WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999 THEN 2
            WHEN NEW.created_at < (SELECT ms FROM cassette_ledger_time) THEN 3
            WHEN k.id > 1 AND NOT EXISTS (SELECT 1 FROM cassette_seals NOT INDEXED WHERE seal_id = k.id - 1) THEN 4 END AS broken
          FROM (SELECT CASE WHEN NEW.seal_id = -1 THEN coalesce((SELECT seal_id FROM cassette_seals NOT INDEXED ORDER BY seal_id DESC LIMIT 1), 0) + 1 ELSE NEW.seal_id END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.tree_size IS NOT NULL AND NEW.root_hex IS NOT NULL AND NEW.origin IS NOT NULL AND NEW.key_id IS NOT NULL AND NEW.note IS NOT NULL AND NEW.created_at IS NOT NULL
      AND (r.id > 0
           AND coalesce(NEW.tree_size >= 1, 1)
           AND coalesce(length(NEW.root_hex) = 64 AND NEW.root_hex NOT GLOB '*[^0-9a-f]*', 1)
           AND coalesce(length(NEW.origin) BETWEEN 1 AND 200
          AND NEW.origin NOT GLOB '*[' || char(9, 10, 13, 32, 43) || ']*', 1)
           AND coalesce(length(NEW.key_id) = 8 AND NEW.key_id NOT GLOB '*[^0-9a-f]*', 1)
           AND coalesce(substr(NEW.note, 1, length(NEW.origin) + length(NEW.tree_size) + 2)
          = NEW.origin || char(10) || NEW.tree_size || char(10), 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

-- The sealed root must be the root of the ledger's first tree_size entries. The root of n
-- leaves folds the complete subtrees of n's binary digits, smallest first; those in the
-- incomplete last block are folded from the journal's leaves (cassette_subtree_hash),
-- the larger ones are stored nodes. Calls the package's functions, so only a package
-- connection records seals. One trigger, so the checks run in this order.
CREATE TRIGGER cassette_seals_insert_guard BEFORE INSERT ON cassette_seals
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: a seal with this seal_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_seals WHERE seal_id = NEW.seal_id);
    SELECT RAISE(ABORT, 'OUT_OF_ORDER: a seal_id must be larger than every existing one')
    WHERE EXISTS (SELECT 1 FROM cassette_seals WHERE seal_id > NEW.seal_id);
    SELECT RAISE(ABORT, 'INVALID_SEAL: a seal covers at least one entry')
    WHERE typeof(NEW.tree_size) IS NOT 'integer' OR NEW.tree_size < 1;
    SELECT RAISE(ABORT, 'INVALID_SEAL: a seal covers at most the entries the journal has')
    WHERE NEW.tree_size > coalesce((SELECT max(seq) + 1 FROM cassette_journal), 0)
          - (SELECT count(*) FROM cassette_journal
             WHERE seq = (SELECT max(seq) FROM cassette_journal)
               AND tbl = 'cassette_seals' AND row_key = NEW.seal_id);
    SELECT RAISE(ABORT, 'SEAL_MISMATCH: the sealed root is not the ledger''s root at that size')
    WHERE NEW.root_hex IS NOT (
        SELECT lower(hex(acc)) FROM (
            WITH RECURSIVE fold(b, started, acc) AS (
                SELECT 0, 0, NULL
                UNION ALL
                SELECT b + 1,
                       started OR (NEW.tree_size >> b) & 1,
                       CASE WHEN (NEW.tree_size >> b) & 1 = 0 THEN acc
                            WHEN b >= 8 AND started THEN cassette_node_hash(
                                (SELECT hash FROM cassette_tree_nodes
                                 WHERE level = b AND leaf_end = ((NEW.tree_size >> (b + 1)) << (b + 1))
                                                                + (1 << b) - 1),
                                acc)
                            WHEN b >= 8 THEN (SELECT hash FROM cassette_tree_nodes
                                 WHERE level = b AND leaf_end = ((NEW.tree_size >> (b + 1)) << (b + 1))
                                                                + (1 << b) - 1)
                            WHEN started THEN cassette_node_hash(
                                (SELECT cassette_subtree_hash(seq, leaf_hash) FROM cassette_journal NOT INDEXED
                                 WHERE seq BETWEEN (NEW.tree_size >> (b + 1)) << (b + 1)
                                               AND ((NEW.tree_size >> (b + 1)) << (b + 1))
                                                   + (1 << b) - 1),
                                acc)
                            ELSE (SELECT cassette_subtree_hash(seq, leaf_hash) FROM cassette_journal NOT INDEXED
                                 WHERE seq BETWEEN (NEW.tree_size >> (b + 1)) << (b + 1)
                                               AND ((NEW.tree_size >> (b + 1)) << (b + 1))
                                                   + (1 << b) - 1) END
                FROM fold WHERE (NEW.tree_size >> b) > 0
            )
            SELECT acc FROM fold ORDER BY b DESC LIMIT 1
        )
    );
END;

-- -------------------- schema/60_worker_keys.sql

-- Worker keys: a worker holding an Ed25519 key attests its posts, claims, releases and
-- completions (and anyone's requeue of its expired lease) with a signed statement,
-- recorded here *before* the act's own row, in the same transaction. LAW.md, "Worker
-- keys", gives the statement's bytes.
--
-- SQL cannot check an Ed25519 signature without a registered function, and a rule must
-- not call one (a raw connection would then fail before any rule named its code). So the
-- rules here check only what is visible without cryptography: that an attestation names
-- an act that is possible now, and (30_steps.sql, the `*_signature_guard` triggers) that
-- a signed lease is ended only by its own worker's attested act or an attested requeue.
-- Whether each signature is genuine, and made by the key pinned for its worker, is
-- `verify --worker-keys DIR`.

-- ============================================================================
-- cassette_attestations

-- An attestation names an act its worker may do now: one message that does not exist
-- yet, or a step in the state the act needs, with the token the act will carry. Ids are
-- given explicitly and dense.
CREATE TABLE cassette_attestations (
    attestation_id INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (attestation_id > 0),
    act TEXT NOT NULL
        CONSTRAINT INVALID_ATTESTATION
        CHECK (act IN ('post', 'claim', 'release', 'complete', 'requeue')),
    run_id TEXT NOT NULL CONSTRAINT INVALID_RUN_ID CHECK (length(run_id) BETWEEN 1 AND 200),
    message_id INTEGER,
    step_id INTEGER,
    fencing_token INTEGER,
    worker_id TEXT NOT NULL CONSTRAINT INVALID_WORKER CHECK (length(worker_id) BETWEEN 1 AND 200),
    key_id TEXT NOT NULL
        CONSTRAINT INVALID_ATTESTATION CHECK (length(key_id) = 16 AND key_id NOT GLOB '*[^0-9a-f]*'),
    signature TEXT NOT NULL
        CONSTRAINT INVALID_ATTESTATION CHECK (
            length(signature) = 88 AND substr(signature, 87) = '=='
            AND substr(signature, 1, 86) NOT GLOB '*[^A-Za-z0-9+/]*'
        ),
    created_at INTEGER NOT NULL,
    -- A post names its message; every other act names a step and a fencing token.
    CONSTRAINT INVALID_ATTESTATION CHECK (
        CASE WHEN act = 'post'
             THEN message_id IS NOT NULL AND step_id IS NULL AND fencing_token IS NULL
             ELSE message_id IS NULL AND step_id IS NOT NULL AND fencing_token IS NOT NULL END
    )
) STRICT;

-- Every signature guard looks attestations up by step and token (or by message).
CREATE INDEX cassette_attestations_by_step
    ON cassette_attestations (step_id, fencing_token, act, worker_id);

CREATE INDEX cassette_attestations_by_message ON cassette_attestations (message_id);

-- Append-only.
CREATE TRIGGER cassette_attestations_no_update BEFORE UPDATE ON cassette_attestations
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_attestations rows cannot be updated'); END;

CREATE TRIGGER cassette_attestations_no_delete BEFORE DELETE ON cassette_attestations
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_attestations rows cannot be deleted'); END;

-- Attestations are dated like every ledger row (never before the ledger's latest time,
-- and part of it) and journaled: see 20_messages.sql, cassette_messages_rules.
CREATE TRIGGER cassette_attestations_rules BEFORE INSERT ON cassette_attestations
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
        WHEN 2 THEN RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time')
        WHEN 3 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection') END
    FROM (SELECT k.id, CASE
            WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999 THEN 1
            WHEN NEW.created_at < (SELECT ms FROM cassette_ledger_time) THEN 2
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_attestations', 'op', 'INSERT', 'key', k.id,
                  'row', json_object('attestation_id', k.id, 'act', NEW.act, 'run_id', NEW.run_id,
                           'message_id', NEW.message_id, 'step_id', NEW.step_id,
                           'fencing_token', NEW.fencing_token, 'worker_id', NEW.worker_id,
                           'key_id', NEW.key_id, 'signature', NEW.signature,
                           'created_at', NEW.created_at)) THEN 3 END AS broken
          FROM (SELECT CASE WHEN NEW.attestation_id = -1 THEN coalesce((SELECT attestation_id FROM cassette_attestations NOT INDEXED ORDER BY attestation_id DESC LIMIT 1), 0) + 1 ELSE NEW.attestation_id END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.act IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.worker_id IS NOT NULL AND NEW.key_id IS NOT NULL AND NEW.signature IS NOT NULL AND NEW.created_at IS NOT NULL
      AND (r.id > 0
           AND coalesce(NEW.act IN ('post', 'claim', 'release', 'complete', 'requeue'), 1)
           AND coalesce(length(NEW.run_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.worker_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.key_id) = 16 AND NEW.key_id NOT GLOB '*[^0-9a-f]*', 1)
           AND coalesce(length(NEW.signature) = 88 AND substr(NEW.signature, 87) = '=='
          AND substr(NEW.signature, 1, 86) NOT GLOB '*[^A-Za-z0-9+/]*', 1)
           AND coalesce(CASE WHEN NEW.act = 'post'
          THEN NEW.message_id IS NOT NULL AND NEW.step_id IS NULL AND NEW.fencing_token IS NULL
          ELSE NEW.message_id IS NULL AND NEW.step_id IS NOT NULL AND NEW.fencing_token IS NOT NULL END, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

-- The act is possible now and attested once: a post under the next message_id, before
-- its message; a claim of a PENDING step with the token the claim will give; a release,
-- completion or requeue of a LEASED step with its current token (a release or completion
-- by its lease owner). Ids are given in order without gaps.
CREATE TRIGGER cassette_attestations_insert_guard BEFORE INSERT ON cassette_attestations
BEGIN
    SELECT RAISE(ABORT, 'INVALID_ATTESTATION: act is post, claim, release, complete or requeue')
    WHERE NEW.act IS NULL OR NEW.act NOT IN ('post', 'claim', 'release', 'complete', 'requeue');
    SELECT RAISE(ABORT, 'INVALID_WORKER: worker_id is a string of 1-200 characters')
    WHERE typeof(NEW.worker_id) IS NOT 'text' OR length(NEW.worker_id) NOT BETWEEN 1 AND 200;
    SELECT RAISE(ABORT, 'APPEND_ONLY: an attestation with this attestation_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_attestations WHERE attestation_id = NEW.attestation_id);
    SELECT RAISE(ABORT, 'OUT_OF_ORDER: attestation ids are given in order without gaps')
    WHERE NEW.attestation_id IS NOT
          coalesce((SELECT max(attestation_id) FROM cassette_attestations), 0) + 1;
    SELECT RAISE(ABORT, 'APPEND_ONLY: this act is already attested')
    WHERE EXISTS (SELECT 1 FROM cassette_attestations
                  WHERE act = NEW.act AND message_id = NEW.message_id)
       OR EXISTS (SELECT 1 FROM cassette_attestations
                  WHERE step_id = NEW.step_id AND fencing_token = NEW.fencing_token
                    AND act = NEW.act AND worker_id = NEW.worker_id);
    -- a post is attested before its message is inserted, under the next message_id
    SELECT RAISE(ABORT, 'OUT_OF_ORDER: a post is attested before its message, under the next message_id')
    WHERE NEW.act IS 'post'
      AND (typeof(NEW.message_id) IS NOT 'integer'
           OR EXISTS (SELECT 1 FROM cassette_messages WHERE message_id >= NEW.message_id));
    SELECT RAISE(ABORT, 'STEP_NOT_FOUND: the attested step does not exist')
    WHERE NEW.act IS NOT 'post'
      AND NOT EXISTS (SELECT 1 FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'RUN_MISMATCH: the step belongs to another run')
    WHERE NEW.act IS NOT 'post'
      AND NEW.run_id IS NOT (SELECT run_id FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'INVALID_ATTESTATION: a claim is attested for a PENDING step')
    WHERE NEW.act IS 'claim'
      AND (SELECT status FROM cassette_steps WHERE step_id = NEW.step_id) IS NOT 'PENDING';
    SELECT RAISE(ABORT, 'STALE_FENCING_TOKEN: a claim is attested with the step''s next token')
    WHERE NEW.act IS 'claim' AND NEW.fencing_token IS NOT
          (SELECT fencing_token + 1 FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'NOT_LEASED: only a LEASED step is released, completed or requeued')
    WHERE NEW.act IN ('release', 'complete', 'requeue')
      AND (SELECT status FROM cassette_steps WHERE step_id = NEW.step_id) IS NOT 'LEASED';
    SELECT RAISE(ABORT, 'STALE_FENCING_TOKEN: the token is not the step''s current token')
    WHERE NEW.act IN ('release', 'complete', 'requeue') AND NEW.fencing_token IS NOT
          (SELECT fencing_token FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'WRONG_WORKER: only the lease owner releases or completes a step')
    WHERE NEW.act IN ('release', 'complete') AND NEW.worker_id IS NOT
          (SELECT lease_owner FROM cassette_steps WHERE step_id = NEW.step_id);
END;
