-- 0014: the worker's path without scans, per-call planning or checks done twice (issue 15,
-- item 7). Same law, same journal bytes, same codes. Measured in docs/BENCHMARKS.md, "Issue
-- 15: server CPU per step, and migration 0014", with the CPU per step that scripts/bench.py
-- now prints and perf: with four workers on two CPUs much of the server's CPU went to work
-- that did not need doing.
--
-- 1. Plans that do not depend on statistics. A PL/pgSQL function caches its statements'
--    plans for the session, and the plan is made from the table's statistics. A table
--    analyzed while empty or small (a new ledger; receipts before the first completion)
--    gets sequential scans for its keyed lookups, and the session keeps them while the
--    table grows until the next ANALYZE: each completion read every receipt twice (4,000
--    rows read per step after 2,000 steps). The law's functions that look rows up by key
--    now plan with enable_seqscan off, so they use the key's index whatever the statistics
--    say (a table with no usable index is still scanned), and with jit off: a scan the
--    first setting penalizes still costs more than JIT's threshold, and JIT compiled such
--    a statement at every call (50 ms; a batch of 400 appends took 28 s, not 0.1). Set on
--    the functions the roles call and on the tables' trigger functions (which run for the
--    owner's own DML too), not on the session: the clients' own queries plan as they did.
--    (Functions that only read the one-row head, and SQL functions the server inlines into
--    their caller, are not set.)
-- 2. The claim's "is anything PENDING?" before the head (0012) was a SQL function with its
--    own search_path, which the server cannot inline, so it was planned at every call; the
--    plan, made from statistics taken when most steps were PENDING, was a sequential scan
--    walking every claimed and dead version before the first PENDING one. The claim asks it
--    as a statement of its own, over the PENDING index in claim order; the function the
--    package's signed claim calls is PL/pgSQL with the same statement.
-- 3. The head row holds fewer dead versions. It is updated twice per writing transaction;
--    versions that a concurrent snapshot can still see cannot be pruned, the page filled
--    and the row moved on: the one-row table grew to 20 pages in 2,000 steps, and every
--    read of the head scanned them all. fillfactor 10 makes the server prune the page at
--    nearly every visit, so it stays one page.
-- 4. The head's guard fires on an UPDATE only when there is something to check: the chain
--    moves, the stamp goes to another transaction, or the time or the offset runs back.
--    Taking the head (cassette_tx_ms: its own stamp, a later time) no longer calls it; the
--    trigger's WHEN condition is the guard's own conditions, NULL-safe (a NULL time or
--    offset calls it, as the NOT NULL constraint refuses them anyway).
-- 5. A completion takes the head once. cassette_complete() took it before its INSERT, and
--    the receipt's trigger took it again (the second call only reads the stamp); now the
--    trigger takes it (STEP_NOT_FOUND, when the INSERT finds no step, is decided without
--    it: a refusal writes nothing). The trigger reads the step with a snapshot taken after
--    it holds the head, as before.
-- 6. A step's commit (LEASED -> COMMITTED) does not ask for the transaction's time: no rule
--    of that transition uses it, and it comes from its receipt's insert, which holds the
--    head.
-- 7. The step's signature guard (0007) runs only for a requeue (LEASED -> PENDING), the
--    one transition it checks (a WHEN condition equal to its own first condition).
-- Not done: the journal's guard repeats, for every entry, checks whose values the append
--    has just computed (the head held, the entry before, the free seq, the hashes). Run
--    only for entries inserted at pg_trigger_depth() = 0 (the append inserts from a
--    trigger) it let any session's temporary table carry a trigger whose INSERT skipped
--    it (found by review; tests/test_postgres_attacks_0014.py): the guard runs for every
--    entry, and the append checks nothing itself (checking in both was slower).

-- 2.
CREATE OR REPLACE FUNCTION cassette_run_has_pending(p_run_id text) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = public, pg_temp AS $$
BEGIN
    PERFORM FROM cassette_steps s
     WHERE s.run_id = p_run_id AND s.status = 'PENDING'
     ORDER BY s.message_id, s.job_ordinal, s.ordinal LIMIT 1;
    RETURN FOUND;
END $$;

