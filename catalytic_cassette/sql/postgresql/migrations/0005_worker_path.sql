-- The worker's path, shorter under the head's lock (issue 15, item 7; measured in
-- docs/BENCHMARKS.md, "Issue 15: PostgreSQL, against procrastinate"). Same law, same
-- journal bytes: only how the server evaluates two helpers of 0001 and one new function.
--   * cassette_tx_ms() was a SQL function running an UPDATE of the head at every call
--     (five or more per worker transaction): SQL functions are planned again at each
--     call, and every UPDATE wrote a new version of the head row and fired its guard.
--     Now the first call of a transaction takes the head as before (the same UPDATE,
--     the same lock, the same time); a later call of that transaction finds the head
--     already stamped with its own transaction id and reads the time it set. Nobody
--     else can have changed the row in between: the transaction holds its lock. A call
--     after a rolled-back savepoint finds the head without its id and takes it again.
--   * cassette_j(text) was declared IMMUTABLE around to_json(), which is STABLE, so the
--     planner could not inline it and every journal body made a dozen SQL function
--     calls. Declared STABLE (what it is), it is inlined; the text it gives is the same.
--   * cassette_complete_and_claim(): complete a step and lease the run's next one in one
--     call, so a worker's fused transaction is one statement (no client round trip
--     while the head is locked).

CREATE OR REPLACE FUNCTION cassette_tx_ms() RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    taken bigint;
BEGIN
    SELECT time_ms INTO taken FROM cassette_head WHERE tx = pg_current_xact_id();
    IF FOUND THEN
        RETURN taken;
    END IF;
    UPDATE cassette_head
       SET time_ms = greatest(time_ms, (floor(extract(epoch FROM clock_timestamp()) * 1000))::bigint
                                       + clock_offset_ms),
           tx = pg_current_xact_id()
    RETURNING time_ms INTO taken;
    RETURN taken;
END $$;

CREATE OR REPLACE FUNCTION cassette_j(value text) RETURNS text
LANGUAGE sql STABLE AS $$ SELECT coalesce(to_json(value)::text, 'null') $$;

CREATE FUNCTION cassette_complete_and_claim(
    p_run_id text, p_step_id bigint, p_worker_id text, p_fencing_token bigint,
    p_outcome text, p_receipt_json text, p_ttl_ms bigint)
RETURNS TABLE (receipt_id bigint, step_id bigint, job_id bigint, message_id bigint,
               ordinal bigint, payload_json text, fencing_token bigint, lease_expires_at bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    receipt_id := cassette_complete(p_run_id, p_step_id, p_worker_id, p_fencing_token,
                                    p_outcome, p_receipt_json);
    FOR step_id, job_id, message_id, ordinal, payload_json, fencing_token, lease_expires_at IN
        SELECT * FROM cassette_claim(p_run_id, p_worker_id, 1, p_ttl_ms)
    LOOP
        RETURN NEXT;
    END LOOP;
    IF NOT FOUND THEN  -- no step left: the receipt alone
        step_id := NULL;
        RETURN NEXT;
    END IF;
END $$;

REVOKE EXECUTE ON FUNCTION
    cassette_complete_and_claim(text, bigint, text, bigint, text, text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    cassette_complete_and_claim(text, bigint, text, bigint, text, text, bigint) TO cassette_worker;
