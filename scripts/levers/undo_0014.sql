-- Puts back what PostgreSQL migration 0014 replaced (the definitions of 0013), on a ledger
-- migrated to 0014: scripts/bench_pg_levers.py ab measures 0014 against its absence in one
-- run (docs/BENCHMARKS.md, "Issue 15: server CPU per step"). Made from a ledger migrated
-- at 0f13ee5 with pg_get_functiondef and pg_get_triggerdef; only for benchmarks.
CREATE OR REPLACE FUNCTION public.cassette_run_has_pending(p_run_id text)
 RETURNS boolean
 LANGUAGE sql
 STABLE
 SET search_path TO 'public', 'pg_temp'
AS $function$
    SELECT EXISTS (SELECT 1 FROM cassette_steps s WHERE s.run_id = p_run_id AND s.status = 'PENDING')
$function$

;
CREATE OR REPLACE FUNCTION public.cassette_claim(p_run_id text, p_worker_id text, p_n integer, p_ttl_ms bigint)
 RETURNS TABLE(step_id bigint, job_id bigint, message_id bigint, ordinal bigint, payload_json text, fencing_token bigint, lease_expires_at bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
 SET standard_conforming_strings TO 'on'
 SET extra_float_digits TO '1'
 SET bytea_output TO 'hex'
AS $function$
DECLARE
    now_ms bigint;
BEGIN
    IF p_n IS NULL OR p_n < 1 THEN
        RAISE EXCEPTION 'INVALID_ARGUMENT: n must be at least 1';
    END IF;
    IF p_ttl_ms IS NULL OR p_ttl_ms < 1 OR p_ttl_ms > 2592000000 THEN
        RAISE EXCEPTION 'INVALID_TTL: a lease lasts 1 ms to 30 days';
    END IF;
    IF cassette_noop_without_head() AND NOT cassette_run_has_pending(p_run_id) THEN
        RETURN;  -- nothing to claim
    END IF;
    now_ms := cassette_tx_ms();
    -- One row at a time, in claim order: the journal then holds the leases in that order.
    FOR step_id IN
        SELECT s.step_id FROM cassette_steps s
        WHERE s.run_id = p_run_id AND s.status = 'PENDING'
        ORDER BY s.message_id, s.job_ordinal, s.ordinal
        LIMIT p_n FOR UPDATE SKIP LOCKED
    LOOP
        UPDATE cassette_steps s
           SET status = 'LEASED', lease_owner = p_worker_id, lease_expires_at = now_ms + p_ttl_ms,
               fencing_token = s.fencing_token + 1
         WHERE s.step_id = cassette_claim.step_id
        RETURNING s.job_id, s.message_id, s.ordinal, s.payload_json, s.fencing_token, s.lease_expires_at
        INTO job_id, message_id, ordinal, payload_json, fencing_token, lease_expires_at;
        RETURN NEXT;
    END LOOP;
END $function$

;
ALTER TABLE cassette_head RESET (fillfactor);
DROP TRIGGER cassette_head_guard_update ON cassette_head; DROP TRIGGER cassette_head_guard ON cassette_head;
CREATE TRIGGER cassette_head_guard BEFORE INSERT OR DELETE OR UPDATE ON public.cassette_head FOR EACH ROW EXECUTE FUNCTION cassette_head_guard();
ALTER FUNCTION cassette_claim(text, text, integer, bigint) RESET enable_seqscan;
ALTER FUNCTION cassette_claim(text, text, integer, bigint) RESET jit;
ALTER FUNCTION cassette_complete(text, bigint, text, bigint, text, text) RESET enable_seqscan;
ALTER FUNCTION cassette_complete(text, bigint, text, bigint, text, text) RESET jit;
ALTER FUNCTION cassette_release(text, bigint, text, bigint) RESET enable_seqscan;
ALTER FUNCTION cassette_release(text, bigint, text, bigint) RESET jit;
ALTER FUNCTION cassette_requeue(text, bigint, bigint) RESET enable_seqscan;
ALTER FUNCTION cassette_requeue(text, bigint, bigint) RESET jit;
ALTER FUNCTION cassette_post(text, text, text, text, text[], integer[], text[]) RESET enable_seqscan;
ALTER FUNCTION cassette_post(text, text, text, text, text[], integer[], text[]) RESET jit;
ALTER FUNCTION cassette_posted_under_key(text, text, text, text) RESET enable_seqscan;
ALTER FUNCTION cassette_posted_under_key(text, text, text, text) RESET jit;
ALTER FUNCTION cassette_run_has_pending(text) RESET enable_seqscan;
ALTER FUNCTION cassette_run_has_pending(text) RESET jit;
ALTER FUNCTION cassette_save_checkpoint(text, text, text) RESET enable_seqscan;
ALTER FUNCTION cassette_save_checkpoint(text, text, text) RESET jit;
ALTER FUNCTION cassette_append_action(text, text, text, text, text, text, text, text, text, text,
                                      text, bigint, text, bigint, bigint, text, text, text, text) RESET enable_seqscan;
ALTER FUNCTION cassette_append_action(text, text, text, text, text, text, text, text, text, text,
                                      text, bigint, text, bigint, bigint, text, text, text, text) RESET jit;
ALTER FUNCTION cassette_attest(text, text, bigint, bigint, bigint, text, text, text) RESET enable_seqscan;
ALTER FUNCTION cassette_attest(text, text, bigint, bigint, bigint, text, text, text) RESET jit;
ALTER FUNCTION cassette_journal_append(text, text, text, text, text) RESET enable_seqscan;
ALTER FUNCTION cassette_journal_append(text, text, text, text, text) RESET jit;
ALTER FUNCTION cassette_journal_guard() RESET enable_seqscan;
ALTER FUNCTION cassette_journal_guard() RESET jit;
ALTER FUNCTION cassette_run_has_lease_due(text) RESET enable_seqscan;
ALTER FUNCTION cassette_run_has_lease_due(text) RESET jit;
ALTER FUNCTION cassette_releases_signature() RESET enable_seqscan;
ALTER FUNCTION cassette_releases_signature() RESET jit;
ALTER FUNCTION cassette_head_guard() RESET enable_seqscan;
ALTER FUNCTION cassette_head_guard() RESET jit;
ALTER FUNCTION cassette_messages_insert() RESET enable_seqscan;
ALTER FUNCTION cassette_messages_insert() RESET jit;
ALTER FUNCTION cassette_jobs_insert() RESET enable_seqscan;
ALTER FUNCTION cassette_jobs_insert() RESET jit;
ALTER FUNCTION cassette_steps_insert() RESET enable_seqscan;
ALTER FUNCTION cassette_steps_insert() RESET jit;
ALTER FUNCTION cassette_steps_update() RESET enable_seqscan;
ALTER FUNCTION cassette_steps_update() RESET jit;
ALTER FUNCTION cassette_steps_update_signature() RESET enable_seqscan;
ALTER FUNCTION cassette_steps_update_signature() RESET jit;
ALTER FUNCTION cassette_receipts_insert() RESET enable_seqscan;
ALTER FUNCTION cassette_receipts_insert() RESET jit;
ALTER FUNCTION cassette_receipts_signature() RESET enable_seqscan;
ALTER FUNCTION cassette_receipts_signature() RESET jit;
ALTER FUNCTION cassette_receipts_commit_step() RESET enable_seqscan;
ALTER FUNCTION cassette_receipts_commit_step() RESET jit;
ALTER FUNCTION cassette_releases_requeue_step() RESET enable_seqscan;
ALTER FUNCTION cassette_releases_requeue_step() RESET jit;
ALTER FUNCTION cassette_releases_insert() RESET enable_seqscan;
ALTER FUNCTION cassette_releases_insert() RESET jit;
ALTER FUNCTION cassette_attestations_insert() RESET enable_seqscan;
ALTER FUNCTION cassette_attestations_insert() RESET jit;
ALTER FUNCTION cassette_actions_insert() RESET enable_seqscan;
ALTER FUNCTION cassette_actions_insert() RESET jit;
ALTER FUNCTION cassette_checkpoints_insert() RESET enable_seqscan;
ALTER FUNCTION cassette_checkpoints_insert() RESET jit;
CREATE OR REPLACE FUNCTION public.cassette_complete(p_run_id text, p_step_id bigint, p_worker_id text, p_fencing_token bigint, p_outcome text, p_receipt_json text)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
 SET standard_conforming_strings TO 'on'
 SET extra_float_digits TO '1'
 SET bytea_output TO 'hex'
AS $function$
DECLARE
    made bigint;
BEGIN
    PERFORM cassette_tx_ms();
    INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id, fencing_token, outcome, receipt_json)
    SELECT s.step_id, s.job_id, p_run_id, p_worker_id, p_fencing_token, p_outcome, p_receipt_json
    FROM cassette_steps s WHERE s.step_id = p_step_id
    RETURNING receipt_id INTO made;
    IF made IS NULL THEN
        RAISE EXCEPTION 'STEP_NOT_FOUND: no step %', p_step_id;
    END IF;
    RETURN made;
