-- Puts back what PostgreSQL migration 0017 replaced, on a ledger migrated to 0017: the
-- head's copy of the journal's end (next_seq, chain_hash) with its deferred follower and
-- cassette.tail, the claim's plan made per call, and the requeue's signature check as a
-- trigger of its own. The definitions as 0016 left them; only for benchmarks:
-- scripts/bench_pg_levers.py ab measures 0017 against its absence in one run
-- (docs/BENCHMARKS.md, "Issue 15: the head as a lock and a clock").
ALTER TABLE cassette_head ADD COLUMN next_seq bigint, ADD COLUMN chain_hash bytea;
UPDATE cassette_head
   SET next_seq = coalesce((SELECT seq + 1 FROM cassette_journal ORDER BY seq DESC LIMIT 1), 0),
       chain_hash = coalesce((SELECT j.chain_hash FROM cassette_journal j ORDER BY j.seq DESC LIMIT 1),
                             '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea);
ALTER TABLE cassette_head ALTER COLUMN next_seq SET NOT NULL, ALTER COLUMN chain_hash SET NOT NULL,
    ADD CHECK (next_seq >= 0), ADD CHECK (length(chain_hash) = 32);
ALTER FUNCTION cassette_claim(text, text, integer, bigint) RESET plan_cache_mode;
DROP TRIGGER cassette_head_guard_update ON cassette_head;
CREATE OR REPLACE FUNCTION public.cassette_head_follow()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    tail text := current_setting('cassette.tail', true);
BEGIN
    IF NEW.seq < (SELECT next_seq FROM cassette_head) THEN
        RETURN NULL;  -- an earlier firing of this transaction has moved the head past it
    END IF;
    IF cassette_tail_malformed(tail) THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: cassette.tail is not a transaction, a seq and a chain hash';
    END IF;
    IF split_part(tail, ':', 1) = pg_current_xact_id()::text
       AND split_part(tail, ':', 2)::bigint >= NEW.seq THEN
        UPDATE cassette_head SET next_seq = split_part(tail, ':', 2)::bigint + 1,
                                 chain_hash = decode(split_part(tail, ':', 3), 'hex');
    ELSE  -- an entry not written by cassette_journal_append: one entry at a time
        UPDATE cassette_head SET next_seq = NEW.seq + 1, chain_hash = NEW.chain_hash;
    END IF;
    RETURN NULL;
END $function$
;
CREATE OR REPLACE FUNCTION public.cassette_head_guard()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    IF TG_OP = 'DELETE' OR TG_OP = 'INSERT' THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: the journal head is one row, never inserted or deleted';
    END IF;
    IF (NEW.next_seq IS DISTINCT FROM OLD.next_seq OR NEW.chain_hash IS DISTINCT FROM OLD.chain_hash)
       AND (NEW.next_seq < OLD.next_seq
            OR NEW.chain_hash IS DISTINCT FROM
               (SELECT chain_hash FROM cassette_journal WHERE seq = NEW.next_seq - 1)
            OR EXISTS (SELECT 1 FROM cassette_journal WHERE seq = NEW.next_seq)) THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: the head moves only forward, to the journal''s last entry';
    END IF;
    IF NEW.tx IS DISTINCT FROM OLD.tx AND NEW.tx IS DISTINCT FROM pg_current_xact_id() THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: the head is stamped only by the transaction that takes it';
    END IF;
    IF NEW.time_ms < OLD.time_ms THEN
        RAISE EXCEPTION 'TIME_BACKWARDS: the ledger''s time never runs back';
    END IF;
    IF NEW.clock_offset_ms < OLD.clock_offset_ms THEN
        RAISE EXCEPTION 'TIME_BACKWARDS: the clock offset only moves forward';
    END IF;
    RETURN NEW;
END $function$
;
CREATE OR REPLACE FUNCTION public.cassette_journal_guard()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    last_seq bigint;
    last_chain bytea;
    leaf bytea;
    chain bytea;
BEGIN
    IF (SELECT tx FROM cassette_head) IS DISTINCT FROM pg_current_xact_id() THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: entries are appended by the journal''s triggers only';
    END IF;
    SELECT j.seq, j.chain_hash INTO last_seq, last_chain
      FROM cassette_journal j ORDER BY j.seq DESC LIMIT 1;
    IF NOT FOUND THEN
        last_seq := -1;
        last_chain := '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea;
    END IF;
    IF NEW.seq IS DISTINCT FROM last_seq + 1 AND NEW.seq IS NOT NULL THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: entries are appended by the journal''s triggers only';
    END IF;
    leaf := sha256('\x00'::bytea || convert_to(NEW.body, 'UTF8'));
    chain := sha256('\x02'::bytea || int8send(last_seq + 1) || last_chain || leaf);
    IF (NEW.leaf_hash IS NOT NULL AND NEW.leaf_hash IS DISTINCT FROM leaf)
       OR (NEW.chain_hash IS NOT NULL AND NEW.chain_hash IS DISTINCT FROM chain) THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: an entry''s leaf and chain hashes are computed from its body';
    END IF;
    NEW.seq := last_seq + 1;
    NEW.leaf_hash := leaf;
    NEW.chain_hash := chain;
    -- For the follower at the commit (it moves the head to the transaction's last entry);
    -- if the INSERT fails, its (sub)transaction and the setting go with it.
    PERFORM set_config('cassette.tail',
                       pg_current_xact_id()::text || ':' || NEW.seq || ':' || encode(chain, 'hex'), true);
    RETURN NEW;
END $function$
;
CREATE OR REPLACE FUNCTION public.cassette_steps_update()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    now_ms bigint;
BEGIN
    -- A claim and a requeue are judged at the transaction's time, and take the head. A
    -- commit is not: it comes from its receipt's insert, which took the head (and an
    -- UPDATE by hand without a receipt is refused below; the journal's append refuses
    -- an entry of a transaction without the head either way).
    IF OLD.status IS DISTINCT FROM 'LEASED' OR NEW.status IS DISTINCT FROM 'COMMITTED' THEN
        now_ms := cassette_tx_ms();
    END IF;
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
CREATE OR REPLACE FUNCTION public.cassette_steps_update_signature()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    IF OLD.status = 'LEASED' AND NEW.status = 'PENDING'
       AND cassette_signed_claim(OLD.step_id, OLD.fencing_token, OLD.lease_owner) IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM cassette_releases r
                       WHERE r.step_id = OLD.step_id AND r.fencing_token = OLD.fencing_token)
       AND NOT cassette_attested(OLD.step_id, OLD.fencing_token, 'requeue', NULL, NULL) THEN
        PERFORM cassette_refuse('SIGNATURE_REQUIRED: this lease was claimed signed; a requeue must be attested');
    END IF;
    RETURN NEW;