CREATE OR REPLACE FUNCTION cassette_claim(p_run_id text, p_worker_id text, p_n integer, p_ttl_ms bigint)
RETURNS TABLE (step_id bigint, job_id bigint, message_id bigint, ordinal bigint,
               payload_json text, fencing_token bigint, lease_expires_at bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
    SET standard_conforming_strings = on SET extra_float_digits = 1 SET bytea_output = 'hex' AS $$
DECLARE
    now_ms bigint;
BEGIN
    IF p_n IS NULL OR p_n < 1 THEN
        RAISE EXCEPTION 'INVALID_ARGUMENT: n must be at least 1';
    END IF;
    IF p_ttl_ms IS NULL OR p_ttl_ms < 1 OR p_ttl_ms > 2592000000 THEN
        RAISE EXCEPTION 'INVALID_TTL: a lease lasts 1 ms to 30 days';
    END IF;
    IF cassette_noop_without_head() THEN
        PERFORM FROM cassette_steps s
         WHERE s.run_id = p_run_id AND s.status = 'PENDING'
         ORDER BY s.message_id, s.job_ordinal, s.ordinal LIMIT 1;
        IF NOT FOUND THEN
            RETURN;  -- nothing to claim
        END IF;
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
END $$;

-- 3.
ALTER TABLE cassette_head SET (fillfactor = 10);

-- 4.
DROP TRIGGER cassette_head_guard ON cassette_head;
CREATE TRIGGER cassette_head_guard BEFORE INSERT OR DELETE ON cassette_head
    FOR EACH ROW EXECUTE FUNCTION cassette_head_guard();
CREATE TRIGGER cassette_head_guard_update BEFORE UPDATE ON cassette_head
    FOR EACH ROW WHEN (
        NEW.next_seq IS DISTINCT FROM OLD.next_seq
        OR NEW.chain_hash IS DISTINCT FROM OLD.chain_hash
        OR (NEW.tx IS DISTINCT FROM OLD.tx AND NEW.tx IS DISTINCT FROM pg_current_xact_id())
        OR NOT coalesce(NEW.time_ms >= OLD.time_ms, false)
        OR NOT coalesce(NEW.clock_offset_ms >= OLD.clock_offset_ms, false))
    EXECUTE FUNCTION cassette_head_guard();

-- 5.
CREATE OR REPLACE FUNCTION cassette_complete(p_run_id text, p_step_id bigint, p_worker_id text,
                                             p_fencing_token bigint, p_outcome text,
                                             p_receipt_json text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
    SET standard_conforming_strings = on SET extra_float_digits = 1 SET bytea_output = 'hex' AS $$
DECLARE
    made bigint;
BEGIN
    INSERT INTO cassette_receipts (step_id, job_id, run_id, worker_id, fencing_token, outcome, receipt_json)
    SELECT s.step_id, s.job_id, p_run_id, p_worker_id, p_fencing_token, p_outcome, p_receipt_json
    FROM cassette_steps s WHERE s.step_id = p_step_id
    RETURNING receipt_id INTO made;
    IF made IS NULL THEN
        RAISE EXCEPTION 'STEP_NOT_FOUND: no step %', p_step_id;
    END IF;
    RETURN made;
END $$;

-- 6.
CREATE OR REPLACE FUNCTION cassette_steps_update() RETURNS trigger
LANGUAGE plpgsql AS $$
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
END $$;

-- 7.
DROP TRIGGER cassette_steps_update_signature ON cassette_steps;
CREATE TRIGGER cassette_steps_update_signature BEFORE UPDATE ON cassette_steps
    FOR EACH ROW WHEN (OLD.status = 'LEASED' AND NEW.status = 'PENDING')
    EXECUTE FUNCTION cassette_steps_update_signature();

-- 1.
ALTER FUNCTION cassette_claim(text, text, integer, bigint) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_complete(text, bigint, text, bigint, text, text) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_release(text, bigint, text, bigint) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_requeue(text, bigint, bigint) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_post(text, text, text, text, text[], integer[], text[]) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_posted_under_key(text, text, text, text) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_run_has_pending(text) SET enable_seqscan = off SET jit = off;
-- (a SQL function with its own search_path, planned at every call: found by review)
ALTER FUNCTION cassette_run_has_lease_due(text) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_save_checkpoint(text, text, text) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_append_action(text, text, text, text, text, text, text, text, text, text,
                                      text, bigint, text, bigint, bigint, text, text, text, text)
    SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_attest(text, text, bigint, bigint, bigint, text, text, text)
    SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_journal_append(text, text, text, text, text) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_journal_guard() SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_head_guard() SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_messages_insert() SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_jobs_insert() SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_steps_insert() SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_steps_update() SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_steps_update_signature() SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_receipts_insert() SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_receipts_signature() SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_receipts_commit_step() SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_releases_requeue_step() SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_releases_signature() SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_releases_insert() SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_attestations_insert() SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_actions_insert() SET enable_seqscan = off SET jit = off;
ALTER FUNCTION cassette_checkpoints_insert() SET enable_seqscan = off SET jit = off;
