-- Installed as TEMP triggers on every package connection, after the schema is
-- current. They hold the rules that need the package's SQL functions:
--   cassette_now_ms()                 the writer's clock (integer UTC epoch ms)
--   cassette_transaction_ms()         the time of the package's write transaction under
--                                     way (max of its clock and ledger time, read once
--                                     when it dates its first row); else the writer's clock
--   cassette_leaf_hash(body)          SHA-256(0x00 || body)
--   cassette_chain_hash(seq, prev, leaf)
--   cassette_sha256_hex(text)         lowercase hex SHA-256 of the UTF-8 bytes
--
-- Why TEMP and not in the file: SQLite resolves every function of every trigger
-- of a table when a statement on that table is prepared. A persistent trigger
-- calling a registered function would make a raw connection fail with "no such
-- function" before any guard could report its precise code. The persistent
-- `*_rules` triggers (migration 0011) refuse any ledger write whose body these
-- triggers did not journal as the journal's last entry (JOURNAL_REQUIRED), so a
-- connection without them still fails closed. SQLite runs TEMP triggers before the
-- main schema's triggers of the same event.

-- ------------------------------------------------------------ clock rules
-- "Now" is the transaction's time, cassette_transaction_ms(): the later of the writer's
-- clock and the latest time the ledger has recorded (the cassette_ledger_time view), read
-- once per write transaction of the package before it writes, so time never runs back and
-- every check of one transaction uses the same now. (These guards used to evaluate the
-- view, nine table probes, in each check: SQLite sizes and zeroes a trigger's frame by
-- its whole program on every row it fires on, so a short program matters.)

CREATE TEMP TRIGGER cassette_steps_clock_guard BEFORE UPDATE ON main.cassette_steps
BEGIN
    SELECT RAISE(ABORT, 'INVALID_TTL: a lease must expire in the future')
    WHERE OLD.status = 'PENDING' AND NEW.status IS 'LEASED'
      AND typeof(NEW.lease_expires_at) = 'integer'
      AND NEW.lease_expires_at <= cassette_transaction_ms();
    SELECT RAISE(ABORT, 'INVALID_TTL: a lease may last at most 30 days')
    WHERE OLD.status = 'PENDING' AND NEW.status IS 'LEASED'
      AND typeof(NEW.lease_expires_at) = 'integer'
      AND NEW.lease_expires_at
          > cassette_transaction_ms() + 2592000000;
    SELECT RAISE(ABORT, 'LEASE_NOT_EXPIRED: only an expired or released lease is requeued')
    WHERE OLD.status = 'LEASED' AND NEW.status IS 'PENDING'
      AND OLD.lease_expires_at > cassette_transaction_ms()
      AND NOT EXISTS (SELECT 1 FROM cassette_releases
                      WHERE step_id = OLD.step_id AND fencing_token = OLD.fencing_token);
END;

CREATE TEMP TRIGGER cassette_receipts_clock_guard BEFORE INSERT ON main.cassette_receipts
WHEN NEW.outcome IS NOT 'ABORTED'
 AND EXISTS (SELECT 1 FROM cassette_steps s
             WHERE s.step_id = NEW.step_id AND s.status = 'LEASED'
               AND s.run_id IS NEW.run_id AND s.job_id IS NEW.job_id
               AND s.fencing_token IS NEW.fencing_token AND s.lease_owner IS NEW.worker_id
               AND s.lease_expires_at <= cassette_transaction_ms())
BEGIN
    SELECT RAISE(ABORT, 'LEASE_EXPIRED: the lease expired before the receipt; only ABORTED is accepted');
END;

