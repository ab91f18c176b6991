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

-- ==== TEMP: installed on every package connection, not kept in the file ====

-- A requeue is attested only once the lease it ends has expired (the transaction's time,
-- 30_steps.sql); then the attestations' journal trigger.

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
-- (only a row its NOT NULL and CHECK constraints will take: 50_journal.sql, TEMP section)
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