END $function$
;
CREATE OR REPLACE FUNCTION public.cassette_tail_malformed(tail text)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT coalesce(tail, '') <> ''
           AND NOT (tail ~ '^[0-9]+:(0|[1-9][0-9]*):[0-9a-f]+$'
                    AND length(split_part(tail, ':', 1)) <= 20
                    AND length(split_part(tail, ':', 2)) <= 18
                    AND length(split_part(tail, ':', 3)) = 64)
$function$
;
CREATE CONSTRAINT TRIGGER cassette_head_follow AFTER INSERT ON public.cassette_journal DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION cassette_head_follow();
CREATE TRIGGER cassette_head_guard_update BEFORE UPDATE ON public.cassette_head FOR EACH ROW WHEN (((new.next_seq IS DISTINCT FROM old.next_seq) OR (new.chain_hash IS DISTINCT FROM old.chain_hash) OR ((new.tx IS DISTINCT FROM old.tx) AND (new.tx IS DISTINCT FROM pg_current_xact_id())) OR (NOT COALESCE((new.time_ms >= old.time_ms), false)) OR (NOT COALESCE((new.clock_offset_ms >= old.clock_offset_ms), false)))) EXECUTE FUNCTION cassette_head_guard();
CREATE TRIGGER cassette_steps_update_signature BEFORE UPDATE ON public.cassette_steps FOR EACH ROW WHEN (((old.status = 'LEASED'::text) AND (new.status = 'PENDING'::text))) EXECUTE FUNCTION cassette_steps_update_signature();
REVOKE EXECUTE ON FUNCTION cassette_head_follow(), cassette_tail_malformed(text), cassette_steps_update_signature() FROM PUBLIC;
