-- The ledger's own tables: its metadata, the migrations it has taken, and its time.
--
-- Every rule of the ledger lives in these schema files, one per concern, and holds for any
-- connection: the rules a ledger file keeps are written with SQLite built-ins only, so a
-- raw `sqlite3` connection (foreign keys off, no registered functions) gets the same
-- precise refusal codes as the package; a rule needs a built-in for that, and reads no
-- function a client could register under the same name. The rules that need the package's
-- SQL functions (its clock, SHA-256) are TEMP triggers each package connection installs:
-- they stand at the end of their concern's file, after the TEMP line. A write that those
-- TEMP triggers did not journal is refused by the file's own rules (JOURNAL_REQUIRED), so
-- a connection without them fails closed.
--
-- Order is meaning. SQLite fires a connection's TEMP triggers before the file's, and of a
-- table's triggers for one event the newest first; the file's order here is the order the
-- triggers of each table are created in (tests/test_schema_files.py pins it). Each table
-- has its immutability triggers, then a `<table>_rules` trigger (journal, time, dense ids,
-- readable JSON: the rules every row meets), then the guards that fire before it (their
-- codes name what a row broke, before the rules ask whether it was journaled).
--
-- Every rule is checked before the row is written: a client's own TEMP trigger ending in
-- RAISE(IGNORE) after the insert would end the row's remaining AFTER triggers with the
-- row kept; in a BEFORE trigger IGNORE drops the row, which is no bypass. Only the
-- consequences of a row (a receipt commits its step, a release requeues it, an entry
-- grows the tree) are AFTER triggers.
--
-- Lookups name their index (INDEXED BY) or read the table itself (NOT INDEXED), so that
-- planner statistics written by anyone (ANALYZE, sqlite_stat1) cannot turn them into
-- scans. LAW.md states the law these files implement.

-- ============================================================================
-- cassette_meta

-- format and ledger_id: what the package reads to know the file; written once, at creation.
CREATE TABLE cassette_meta (
    key TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
) STRICT;

-- The ledger's own name for the default seal origin. A verifier never trusts it: it
-- pins the origin it expects (LAW.md, "Seals").
INSERT INTO cassette_meta (key, value) VALUES ('ledger_id', lower(hex(randomblob(16))));

-- Metadata and migrations are append-only.
CREATE TRIGGER cassette_meta_no_update BEFORE UPDATE ON cassette_meta
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_meta rows cannot be updated'); END;

CREATE TRIGGER cassette_meta_no_delete BEFORE DELETE ON cassette_meta
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_meta rows cannot be deleted'); END;

-- Written only by the package's migration runner (a connection without the package's
-- functions, a raw shell, cannot add rows), never replaced, and only the two keys: the
-- format, and a ledger_id of 32 lowercase hex digits.
CREATE TRIGGER cassette_meta_insert_guard BEFORE INSERT ON cassette_meta
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_meta rows cannot be replaced')
    WHERE EXISTS (SELECT 1 FROM cassette_meta WHERE key = NEW.key);
    SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: only a cassette connection migrates the ledger')
    WHERE NOT EXISTS (SELECT 1 FROM pragma_function_list WHERE name = 'cassette_chain_hash');
    SELECT RAISE(ABORT, 'MIGRATION_FAILED: cassette_meta holds only format and ledger_id')
    WHERE NOT ((NEW.key IS 'format' AND NEW.value IS 'catalytic-cassette')
            OR (NEW.key IS 'ledger_id' AND length(NEW.value) = 32
                AND NEW.value NOT GLOB '*[^0-9a-f]*'));
END;

-- ============================================================================
-- cassette_migrations

-- One row per migration the ledger has taken: version, name, and the SHA-256 of its text
-- (a file whose rows are not the package's was made by another build: SCHEMA_UNRELEASED).
CREATE TABLE cassette_migrations (
    version INTEGER PRIMARY KEY NOT NULL CHECK (version > 0),
    name TEXT NOT NULL,
    sha256 TEXT NOT NULL CHECK (length(sha256) = 64)
) STRICT;

CREATE TRIGGER cassette_migrations_no_update BEFORE UPDATE ON cassette_migrations
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be updated'); END;

CREATE TRIGGER cassette_migrations_no_delete BEFORE DELETE ON cassette_migrations
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be deleted'); END;

-- A migration records itself, once: each migration re-creates this guard naming its own
-- version and name, so nobody can record a version the package does not ship (a version
-- from the future would refuse every open). The package's functions must be present, as
-- for cassette_meta.
CREATE TRIGGER cassette_migrations_insert_guard BEFORE INSERT ON cassette_migrations
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be replaced')
    WHERE EXISTS (SELECT 1 FROM cassette_migrations WHERE version = NEW.version);
    SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: only a cassette connection migrates the ledger')
    WHERE NOT EXISTS (SELECT 1 FROM pragma_function_list WHERE name = 'cassette_chain_hash');
    SELECT RAISE(ABORT, 'MIGRATION_FAILED: only the migration being applied records itself')
    WHERE NEW.version IS NOT 1 OR NEW.name IS NOT 'baseline'
       OR typeof(NEW.sha256) IS NOT 'text' OR length(NEW.sha256) IS NOT 64
       OR NEW.sha256 GLOB '*[^0-9a-f]*';
END;

-- ============================================================================
-- cassette_ledger_time

-- The ledger's time is the latest time it has recorded: the newest row of each dated table
-- (ids are dense and times never decrease, so the newest row holds the latest time). No
-- write is dated before it (each table's rules). Honest writers date their rows
-- max(their clock, ledger time), so someone else's future date never blocks them; verify
-- reports dates in the future and large forward jumps (LAW.md, "Time").
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
