-- Hardening found by a review of 0001-0005 (LAW.md section 14):
--   * No role may create objects in the ledger's schema. PostgreSQL 15 creates databases
--     that way, but an upgraded cluster or a DBA's grant may not; a function or operator
--     a role plants in `public` could be resolved by the owner's trigger functions (the
--     CVE-2018-1058 pattern). The migration revokes it, and refuses to finish while any
--     ledger role could still create there through a grant of its own.
--   * The head's chain hash moves only with its seq (one entry at a time, as before), and
--     its transaction stamp only to the transaction that writes it: an owner's UPDATE of
--     either alone would stop every later write (JOURNAL_BROKEN) or let a predicted
--     transaction skip taking the head.
--   * The functions granted to the roles pin the settings their SQL is written for, so a
--     session's own `standard_conforming_strings = off` (or float and bytea output
--     settings) cannot change how they parse or print.

REVOKE CREATE ON SCHEMA public FROM PUBLIC;

DO $$
DECLARE
    role_name text;
BEGIN
    FOREACH role_name IN ARRAY ARRAY['cassette_worker', 'cassette_appender', 'cassette_auditor'] LOOP
        IF has_schema_privilege(role_name, 'public', 'CREATE') THEN
            RAISE EXCEPTION 'MIGRATION_FAILED: role % may create objects in schema public; revoke it first', role_name;
        END IF;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION cassette_head_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' OR TG_OP = 'INSERT' THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: the journal head is one row, never inserted or deleted';
    END IF;
    IF NEW.next_seq IS DISTINCT FROM OLD.next_seq AND NEW.next_seq IS DISTINCT FROM OLD.next_seq + 1 THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: the head moves one entry at a time';
    END IF;
    IF NEW.next_seq IS NOT DISTINCT FROM OLD.next_seq
       AND NEW.chain_hash IS DISTINCT FROM OLD.chain_hash THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: the head''s chain hash moves only with its next entry';
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
END $$;

ALTER FUNCTION cassette_post(text, text, text, text, text[], integer[], text[])
    SET standard_conforming_strings = on SET extra_float_digits = 1 SET bytea_output = 'hex';
ALTER FUNCTION cassette_claim(text, text, integer, bigint)
    SET standard_conforming_strings = on SET extra_float_digits = 1 SET bytea_output = 'hex';
ALTER FUNCTION cassette_complete(text, bigint, text, bigint, text, text)
    SET standard_conforming_strings = on SET extra_float_digits = 1 SET bytea_output = 'hex';
ALTER FUNCTION cassette_release(text, bigint, text, bigint)
    SET standard_conforming_strings = on SET extra_float_digits = 1 SET bytea_output = 'hex';
ALTER FUNCTION cassette_requeue(text, bigint, bigint)
    SET standard_conforming_strings = on SET extra_float_digits = 1 SET bytea_output = 'hex';
ALTER FUNCTION cassette_complete_and_claim(text, bigint, text, bigint, text, text, bigint)
    SET standard_conforming_strings = on SET extra_float_digits = 1 SET bytea_output = 'hex';
ALTER FUNCTION cassette_append_action(text, text, text, text, text, text, text, text, text, text,
                                      text, bigint, text, bigint, bigint, text, text, text, text)
    SET standard_conforming_strings = on SET extra_float_digits = 1 SET bytea_output = 'hex';
ALTER FUNCTION cassette_save_checkpoint(text, text, text)
    SET standard_conforming_strings = on SET extra_float_digits = 1 SET bytea_output = 'hex';
