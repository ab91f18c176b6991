-- 0013: less of the law's own work under the chain's head on the worker's path (issue 15,
-- item 7). Committing early took the WAL flush off the head; what a step still does under
-- it is the law's work, and two of its checks cost more than they need to
-- (pg_stat_statements with nested statements, docs/BENCHMARKS.md "committing early"):
--
-- 1. cassette_noop_without_head() (0012) read the head row to learn whether this
--    transaction holds it. A transaction that holds the head has a transaction id (it
--    wrote the head row); so the early path is now taken only by a transaction without
--    one, which is 0012's condition made stricter: a transaction that has written
--    anything takes the locked path, as the claim half of complete_and_claim always did.
--    No table is read, so the check costs what the two built-in calls cost.
-- 2. The receipt's signature guard (0007) called cassette_signed_claim() for every receipt,
--    a SQL function call even where no lease is signed; the same lookup is now a statement
--    of the trigger itself (one cached plan). Same rule, same order, same codes. (A
--    release, off the hot path, keeps the call.)

CREATE OR REPLACE FUNCTION cassette_noop_without_head() RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT pg_current_xact_id_if_assigned() IS NULL
           AND current_setting('transaction_isolation') = 'read committed'
$$;

CREATE OR REPLACE FUNCTION cassette_receipts_signature() RETURNS trigger
LANGUAGE plpgsql AS $$
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
