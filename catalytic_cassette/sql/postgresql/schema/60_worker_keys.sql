-- Worker keys: attestations, the signed statements a worker's key makes about a post, a
-- claim, a completion or a release, bound to the ledger's id. A lease claimed signed must
-- be completed, released or requeued with an attestation (the rules on receipts and
-- releases here; the requeue's in cassette_steps_update, 30_steps.sql).
--   * An attestation is checked by one BEFORE INSERT trigger in the order a SQLite
--     package connection meets the rules for the same row (the clock guard, the insert
--     guard, then NOT NULL and the CHECK constraints in column order), so a row breaking
--     several gets SQLite's code. Its id is the next dense id and created_at the
--     transaction's time (cassette_tx_ms()), as for every row here: a signer reads that
--     time first, in the same transaction (cassette_signer_context()), and names it as
--     the statement's `at`.
--   * A requeue's timing needs the clock: on SQLite a TEMP trigger of package connections
--     checks it; here the server has the clock, so every session is held to it
--     (LEASE_NOT_EXPIRED).
--   * The SIGNATURE_REQUIRED guards of receipts and releases fire after the table's own
--     checks (triggers of one event fire in name order: *_insert before *_signature), so
--     a stale or wrong worker still gets its own code, as on SQLite.
--   * cassette_worker attests through cassette_attest(), then acts through the step
--     functions in the same transaction; no role gets a table write privilege.
-- As on SQLite, SQL cannot check an Ed25519 signature: only its shape. Whether it is
-- genuine, and by the key pinned for its worker, is `verify --worker-keys DIR`.

CREATE TABLE cassette_attestations (
    attestation_id bigint PRIMARY KEY CHECK (attestation_id > 0),
    act text NOT NULL,
    run_id text NOT NULL,
    message_id bigint,
    step_id bigint,
    fencing_token bigint,
    worker_id text NOT NULL,
    key_id text NOT NULL,
    signature text NOT NULL,
    created_at bigint NOT NULL
);

CREATE INDEX cassette_attestations_by_message ON cassette_attestations (message_id);

-- Every guard below looks attestations up by step and token (or by message).
CREATE INDEX cassette_attestations_by_step
    ON cassette_attestations (step_id, fencing_token, act, worker_id);

-- Record a signed statement of an act the caller makes next in this transaction; its
-- attestation_id. The triggers hold the law; the signature is verify's to check.
CREATE FUNCTION cassette_attest(p_act text, p_run_id text, p_message_id bigint, p_step_id bigint,
                                p_fencing_token bigint, p_worker_id text, p_key_id text,
                                p_signature text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET standard_conforming_strings = on
SET extra_float_digits = 1
SET bytea_output = 'hex'
SET enable_seqscan = off
SET jit = off AS $$
DECLARE
    made bigint;
BEGIN
    PERFORM cassette_tx_ms();
    INSERT INTO cassette_attestations (act, run_id, message_id, step_id, fencing_token,
                                       worker_id, key_id, signature, created_at)
    VALUES (p_act, p_run_id, p_message_id, p_step_id, p_fencing_token, p_worker_id, p_key_id,
            p_signature, 0)
    RETURNING attestation_id INTO made;
    RETURN made;
END $$;

CREATE FUNCTION cassette_attested(p_step_id bigint, p_token bigint, p_act text,
                                  p_worker text, p_key_id text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM cassette_attestations a
                    WHERE a.step_id = p_step_id AND a.fencing_token = p_token AND a.act = p_act
                      AND (p_worker IS NULL OR a.worker_id = p_worker)
                      AND (p_key_id IS NULL OR a.key_id = p_key_id))
$$;

-- Whether the step's lease at this token was claimed signed by its owner: the claim
-- attestation's key_id, or NULL.
CREATE FUNCTION cassette_signed_claim(p_step_id bigint, p_token bigint, p_owner text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT c.key_id FROM cassette_attestations c
     WHERE c.step_id = p_step_id AND c.fencing_token = p_token
       AND c.act = 'claim' AND c.worker_id = p_owner
     LIMIT 1
$$;

-- What a signing worker names in its statements, read first in the transaction that
-- then attests and acts: the transaction's time, taking the head (cassette_tx_ms(); every
-- row of the transaction is dated with it: the statement's `at`), and the ledger's id,
-- read after the head is taken (a volatile function's statements see what committed
-- before them), so it is the id the ledger keeps.
CREATE FUNCTION cassette_signer_context(OUT now_ms bigint, OUT ledger_id text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET standard_conforming_strings = on
SET extra_float_digits = 1
SET bytea_output = 'hex' AS $$
BEGIN
    now_ms := cassette_tx_ms();
    SELECT value INTO ledger_id FROM cassette_meta WHERE key = 'ledger_id';
END $$;

-- An attestation names an act its worker may do now: one message that does not exist
-- yet, or a step in the state the act needs, with the token the act will carry.
CREATE FUNCTION cassette_attestations_insert() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
DECLARE
    given bigint := NEW.attestation_id;
    next_id bigint;
    step cassette_steps;
BEGIN
    NEW.created_at := cassette_tx_ms();  -- first: the head's lock makes max() the last id
    next_id := (SELECT coalesce(max(attestation_id), 0) + 1 FROM cassette_attestations);
    NEW.attestation_id := next_id;
    -- SQLite: the package's TEMP cassette_attestations_clock_guard (TEMP triggers fire
    -- first there); here for every session
    IF NEW.act = 'requeue' AND EXISTS (
        SELECT 1 FROM cassette_steps s
         WHERE s.step_id = NEW.step_id AND s.status = 'LEASED'
           AND s.fencing_token = NEW.fencing_token AND s.lease_expires_at > NEW.created_at) THEN
        PERFORM cassette_refuse('LEASE_NOT_EXPIRED: a requeue is attested only after the lease expired');
    END IF;
    -- SQLite: cassette_attestations_insert_guard
    IF NEW.act IS NULL OR NEW.act NOT IN ('post', 'claim', 'release', 'complete', 'requeue') THEN
        PERFORM cassette_refuse('INVALID_ATTESTATION: act is post, claim, release, complete or requeue');
    END IF;
    IF NOT cassette_name_ok(NEW.worker_id) THEN
        PERFORM cassette_refuse('INVALID_WORKER: worker_id is a string of 1-200 characters');
    END IF;
    IF EXISTS (SELECT 1 FROM cassette_attestations WHERE attestation_id = given) THEN
        PERFORM cassette_refuse('APPEND_ONLY: an attestation with this attestation_id exists');
    END IF;
    IF given IS NOT NULL AND given IS DISTINCT FROM next_id THEN
        PERFORM cassette_refuse('OUT_OF_ORDER: attestation ids are given in order without gaps');
    END IF;
    IF EXISTS (SELECT 1 FROM cassette_attestations
               WHERE act = NEW.act AND message_id = NEW.message_id)
       OR EXISTS (SELECT 1 FROM cassette_attestations
                  WHERE step_id = NEW.step_id AND fencing_token = NEW.fencing_token
                    AND act = NEW.act AND worker_id = NEW.worker_id) THEN
        PERFORM cassette_refuse('APPEND_ONLY: this act is already attested');
    END IF;
    -- a post is attested before its message is inserted, under the next message_id
    IF NEW.act = 'post' AND (NEW.message_id IS NULL
            OR EXISTS (SELECT 1 FROM cassette_messages WHERE message_id >= NEW.message_id)) THEN
        PERFORM cassette_refuse('OUT_OF_ORDER: a post is attested before its message, under the next message_id');
    END IF;
    IF NEW.act IS DISTINCT FROM 'post' THEN
        SELECT * INTO step FROM cassette_steps WHERE step_id = NEW.step_id;
        IF NOT FOUND THEN
            PERFORM cassette_refuse('STEP_NOT_FOUND: the attested step does not exist');
        END IF;
        IF NEW.run_id IS DISTINCT FROM step.run_id THEN
            PERFORM cassette_refuse('RUN_MISMATCH: the step belongs to another run');
        END IF;
        IF NEW.act = 'claim' AND step.status IS DISTINCT FROM 'PENDING' THEN
            PERFORM cassette_refuse('INVALID_ATTESTATION: a claim is attested for a PENDING step');
        END IF;
        IF NEW.act = 'claim' AND NEW.fencing_token IS DISTINCT FROM step.fencing_token + 1 THEN
            PERFORM cassette_refuse('STALE_FENCING_TOKEN: a claim is attested with the step''s next token');
        END IF;
        IF NEW.act IN ('release', 'complete', 'requeue') AND step.status IS DISTINCT FROM 'LEASED' THEN
            PERFORM cassette_refuse('NOT_LEASED: only a LEASED step is released, completed or requeued');
        END IF;
        IF NEW.act IN ('release', 'complete', 'requeue')
           AND NEW.fencing_token IS DISTINCT FROM step.fencing_token THEN
            PERFORM cassette_refuse('STALE_FENCING_TOKEN: the token is not the step''s current token');
        END IF;
        IF NEW.act IN ('release', 'complete') AND NEW.worker_id IS DISTINCT FROM step.lease_owner THEN
            PERFORM cassette_refuse('WRONG_WORKER: only the lease owner releases or completes a step');
        END IF;
    END IF;
    -- NOT NULL, then the CHECK constraints in column order
    IF NEW.act IS NULL OR NEW.run_id IS NULL OR NEW.worker_id IS NULL OR NEW.key_id IS NULL
       OR NEW.signature IS NULL THEN
        PERFORM cassette_refuse('CONSTRAINT_VIOLATION: NOT NULL constraint failed: cassette_attestations');
    END IF;
    IF given <= 0 THEN
        PERFORM cassette_refuse('INVALID_ID: attestation_id is a positive integer');
    END IF;
    IF NOT cassette_name_ok(NEW.run_id) THEN
        PERFORM cassette_refuse('INVALID_RUN_ID: run_id is a string of 1-200 characters');
    END IF;
    IF NEW.key_id !~ '^[0-9a-f]{16}$' THEN
        PERFORM cassette_refuse('INVALID_ATTESTATION: key_id is 16 lowercase hex digits');
    END IF;
    IF NEW.signature !~ '^[A-Za-z0-9+/]{86}==$' THEN
        PERFORM cassette_refuse('INVALID_ATTESTATION: signature is 64 bytes in base64');
    END IF;
    IF (NEW.act = 'post'
        AND (NEW.message_id IS NULL OR NEW.step_id IS NOT NULL OR NEW.fencing_token IS NOT NULL))
       OR (NEW.act <> 'post'
           AND (NEW.message_id IS NOT NULL OR NEW.step_id IS NULL OR NEW.fencing_token IS NULL)) THEN
        PERFORM cassette_refuse('INVALID_ATTESTATION: a post names its message, any other act a step and a token');
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION cassette_attestations_journal() RETURNS trigger
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
BEGIN
    PERFORM cassette_journal_append(TG_TABLE_NAME, TG_OP, cassette_j(NEW.attestation_id),
        '{"attestation_id":' || cassette_j(NEW.attestation_id) || ',"act":' || cassette_j(NEW.act)
        || ',"run_id":' || cassette_j(NEW.run_id) || ',"message_id":' || cassette_j(NEW.message_id)
        || ',"step_id":' || cassette_j(NEW.step_id) || ',"fencing_token":' || cassette_j(NEW.fencing_token)
        || ',"worker_id":' || cassette_j(NEW.worker_id) || ',"key_id":' || cassette_j(NEW.key_id)
        || ',"signature":' || cassette_j(NEW.signature) || ',"created_at":' || cassette_j(NEW.created_at) || '}');
    RETURN NULL;
END $$;

-- A lease claimed signed is completed only with its worker's attestation of the
-- completion (one statement of the trigger, one cached plan).
CREATE FUNCTION cassette_receipts_signature() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
DECLARE
    claim_key text;
BEGIN
    SELECT c.key_id INTO claim_key FROM cassette_attestations c
     WHERE c.step_id = NEW.step_id AND c.fencing_token = NEW.fencing_token
       AND c.act = 'claim' AND c.worker_id = NEW.worker_id
     LIMIT 1;
    IF claim_key IS NOT NULL
       AND NOT cassette_attested(NEW.step_id, NEW.fencing_token, 'complete', NEW.worker_id, claim_key)
       AND NOT (NEW.outcome = 'ABORTED'
                AND cassette_attested(NEW.step_id, NEW.fencing_token, 'requeue', NULL, NULL)) THEN
        PERFORM cassette_refuse('SIGNATURE_REQUIRED: this lease was claimed signed; its worker must attest the completion');
    END IF;
    RETURN NEW;
END $$;

-- A release of a signed lease needs its worker's attested release under the same key.
CREATE FUNCTION cassette_releases_signature() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
DECLARE
    claim_key text := cassette_signed_claim(NEW.step_id, NEW.fencing_token, NEW.worker_id);
BEGIN
    IF claim_key IS NOT NULL
       AND NOT cassette_attested(NEW.step_id, NEW.fencing_token, 'release', NEW.worker_id, claim_key) THEN
        PERFORM cassette_refuse('SIGNATURE_REQUIRED: this lease was claimed signed; its worker must attest the release');
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER cassette_attestations_insert BEFORE INSERT ON cassette_attestations
    FOR EACH ROW EXECUTE FUNCTION cassette_attestations_insert();

CREATE TRIGGER cassette_attestations_journal AFTER INSERT ON cassette_attestations
    FOR EACH ROW EXECUTE FUNCTION cassette_attestations_journal();

CREATE TRIGGER cassette_attestations_no_change BEFORE UPDATE OR DELETE ON cassette_attestations
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_attestations_no_truncate BEFORE TRUNCATE ON cassette_attestations
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_receipts_signature BEFORE INSERT ON cassette_receipts
    FOR EACH ROW EXECUTE FUNCTION cassette_receipts_signature();

CREATE TRIGGER cassette_releases_signature BEFORE INSERT ON cassette_releases
    FOR EACH ROW EXECUTE FUNCTION cassette_releases_signature();
