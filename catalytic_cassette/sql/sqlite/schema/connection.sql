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
-- `*_journaled` triggers refuse any ledger write that these triggers did not
-- journal (JOURNAL_REQUIRED), so a connection without them still fails closed.
-- SQLite runs TEMP triggers before the main schema's triggers of the same event.

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

CREATE TEMP TRIGGER cassette_messages_journal AFTER INSERT ON main.cassette_messages
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_messages', 'op', 'INSERT', 'key', NEW.message_id,
                           'row', json_object(
                               'message_id', NEW.message_id, 'run_id', NEW.run_id,
                               'source', NEW.source, 'idempotency_key', NEW.idempotency_key,
                               'payload_json', NEW.payload_json, 'created_at', NEW.created_at)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END;

CREATE TEMP TRIGGER cassette_jobs_journal AFTER INSERT ON main.cassette_jobs
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_jobs', 'op', 'INSERT', 'key', NEW.job_id,
                           'row', json_object(
                               'job_id', NEW.job_id, 'message_id', NEW.message_id,
                               'run_id', NEW.run_id, 'intent', NEW.intent,
                               'ordinal', NEW.ordinal, 'created_at', NEW.created_at)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END;

CREATE TEMP TRIGGER cassette_steps_journal AFTER INSERT ON main.cassette_steps
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_steps', 'op', 'INSERT', 'key', NEW.step_id,
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

CREATE TEMP TRIGGER cassette_steps_journal_update AFTER UPDATE ON main.cassette_steps
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

CREATE TEMP TRIGGER cassette_receipts_journal AFTER INSERT ON main.cassette_receipts
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_receipts', 'op', 'INSERT', 'key', NEW.receipt_id,
                           'row', json_object(
                               'receipt_id', NEW.receipt_id, 'step_id', NEW.step_id,
                               'job_id', NEW.job_id, 'run_id', NEW.run_id,
                               'worker_id', NEW.worker_id, 'fencing_token', NEW.fencing_token,
                               'outcome', NEW.outcome, 'receipt_json', NEW.receipt_json,
                               'created_at', NEW.created_at)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END;

CREATE TEMP TRIGGER cassette_releases_journal AFTER INSERT ON main.cassette_releases
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_releases', 'op', 'INSERT', 'key', NEW.release_id,
                           'row', json_object(
                               'release_id', NEW.release_id, 'step_id', NEW.step_id,
                               'run_id', NEW.run_id, 'worker_id', NEW.worker_id,
                               'fencing_token', NEW.fencing_token,
                               'created_at', NEW.created_at)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END;

CREATE TEMP TRIGGER cassette_actions_journal AFTER INSERT ON main.cassette_actions
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_actions', 'op', 'INSERT', 'key', NEW.action_id,
                           'row', json_object(
                               'action_seq', NEW.action_seq, 'action_id', NEW.action_id,
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
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END;

CREATE TEMP TRIGGER cassette_checkpoints_hash_guard BEFORE INSERT ON main.cassette_checkpoints
WHEN NEW.checkpoint_id IS NOT 'cp-' || cassette_sha256_hex(NEW.context_json)
BEGIN
    SELECT RAISE(ABORT, 'CHECKPOINT_MISMATCH: checkpoint_id must be cp- and the SHA-256 of context_json');
END;

CREATE TEMP TRIGGER cassette_checkpoints_journal AFTER INSERT ON main.cassette_checkpoints
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_checkpoints', 'op', 'INSERT',
                           'key', NEW.checkpoint_id,
                           'row', json_object(
                               'checkpoint_seq', NEW.checkpoint_seq,
                               'checkpoint_id', NEW.checkpoint_id, 'plan_id', NEW.plan_id,
                               'context_json', NEW.context_json,
                               'created_at', NEW.created_at)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END;

CREATE TEMP TRIGGER cassette_seals_journal AFTER INSERT ON main.cassette_seals
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_seals', 'op', 'INSERT', 'key', NEW.seal_id,
                           'row', json_object(
                               'seal_id', NEW.seal_id, 'tree_size', NEW.tree_size,
                               'root_hex', NEW.root_hex, 'origin', NEW.origin,
                               'key_id', NEW.key_id, 'note', NEW.note,
                               'created_at', NEW.created_at)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h
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

CREATE TEMP TRIGGER cassette_attestations_journal AFTER INSERT ON main.cassette_attestations
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_attestations', 'op', 'INSERT',
                           'key', NEW.attestation_id,
                           'row', json_object(
                               'attestation_id', NEW.attestation_id, 'act', NEW.act,
                               'run_id', NEW.run_id, 'message_id', NEW.message_id,
                               'step_id', NEW.step_id, 'fencing_token', NEW.fencing_token,
                               'worker_id', NEW.worker_id, 'key_id', NEW.key_id,
                               'signature', NEW.signature,
                               'created_at', NEW.created_at)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h
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
