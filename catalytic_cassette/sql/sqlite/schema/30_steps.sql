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

-- ==== TEMP: installed on every package connection, not kept in the file ====

-- Clock rules. "Now" is the transaction's time, cassette_transaction_ms(): the later of the
-- writer's clock and the latest time the ledger has recorded (the cassette_ledger_time
-- view), read once per write transaction of the package before it writes, so time never
-- runs back and every check of one transaction uses the same now. (A guard that evaluated
-- the view, nine table probes, in each check would pay for it on every row: SQLite sizes
-- and zeroes a trigger's frame by its whole program on every row it fires on.)
-- A lease lasts more than 0 ms and at most 30 days (against the writer's clock here, the ledger's in the rules); only an expired or
-- released lease is requeued; a receipt after expiry is only ABORTED.
-- Then the journal triggers of steps, receipts and releases (the encoding: 50_journal.sql,
-- TEMP section).

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

CREATE TEMP TRIGGER cassette_steps_journal BEFORE INSERT ON main.cassette_steps
-- (only a row its NOT NULL and CHECK constraints will take: 50_journal.sql, TEMP section)
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
-- (only a row its NOT NULL and CHECK constraints will take: 50_journal.sql, TEMP section)
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

CREATE TEMP TRIGGER cassette_receipts_journal BEFORE INSERT ON main.cassette_receipts
-- (only a row its NOT NULL and CHECK constraints will take: 50_journal.sql, TEMP section)
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
-- (only a row its NOT NULL and CHECK constraints will take: 50_journal.sql, TEMP section)
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