-- ---------------------------------------------------------------- journal
-- Body: canonical JSON built by SQLite with keys in a fixed order:
-- {"table":T,"op":"INSERT"|"UPDATE","key":K,"row":{every column, in table order}}
-- "LIMIT -1 OFFSET 0" keeps SQLite from flattening the subqueries, which would build
-- the body and hash it once per reference instead of once. The head is read by one
-- max(seq) probe whose bare chain_hash is the last row's (always one row, NULLs when the
-- journal is empty); a LEFT JOIN to an ORDER BY ... LIMIT 1 subquery did the same but
-- materialized a temporary table for every entry.
-- They are BEFORE triggers (since 0011): the entry is written before the row, so the
-- file's rules trigger, which fires after every TEMP trigger, finds it as the last entry,
-- and no trigger a connection adds can keep the row and skip that check (RAISE(IGNORE)
-- in an AFTER trigger ends the row's remaining triggers; in a BEFORE one it drops the
-- row). In a BEFORE trigger an INTEGER PRIMARY KEY inserted as NULL reads -1: the entry
-- takes the next id, one more than the table's last, which SQLite then gives the row.
-- A BEFORE trigger runs before SQLite tests the row's NOT NULL and CHECK constraints, and
-- INSERT OR IGNORE skips a row that fails one and keeps what the triggers wrote: so each
-- journal trigger writes only for a row those constraints will take (its WHEN clause, the
-- table's constraints over NEW), and a skipped row leaves no entry behind. Except the
-- constraints on JSON text: testing them here parsed every payload once more on every
-- write (the CHECK parses it again; SQLite's JSON cache is per trigger), about 30,000
-- instructions per row of the benchmark's payload. So INSERT OR IGNORE of a row whose
-- JSON a CHECK refuses leaves its entry without the row (verify: row_missing); the
-- package never writes so.

CREATE TEMP TRIGGER cassette_messages_journal BEFORE INSERT ON main.cassette_messages
-- (only a row its NOT NULL and CHECK constraints will take: see above)
WHEN NEW.run_id IS NOT NULL AND NEW.source IS NOT NULL AND NEW.payload_json IS NOT NULL AND NEW.created_at IS NOT NULL
 AND ((NEW.message_id > 0 OR NEW.message_id = -1)
           AND coalesce(length(NEW.run_id) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.source = 'USER' OR NEW.source = 'PLANNER' OR NEW.source = 'SYSTEM' OR NEW.source = 'WORKER', 1)
           AND coalesce(length(NEW.idempotency_key) BETWEEN 1 AND 200, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints))
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_messages', 'op', 'INSERT', 'key', k.id,
                           'row', json_object(
                               'message_id', k.id, 'run_id', NEW.run_id,
                               'source', NEW.source, 'idempotency_key', NEW.idempotency_key,
                               'payload_json', NEW.payload_json, 'created_at', NEW.created_at)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h,
                     (SELECT CASE WHEN NEW.message_id = -1
                                  THEN coalesce((SELECT message_id FROM cassette_messages NOT INDEXED
                                                 ORDER BY message_id DESC LIMIT 1), 0) + 1
                                  ELSE NEW.message_id END AS id) k
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END;

CREATE TEMP TRIGGER cassette_jobs_journal BEFORE INSERT ON main.cassette_jobs
-- (only a row its NOT NULL and CHECK constraints will take: see above)
WHEN NEW.message_id IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.intent IS NOT NULL AND NEW.ordinal IS NOT NULL AND NEW.created_at IS NOT NULL
 AND ((NEW.job_id > 0 OR NEW.job_id = -1)
           AND coalesce(length(NEW.intent) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.ordinal >= 0, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints))
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_jobs', 'op', 'INSERT', 'key', k.id,
                           'row', json_object(
                               'job_id', k.id, 'message_id', NEW.message_id,
                               'run_id', NEW.run_id, 'intent', NEW.intent,
                               'ordinal', NEW.ordinal, 'created_at', NEW.created_at)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h,
                     (SELECT CASE WHEN NEW.job_id = -1
                                  THEN coalesce((SELECT job_id FROM cassette_jobs NOT INDEXED
                                                 ORDER BY job_id DESC LIMIT 1), 0) + 1
                                  ELSE NEW.job_id END AS id) k
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END;

CREATE TEMP TRIGGER cassette_steps_journal BEFORE INSERT ON main.cassette_steps
-- (only a row its NOT NULL and CHECK constraints will take: see above)
WHEN NEW.job_id IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.message_id IS NOT NULL AND NEW.job_ordinal IS NOT NULL AND NEW.ordinal IS NOT NULL AND NEW.status IS NOT NULL AND NEW.fencing_token IS NOT NULL AND NEW.payload_json IS NOT NULL AND NEW.created_at IS NOT NULL
 AND ((NEW.step_id > 0 OR NEW.step_id = -1)
           AND coalesce(NEW.ordinal >= 0, 1)
           AND coalesce(NEW.status = 'PENDING' OR NEW.status = 'LEASED' OR NEW.status = 'COMMITTED', 1)
           AND coalesce(NEW.fencing_token >= 0, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints))
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_steps', 'op', 'INSERT', 'key', k.id,
                           'row', json_object(
                               'step_id', k.id, 'job_id', NEW.job_id, 'run_id', NEW.run_id,
                               'message_id', NEW.message_id, 'job_ordinal', NEW.job_ordinal,
                               'ordinal', NEW.ordinal, 'status', NEW.status,
                               'lease_owner', NEW.lease_owner, 'lease_expires_at', NEW.lease_expires_at,
                               'fencing_token', NEW.fencing_token, 'payload_json', NEW.payload_json,
                               'created_at', NEW.created_at)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h,
                     (SELECT CASE WHEN NEW.step_id = -1
                                  THEN coalesce((SELECT step_id FROM cassette_steps NOT INDEXED
                                                 ORDER BY step_id DESC LIMIT 1), 0) + 1
                                  ELSE NEW.step_id END AS id) k
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END;

CREATE TEMP TRIGGER cassette_steps_journal_update BEFORE UPDATE ON main.cassette_steps
-- (only a row its NOT NULL and CHECK constraints will take: see above)
WHEN NEW.job_id IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.message_id IS NOT NULL AND NEW.job_ordinal IS NOT NULL AND NEW.ordinal IS NOT NULL AND NEW.status IS NOT NULL AND NEW.fencing_token IS NOT NULL AND NEW.payload_json IS NOT NULL AND NEW.created_at IS NOT NULL
 AND (NEW.step_id > 0
           AND coalesce(NEW.ordinal >= 0, 1)
           AND coalesce(NEW.status = 'PENDING' OR NEW.status = 'LEASED' OR NEW.status = 'COMMITTED', 1)
           AND coalesce(NEW.fencing_token >= 0, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints))
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_steps', 'op', 'UPDATE', 'key', NEW.step_id,
                           'row', json_object(
                               'step_id', NEW.step_id, 'job_id', NEW.job_id, 'run_id', NEW.run_id,
                               'message_id', NEW.message_id, 'job_ordinal', NEW.job_ordinal,
                               'ordinal', NEW.ordinal, 'status', NEW.status,
                               'lease_owner', NEW.lease_owner, 'lease_expires_at', NEW.lease_expires_at,
                               'fencing_token', NEW.fencing_token, 'payload_json', NEW.payload_json,
                               'created_at', NEW.created_at)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END;

CREATE TEMP TRIGGER cassette_receipts_journal BEFORE INSERT ON main.cassette_receipts
-- (only a row its NOT NULL and CHECK constraints will take: see above)
WHEN NEW.step_id IS NOT NULL AND NEW.job_id IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.worker_id IS NOT NULL AND NEW.fencing_token IS NOT NULL AND NEW.outcome IS NOT NULL AND NEW.receipt_json IS NOT NULL AND NEW.created_at IS NOT NULL
 AND ((NEW.receipt_id > 0 OR NEW.receipt_id = -1)
           AND coalesce(length(NEW.worker_id) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.outcome = 'SUCCESS' OR NEW.outcome = 'FAILURE' OR NEW.outcome = 'ABORTED', 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints))
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_receipts', 'op', 'INSERT', 'key', k.id,
                           'row', json_object(
                               'receipt_id', k.id, 'step_id', NEW.step_id,
                               'job_id', NEW.job_id, 'run_id', NEW.run_id,
                               'worker_id', NEW.worker_id, 'fencing_token', NEW.fencing_token,
                               'outcome', NEW.outcome, 'receipt_json', NEW.receipt_json,
                               'created_at', NEW.created_at)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h,
                     (SELECT CASE WHEN NEW.receipt_id = -1
                                  THEN coalesce((SELECT receipt_id FROM cassette_receipts NOT INDEXED
                                                 ORDER BY receipt_id DESC LIMIT 1), 0) + 1
                                  ELSE NEW.receipt_id END AS id) k
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END;

CREATE TEMP TRIGGER cassette_releases_journal BEFORE INSERT ON main.cassette_releases
-- (only a row its NOT NULL and CHECK constraints will take: see above)
WHEN NEW.step_id IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.worker_id IS NOT NULL AND NEW.fencing_token IS NOT NULL AND NEW.created_at IS NOT NULL
 AND ((NEW.release_id > 0 OR NEW.release_id = -1)
           AND coalesce(length(NEW.worker_id) BETWEEN 1 AND 200, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints))
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_releases', 'op', 'INSERT', 'key', k.id,
                           'row', json_object(
                               'release_id', k.id, 'step_id', NEW.step_id,
                               'run_id', NEW.run_id, 'worker_id', NEW.worker_id,
                               'fencing_token', NEW.fencing_token,
                               'created_at', NEW.created_at)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h,
                     (SELECT CASE WHEN NEW.release_id = -1
                                  THEN coalesce((SELECT release_id FROM cassette_releases NOT INDEXED
                                                 ORDER BY release_id DESC LIMIT 1), 0) + 1
                                  ELSE NEW.release_id END AS id) k
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END;

CREATE TEMP TRIGGER cassette_actions_journal BEFORE INSERT ON main.cassette_actions
-- (only a row its NOT NULL and CHECK constraints will take: see above)
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

CREATE TEMP TRIGGER cassette_checkpoints_hash_guard BEFORE INSERT ON main.cassette_checkpoints
WHEN NEW.checkpoint_id IS NOT 'cp-' || cassette_sha256_hex(NEW.context_json)
BEGIN
    SELECT RAISE(ABORT, 'CHECKPOINT_MISMATCH: checkpoint_id must be cp- and the SHA-256 of context_json');
END;

CREATE TEMP TRIGGER cassette_checkpoints_journal BEFORE INSERT ON main.cassette_checkpoints
-- (only a row its NOT NULL and CHECK constraints will take: see above)
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

CREATE TEMP TRIGGER cassette_seals_journal BEFORE INSERT ON main.cassette_seals
-- (only a row its NOT NULL and CHECK constraints will take: see above)
WHEN NEW.tree_size IS NOT NULL AND NEW.root_hex IS NOT NULL AND NEW.origin IS NOT NULL AND NEW.key_id IS NOT NULL AND NEW.note IS NOT NULL AND NEW.created_at IS NOT NULL
 AND ((NEW.seal_id > 0 OR NEW.seal_id = -1)
           AND coalesce(NEW.tree_size >= 1, 1)
           AND coalesce(length(NEW.root_hex) = 64 AND NEW.root_hex NOT GLOB '*[^0-9a-f]*', 1)
           AND coalesce(length(NEW.origin) BETWEEN 1 AND 200
          AND NEW.origin NOT GLOB '*[' || char(9, 10, 13, 32, 43) || ']*', 1)
           AND coalesce(length(NEW.key_id) = 8 AND NEW.key_id NOT GLOB '*[^0-9a-f]*', 1)
           AND coalesce(substr(NEW.note, 1, length(NEW.origin) + length(NEW.tree_size) + 2)
          = NEW.origin || char(10) || NEW.tree_size || char(10), 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints))
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_seals', 'op', 'INSERT', 'key', k.id,
                           'row', json_object(
                               'seal_id', k.id, 'tree_size', NEW.tree_size,
                               'root_hex', NEW.root_hex, 'origin', NEW.origin,
                               'key_id', NEW.key_id, 'note', NEW.note,
                               'created_at', NEW.created_at)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h,
                     (SELECT CASE WHEN NEW.seal_id = -1
                                  THEN coalesce((SELECT seal_id FROM cassette_seals NOT INDEXED
                                                 ORDER BY seal_id DESC LIMIT 1), 0) + 1
                                  ELSE NEW.seal_id END AS id) k
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END;

-- A requeue is attested only once the lease it ends has expired (worker keys, 0005).
CREATE TEMP TRIGGER cassette_attestations_clock_guard BEFORE INSERT ON main.cassette_attestations
WHEN NEW.act IS 'requeue'
 AND EXISTS (SELECT 1 FROM cassette_steps s
             WHERE s.step_id = NEW.step_id AND s.status = 'LEASED'
               AND s.fencing_token IS NEW.fencing_token
               AND s.lease_expires_at > cassette_transaction_ms())
BEGIN
    SELECT RAISE(ABORT, 'LEASE_NOT_EXPIRED: a requeue is attested only after the lease expired');
END;

CREATE TEMP TRIGGER cassette_attestations_journal BEFORE INSERT ON main.cassette_attestations
-- (only a row its NOT NULL and CHECK constraints will take: see above)
WHEN NEW.act IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.worker_id IS NOT NULL AND NEW.key_id IS NOT NULL AND NEW.signature IS NOT NULL AND NEW.created_at IS NOT NULL
 AND ((NEW.attestation_id > 0 OR NEW.attestation_id = -1)
           AND coalesce(NEW.act IN ('post', 'claim', 'release', 'complete', 'requeue'), 1)
           AND coalesce(length(NEW.run_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.worker_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.key_id) = 16 AND NEW.key_id NOT GLOB '*[^0-9a-f]*', 1)
           AND coalesce(length(NEW.signature) = 88 AND substr(NEW.signature, 87) = '=='
          AND substr(NEW.signature, 1, 86) NOT GLOB '*[^A-Za-z0-9+/]*', 1)
           AND coalesce(CASE WHEN NEW.act = 'post'
          THEN NEW.message_id IS NOT NULL AND NEW.step_id IS NULL AND NEW.fencing_token IS NULL
          ELSE NEW.message_id IS NULL AND NEW.step_id IS NOT NULL AND NEW.fencing_token IS NOT NULL END, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints))
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_attestations', 'op', 'INSERT',
                           'key', k.id,
                           'row', json_object(
                               'attestation_id', k.id, 'act', NEW.act,
                               'run_id', NEW.run_id, 'message_id', NEW.message_id,
                               'step_id', NEW.step_id, 'fencing_token', NEW.fencing_token,
                               'worker_id', NEW.worker_id, 'key_id', NEW.key_id,
                               'signature', NEW.signature,
                               'created_at', NEW.created_at)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h,
                     (SELECT CASE WHEN NEW.attestation_id = -1
                                  THEN coalesce((SELECT attestation_id FROM cassette_attestations NOT INDEXED
                                                 ORDER BY attestation_id DESC LIMIT 1), 0) + 1
                                  ELSE NEW.attestation_id END AS id) k
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END;

-- A plan archived on its PlanStarted action carries the SHA-256 of its body (LAW.md 6c).
CREATE TEMP TRIGGER cassette_actions_plan_hash_guard BEFORE INSERT ON main.cassette_actions
-- (only a well-formed pair: a malformed one is INVALID_PLAN_BODY, from migration 5)
WHEN NEW.action_type = 'PlanStarted' AND json_valid(NEW.metadata_json)
 AND json_type(NEW.metadata_json, '$.plan_body') = 'text'
 AND length(json_extract(NEW.metadata_json, '$.plan_hash')) = 64
 AND json_extract(NEW.metadata_json, '$.plan_hash') NOT GLOB '*[^0-9a-f]*'
 AND json_extract(NEW.metadata_json, '$.plan_hash')
     IS NOT cassette_sha256_hex(json_extract(NEW.metadata_json, '$.plan_body'))
BEGIN
    SELECT RAISE(ABORT, 'PLAN_HASH_MISMATCH: plan_hash must be the SHA-256 of plan_body');
END;
