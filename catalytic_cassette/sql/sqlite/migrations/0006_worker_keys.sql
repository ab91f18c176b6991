-- 0006: worker keys. A worker holding an Ed25519 key attests its posts, claims, releases
-- and completions (and anyone's requeue of its expired lease) with a signed statement,
-- recorded here *before* the act's own row, in the same transaction. LAW.md, "Worker
-- keys", gives the statement's bytes.
--
-- SQL cannot check an Ed25519 signature without a registered function, and a guard
-- must not call one (a raw connection would then fail before any guard named its
-- rule). So the rules below check only what is visible without cryptography: that an
-- attestation names an act that is possible now, and that a signed lease is ended only
-- by its own worker's attested act (or an attested requeue). Whether each signature is
-- genuine, and made by the key pinned for its worker, is `verify --worker-keys DIR`.

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

-- Every guard below looks attestations up by step and token (or by message).
CREATE INDEX cassette_attestations_by_step
    ON cassette_attestations (step_id, fencing_token, act, worker_id);
CREATE INDEX cassette_attestations_by_message ON cassette_attestations (message_id);

CREATE TRIGGER cassette_attestations_no_update BEFORE UPDATE ON cassette_attestations
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_attestations rows cannot be updated'); END;
CREATE TRIGGER cassette_attestations_no_delete BEFORE DELETE ON cassette_attestations
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_attestations rows cannot be deleted'); END;

-- An attestation names an act its worker may do now: one message that does not exist
-- yet, or a step in the state the act needs, with the token the act will carry.
-- Ids are given explicitly and dense (1, 2, 3, ...): a gap or a reuse is refused.
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

-- A receipt for a lease whose claim its worker attested needs that worker's attested
-- completion under the same key; an ABORTED receipt may instead follow an attested
-- requeue (max attempts reached after expiry, LAW.md section 4). The WHEN clause lets
-- every older rule name its own code first: this fires only on a receipt they accept.
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

-- A signed lease goes back to PENDING only by its worker's (attested) release or by an
-- attested requeue. Expiry needs the clock, so the requeue's timing is checked by a
-- TEMP trigger on package connections and by verify --worker-keys.
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

CREATE TRIGGER cassette_attestations_journaled AFTER INSERT ON cassette_attestations
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal INDEXED BY cassette_journal_by_row
                 WHERE tbl = 'cassette_attestations' AND row_key = +NEW.attestation_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

-- Attestations are dated like every ledger row (0005, "ledger time"): never before the
-- ledger's latest time, and part of it.
CREATE TRIGGER cassette_attestations_time AFTER INSERT ON cassette_attestations
WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999
  OR NEW.created_at < (SELECT ms FROM cassette_ledger_time) OR NEW.created_at < (SELECT created_at FROM cassette_attestations NOT INDEXED WHERE attestation_id = NEW.attestation_id - 1)
BEGIN
    SELECT RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
    WHERE typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999;
    SELECT RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time');
END;

DROP VIEW cassette_ledger_time;
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

-- This migration records itself, once (see 0005).
DROP TRIGGER cassette_migrations_insert_guard;
CREATE TRIGGER cassette_migrations_insert_guard BEFORE INSERT ON cassette_migrations
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be replaced')
    WHERE EXISTS (SELECT 1 FROM cassette_migrations WHERE version = NEW.version);
    SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: only a cassette connection migrates the ledger')
    WHERE NOT EXISTS (SELECT 1 FROM pragma_function_list WHERE name = 'cassette_chain_hash');
    SELECT RAISE(ABORT, 'MIGRATION_FAILED: only the migration being applied records itself')
    WHERE NEW.version IS NOT 6 OR NEW.name IS NOT 'worker_keys'
       OR typeof(NEW.sha256) IS NOT 'text' OR length(NEW.sha256) IS NOT 64
       OR NEW.sha256 GLOB '*[^0-9a-f]*';
END;