END $function$

;
CREATE OR REPLACE FUNCTION public.cassette_steps_update()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    now_ms bigint := cassette_tx_ms();
BEGIN
    IF NEW.status IS NULL OR NEW.status NOT IN ('PENDING', 'LEASED', 'COMMITTED') THEN
        PERFORM cassette_refuse('INVALID_STATUS: status is PENDING, LEASED or COMMITTED');
    END IF;
    IF NEW.fencing_token IS NULL OR NEW.fencing_token < 0 THEN
        PERFORM cassette_refuse('INVALID_TOKEN: a fencing token is a non-negative integer');
    END IF;
    IF NEW.step_id IS DISTINCT FROM OLD.step_id OR NEW.job_id IS DISTINCT FROM OLD.job_id
       OR NEW.run_id IS DISTINCT FROM OLD.run_id OR NEW.message_id IS DISTINCT FROM OLD.message_id
       OR NEW.job_ordinal IS DISTINCT FROM OLD.job_ordinal OR NEW.ordinal IS DISTINCT FROM OLD.ordinal
       OR NEW.payload_json IS DISTINCT FROM OLD.payload_json OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        PERFORM cassette_refuse('IMMUTABLE_FIELD: only status, lease fields and fencing_token of a step change');
    END IF;
    IF NEW.status = OLD.status AND (NEW.lease_owner IS DISTINCT FROM OLD.lease_owner
        OR NEW.lease_expires_at IS DISTINCT FROM OLD.lease_expires_at
        OR NEW.fencing_token IS DISTINCT FROM OLD.fencing_token) THEN
        PERFORM cassette_refuse('LEASE_FIELDS_LOCKED: lease fields change only with a claim or a requeue');
    END IF;
    IF NOT ((OLD.status = 'PENDING' AND NEW.status = 'LEASED')
            OR (OLD.status = 'LEASED' AND NEW.status = 'COMMITTED')
            OR (OLD.status = 'LEASED' AND NEW.status = 'PENDING')) THEN
        PERFORM cassette_refuse('ILLEGAL_TRANSITION: allowed are PENDING->LEASED, LEASED->COMMITTED, LEASED->PENDING');
    END IF;
    IF OLD.status = 'PENDING' THEN
        IF NOT cassette_name_ok(NEW.lease_owner) OR NEW.lease_expires_at IS NULL
           OR NEW.fencing_token IS DISTINCT FROM OLD.fencing_token + 1 THEN
            PERFORM cassette_refuse('LEASE_FIELDS_LOCKED: a claim sets lease_owner and lease_expires_at and adds 1 to the token');
        END IF;
        IF NEW.lease_expires_at <= now_ms THEN
            PERFORM cassette_refuse('INVALID_TTL: a lease must expire in the future');
        END IF;
        IF NEW.lease_expires_at > now_ms + 2592000000 THEN
            PERFORM cassette_refuse('INVALID_TTL: a lease may last at most 30 days');
        END IF;
    ELSIF NEW.status = 'PENDING' THEN
        IF NEW.lease_owner IS NOT NULL OR NEW.lease_expires_at IS NOT NULL
           OR NEW.fencing_token IS DISTINCT FROM OLD.fencing_token THEN
            PERFORM cassette_refuse('LEASE_FIELDS_LOCKED: a requeue clears the lease and keeps the token');
        END IF;
        IF OLD.lease_expires_at > now_ms AND NOT EXISTS (
            SELECT 1 FROM cassette_releases
            WHERE step_id = OLD.step_id AND fencing_token = OLD.fencing_token) THEN
            PERFORM cassette_refuse('LEASE_NOT_EXPIRED: only an expired or released lease is requeued');
        END IF;
    ELSE
        IF NEW.lease_owner IS DISTINCT FROM OLD.lease_owner
           OR NEW.lease_expires_at IS DISTINCT FROM OLD.lease_expires_at
           OR NEW.fencing_token IS DISTINCT FROM OLD.fencing_token THEN
            PERFORM cassette_refuse('LEASE_FIELDS_LOCKED: committing keeps the lease fields and the token');
        END IF;
        IF NOT EXISTS (SELECT 1 FROM cassette_receipts r WHERE r.step_id = OLD.step_id
                       AND r.fencing_token = OLD.fencing_token AND r.worker_id = OLD.lease_owner) THEN
            PERFORM cassette_refuse('RECEIPT_REQUIRED: a step is committed only by inserting its receipt');
        END IF;
    END IF;
    RETURN NEW;
END $function$

;
DROP TRIGGER cassette_steps_update_signature ON cassette_steps;
CREATE TRIGGER cassette_steps_update_signature BEFORE UPDATE ON public.cassette_steps FOR EACH ROW EXECUTE FUNCTION cassette_steps_update_signature();
