-- What opening a PostgreSQL ledger sends (postgresql/connection.py), by name: the
-- server's check, the session's settings, and the migrations' bookkeeping (the
-- migrations themselves are the files of migrations/, each sent whole).

-- name: server_encoding
-- The journal hashes the UTF-8 bytes of each body: a database in another encoding
-- cannot hold them.
SHOW server_encoding;

-- name: session_replication_role
-- 'origin' is the only value with which the ledger's triggers fire.
SHOW session_replication_role;

-- name: session_settings
-- For the session (is_local false): the durability's synchronous_commit, the busy
-- timeout as lock_timeout, and the search_path the package's unqualified names are
-- resolved in: the ledger's schema, pg_temp last (a temporary table named like a
-- ledger's table does not shadow it).
SELECT set_config('synchronous_commit', %(synchronous_commit)s, false),
       set_config('lock_timeout', %(lock_timeout)s, false),
       set_config('search_path', 'public, pg_temp', false);

-- name: read_only_session
SET default_transaction_read_only = on;

-- name: has_migrations_table
SELECT to_regclass('public.cassette_migrations') IS NOT NULL;

-- name: applied_version
-- The version reached, and the name recorded for version 1 (a development build before
-- the baseline recorded another: connection.require_released).
SELECT coalesce(max(version), 0), (SELECT name FROM cassette_migrations WHERE version = 1)
  FROM cassette_migrations;

-- name: migration_lock
-- Held to the end of the migrations' one transaction: hosts opening a ledger at once
-- take turns, and each reads the version again under it.
SELECT pg_advisory_xact_lock(%(key)s);

-- name: migration_owner
-- Who the migrations run as (the database's owner) and the powers they use: whether this
-- session may become it, CREATEROLE for the roles (schema/70_roles.sql), CREATE in schema
-- public, and the schema's owner (70_roles.sql revokes CREATE on it from PUBLIC, which
-- only its owner can).
SELECT pg_get_userbyid(d.datdba), o.rolsuper, o.rolcreaterole,
       pg_has_role(current_user, d.datdba, 'MEMBER'),
       has_schema_privilege(d.datdba, 'public', 'CREATE'),
       pg_get_userbyid(n.nspowner)
  FROM pg_database d
  JOIN pg_roles o ON o.oid = d.datdba
  JOIN pg_namespace n ON n.nspname = 'public'
 WHERE d.datname = current_database();

-- name: become_owner
-- For the rest of the migrations' transaction: every object they make is the owner's.
SELECT set_config('role', (SELECT pg_get_userbyid(datdba) FROM pg_database
                            WHERE datname = current_database()), true);

-- name: tables_in_public
-- A database with tables but no ledger is someone else's: never migrated into.
SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v');

-- name: create_migrations_table
CREATE TABLE cassette_migrations (version integer PRIMARY KEY,
                                  name text NOT NULL,
                                  applied_at timestamptz NOT NULL DEFAULT now());

-- name: revoke_migrations_table
REVOKE ALL ON cassette_migrations FROM PUBLIC;

-- name: record_migration
INSERT INTO cassette_migrations (version, name) VALUES (%(version)s, %(name)s);
