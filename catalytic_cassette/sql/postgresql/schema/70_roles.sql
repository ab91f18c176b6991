-- The ledger's roles and what each may do. Every object of the ledger is the database
-- owner's (the migrations run as it, whoever connects: LAW.md 10b); the owner's
-- SECURITY DEFINER functions are the only way the roles write, so each role's power is
-- the list of functions granted to it below, and every rule those functions pass through
-- is the tables' own (triggers fire for the owner's writes too).
--
-- The three roles are cluster-wide and NOLOGIN: a host's login is granted one of them.
--   cassette_worker   claims, completes, releases and requeues steps, posts messages,
--                     attests with its key
--   cassette_appender appends actions and checkpoints
--   cassette_auditor  reads
DO $$
DECLARE
    role_name text;
BEGIN
    FOREACH role_name IN ARRAY ARRAY['cassette_worker', 'cassette_appender', 'cassette_auditor'] LOOP
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', role_name);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- made by another ledger of this cluster (or concurrently)
        END;
    END LOOP;
END $$;

-- No role may create objects in the ledger's schema. PostgreSQL 15 creates databases
-- that way, but an upgraded cluster or a DBA's grant may not; a function or operator a
-- role plants in `public` could be resolved by the owner's trigger functions (the
-- CVE-2018-1058 pattern). The baseline revokes it, and refuses to finish while any
-- ledger role could still create there through a grant of its own.
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

-- Nothing is PUBLIC's: a function is executable by PUBLIC when created, and no table
-- may be.
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC;

-- Every role reads every table: the package reads the schema version (is the ledger
-- current?) and the head (the ledger's time) when it opens, and reading gives away
-- nothing (the ledger is tamper-evident, not secret).
GRANT SELECT ON cassette_migrations, cassette_head, cassette_meta, cassette_journal,
                cassette_messages, cassette_jobs, cassette_steps, cassette_receipts,
                cassette_releases, cassette_seals, cassette_actions, cassette_checkpoints,
                cassette_attestations
   TO cassette_worker, cassette_appender, cassette_auditor;

-- Every role may count the journal (verify and the package's reads of its size); the
-- count reads no row.
GRANT EXECUTE ON FUNCTION cassette_journal_size() TO cassette_worker, cassette_appender, cassette_auditor;

-- A worker: the message and step machine (30_steps.sql), the checks the package asks
-- before taking the head (a claim with nothing PENDING, or an idempotent repeat of a post,
-- writes nothing and waits for no one), and its key's attestations (60_worker_keys.sql).
GRANT EXECUTE ON FUNCTION
    cassette_post(text, text, text, text, text[], integer[], text[]),
    cassette_claim(text, text, integer, bigint),
    cassette_complete(text, bigint, text, bigint, text, text),
    cassette_complete_and_claim(text, bigint, text, bigint, text, text, bigint),
    cassette_release(text, bigint, text, bigint),
    cassette_requeue(text, bigint, bigint),
    cassette_run_has_pending(text),
    cassette_run_has_lease_due(text),
    cassette_posted_under_key(text, text, text, text),
    cassette_signer_context(),
    cassette_attest(text, text, bigint, bigint, bigint, text, text, text)
   TO cassette_worker;

-- An appender: actions and checkpoints (40_actions.sql), and the transaction's time it
-- stamps them with.
GRANT EXECUTE ON FUNCTION
    cassette_append_action(text, text, text, text, text, text, text, text, text, text, text,
                           bigint, text, bigint, bigint, text, text, text, text),
    cassette_save_checkpoint(text, text, text),
    cassette_append_time()
   TO cassette_appender;
