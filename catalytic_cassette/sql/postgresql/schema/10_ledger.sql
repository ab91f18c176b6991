-- The ledger: what it is (cassette_meta), the head that is its lock and its clock, and
-- the checks every other concern shares. The same law as the SQLite ledger (LAW.md),
-- held by the server for every session. Differences from SQLite, and why:
--   * The journal is written by the server's own triggers with its own sha256(); no
--     function a client registers is involved, so every session journals.
--   * Time is the server's clock (plus a forward-only offset only the owner can move),
--     read once per transaction by cassette_tx_ms(), which also locks the one-row head:
--     every write transaction serializes on it, so ids stay dense and the chain linear.
--   * Ids and created_at are assigned by the BEFORE INSERT triggers, not the client.
--   * Refusals are RAISE EXCEPTION 'CODE: text' (SQLSTATE P0001), the codes of LAW.md.
-- The files of this folder are applied in their names' order; 70_roles.sql grants.
-- PostgreSQL fires the triggers of one table and event in the order of their names:
-- the names below are part of the law (tests/test_postgres_schema.py pins the order).
--
-- Settings pinned on functions (each function's SET clauses), and why:
--   * search_path = public, pg_temp on every function that is not IMMUTABLE: a function
--     that is not SECURITY DEFINER runs with the search_path of the session that fires
--     it, and a session's temporary schema is searched first for tables unless the path
--     names pg_temp. A temporary table is any session's to make, seen by no other
--     session's catalog check: a trigger reading cassette_head, cassette_journal or
--     cassette_steps by name would read the session's own. pg_catalog comes first
--     (implicitly) and pg_temp last, so it holds no table the path finds first.
--   * enable_seqscan = off and jit = off on the functions that look rows up by key (the
--     functions the roles call and the tables' trigger functions, which run for the
--     owner's own DML too; not on the session, so the clients' own queries plan as they
--     would): a PL/pgSQL function caches its plans for the session, made from the
--     table's statistics, and a table analyzed while small gets sequential scans for its
--     keyed lookups that the session keeps while the table grows. With these settings
--     the key's index is used whatever the statistics say, and a statement the first
--     setting penalizes is not JIT-compiled at every call. (Functions that only read the
--     one-row head, and SQL functions the server inlines into their caller, are not set.)
--   * standard_conforming_strings = on, extra_float_digits = 1, bytea_output = 'hex' on
--     the functions granted to the roles: a session's own settings cannot change how
--     their SQL parses or prints.

-- What the ledger is, and which: format, and ledger_id (32 hex digits, random, as on
-- SQLite), the name seals and attestations bind to ("catalytic-cassette/ledger/<id>").
CREATE TABLE cassette_meta (
    key text PRIMARY KEY CHECK (key IN ('format', 'ledger_id')),
    value text NOT NULL CHECK (key <> 'ledger_id' OR value ~ '^[0-9a-f]{32}$')
);
INSERT INTO cassette_meta (key, value)
VALUES ('format', 'catalytic-cassette'), ('ledger_id', replace(gen_random_uuid()::text, '-', ''));

-- The head: one row, the chain's lock and the ledger's clock. The lock: tx, the
-- transaction that took it (the journal's guard admits an entry only from the
-- transaction stamped here), so every writing transaction serializes on this row and
-- ids stay dense and the chain linear. The clock: time_ms, the latest time the ledger
-- holds, and clock_offset_ms, the owner's forward-only offset. It holds no copy of the
-- journal's end: the journal's guard places and hashes each entry from the journal's
-- last entry, read through the seq's primary key under the head.
-- fillfactor 10: the row is updated twice per writing transaction, and versions a
-- concurrent snapshot can still see cannot be pruned; with a nearly empty page the server
-- prunes it at nearly every visit, so the one-row table stays one page (at the default
-- it grew to 20 pages in 2,000 steps, and every read of the head scanned them all).
CREATE TABLE cassette_head (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    time_ms bigint NOT NULL,
    tx xid8,
    clock_offset_ms bigint NOT NULL DEFAULT 0 CHECK (clock_offset_ms >= 0)
) WITH (fillfactor = 10);
INSERT INTO cassette_head (time_ms) VALUES (0);

-- Move the ledger's clock forward (never back): the owner's only say over time; tests
-- use it to expire leases without sleeping. No role is granted it.
CREATE FUNCTION cassette_advance_clock(p_ms bigint) RETURNS bigint
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
BEGIN
    IF p_ms IS NULL OR p_ms < 0 THEN
        RAISE EXCEPTION 'INVALID_ARGUMENT: the clock moves forward only';
    END IF;
    UPDATE cassette_head SET clock_offset_ms = clock_offset_ms + p_ms;
    RETURN (SELECT clock_offset_ms FROM cassette_head);
END $$;

-- The appender's transaction time, before it writes: a signed action signs the row as
-- stored, its timestamp included, and suggested causes are read at the time of the action
-- they are suggested for. It takes the head, so nothing commits between the read of the
-- suggestions and the insert, and writes nothing else. Nothing new is trusted: the row's
-- timestamp is still set by the insert trigger (cassette_tx_ms() again), so a client that
-- signs another time only makes a signature that verify reports as bad_signature.
CREATE FUNCTION cassette_append_time() RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET standard_conforming_strings = on
SET extra_float_digits = 1
SET bytea_output = 'hex' AS $$
BEGIN
    RETURN cassette_tx_ms();
END $$;

-- The document as json whose values can be read, or NULL. PostgreSQL cannot hold U+0000
-- in text and refuses to read any value of a document holding the escape \u0000 (SQLite
-- reads it): it becomes \u0001 first, which no rule tells apart (the rules read keys,
-- types, numbers and ids, never a string's characters, except plan_body's hash). A
-- document whose values cannot be read (a lone surrogate) is NULL.
CREATE FUNCTION cassette_json(doc text) RETURNS json
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    readable text := doc;
BEGIN
    IF strpos(doc, '\u0000') > 0 THEN
        readable := regexp_replace(doc, '(?<!\\)((?:\\\\)*)\\u0000', '\1\\u0001', 'g');
    END IF;
    PERFORM readable::jsonb;  -- reads every value: refuses lone surrogates
    RETURN readable::json;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;

-- SQLite's json_type() 'integer': a number written without fraction or exponent.
CREATE FUNCTION cassette_json_integer(value json) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT json_typeof(value) = 'number' AND value::text ~ '^-?[0-9]+$'
$$;

-- The json type of a document as json_typeof names it (object, array, string, number,
-- boolean, null), or NULL when the text is not JSON (SQLite's json_valid()).
CREATE FUNCTION cassette_json_type(doc text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN json_typeof(doc::json);
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;

-- A run id, source, worker id or intent: non-empty text of at most 200 characters.
CREATE FUNCTION cassette_name_ok(value text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$ SELECT value IS NOT NULL AND length(value) BETWEEN 1 AND 200 $$;

-- A row's id is the next of its table's dense ids, assigned under the head's lock; a
-- client that names another id is refused as on SQLite.
CREATE FUNCTION cassette_next_id(given bigint, next_id bigint) RETURNS bigint
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
BEGIN
    IF given IS NOT NULL AND given IS DISTINCT FROM next_id THEN
        RAISE EXCEPTION 'OUT_OF_ORDER: ids are dense: an id must follow the last one';
    END IF;
    RETURN next_id;
END $$;

-- Whether a call that may change nothing can decide so before taking the head: only in a
-- transaction that has no transaction id yet (it has written nothing, so cannot hold the
-- head) and in READ COMMITTED (its statement's snapshot holds every commit made before
-- the statement began). Reads no table: it costs what the two built-in calls cost.
CREATE FUNCTION cassette_noop_without_head() RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT pg_current_xact_id_if_assigned() IS NULL
           AND current_setting('transaction_isolation') = 'read committed'
$$;

-- JSON the API can read back (SQLite's cassette_*_readable checks): no integer beyond 64
-- bits, no other number beyond a finite double, nesting no deeper than 1024, no lone
-- surrogate. NULL and text that is not JSON pass: other rules refuse those.
CREATE FUNCTION cassette_readable_json(doc text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    readable text := doc;
    parsed jsonb;
BEGIN
    IF doc IS NULL OR NOT (doc ~ '[0-9][eE]' OR doc ~ '[0-9]{19}' OR length(doc) > 2048
                           OR strpos(lower(doc), '\ud') > 0) THEN
        RETURN true;
    END IF;
    IF cassette_json_type(doc) IS NULL THEN
        RETURN true;
    END IF;
    IF strpos(doc, '\u0000') > 0 THEN
        readable := regexp_replace(doc, '(?<!\\)((?:\\\\)*)\\u0000', '\1\\u0001', 'g');
    END IF;
    BEGIN
        parsed := readable::jsonb;
    EXCEPTION WHEN others THEN
        RETURN false;  -- a lone surrogate, or a number no numeric holds
    END;
    -- Numbers as written (jsonb would print 1.5e+300 as 15 followed by 299 zeros, an
    -- integer): walked through json, which keeps each token's text.
    IF doc ~ '[0-9][eE]' OR doc ~ '[0-9]{19}' THEN
        IF EXISTS (
            WITH RECURSIVE walk(v) AS (
                SELECT readable::json
                UNION ALL
                SELECT e.value FROM walk, LATERAL (
                    SELECT a.value FROM json_array_elements(
                        CASE WHEN json_typeof(walk.v) = 'array' THEN walk.v END) a
                    UNION ALL
                    SELECT o.value FROM json_each(
                        CASE WHEN json_typeof(walk.v) = 'object' THEN walk.v END) o) e
            )
            SELECT 1 FROM walk
             WHERE json_typeof(v) = 'number'
               AND CASE WHEN v::text ~ '^-?[0-9]+$'
                        THEN v::text::numeric NOT BETWEEN -9223372036854775808 AND 9223372036854775807
                        ELSE abs(v::text::numeric) > 1.7976931348623157e308 END) THEN
            RETURN false;
        END IF;
    END IF;
    IF length(doc) > 2048 AND jsonb_path_exists(parsed, 'strict $.**{1024 to last}') THEN
        RETURN false;
    END IF;
    RETURN true;
END $$;

-- A JSON object the API can read back, as SQLite accepts it (INVALID_PAYLOAD otherwise):
-- one holding the escape \u0000 (the API writes it for a string with U+0000; jsonb cannot
-- hold it) is read, and so is a real written with an exponent that jsonb prints as a long
-- integer (1.5e300 is not an integer beyond 64 bits).
CREATE FUNCTION cassette_readable_object(doc text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(cassette_json_type(doc) = 'object' AND cassette_readable_json(doc), false)
$$;

-- A refusal: RAISE EXCEPTION 'CODE: text' (SQLSTATE P0001), the codes of LAW.md.
CREATE FUNCTION cassette_refuse(message text) RETURNS void
LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION USING MESSAGE = message; END $$;

-- SHA-256 of the text's UTF-8 bytes, as lowercase hex (plan and checkpoint hashes).
CREATE FUNCTION cassette_sha256_hex(value text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT encode(sha256(convert_to(value, 'UTF8')), 'hex') $$;

-- The transaction's time: the later of the server's clock (plus the owner's forward
-- offset) and the latest time the ledger holds, fixed at the transaction's first call.
-- The first call takes the head (the UPDATE locks its row until commit: the
-- serialization point of every writer); a later call of the same transaction finds the
-- head stamped with its own transaction id and reads the time it set, without writing
-- the row again (nobody else can have changed it: the transaction holds its lock). A call
-- after a rolled-back savepoint finds the head without its id and takes it again.
CREATE FUNCTION cassette_tx_ms() RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = public, pg_temp AS $$
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

-- Append-only tables: no row is updated or deleted (APPEND_ONLY), nor the table truncated.
CREATE FUNCTION cassette_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING MESSAGE = format('APPEND_ONLY: %s rows cannot be %s',
        TG_TABLE_NAME, CASE TG_OP WHEN 'UPDATE' THEN 'updated' WHEN 'DELETE' THEN 'deleted'
                                  ELSE 'truncated' END);
END $$;

-- The head is one row, never inserted or deleted; its stamp goes only to the transaction
-- taking it (a predicted transaction could otherwise skip taking the head), and neither
-- its time nor the owner's offset runs back.
CREATE FUNCTION cassette_head_guard() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_OP = 'DELETE' OR TG_OP = 'INSERT' THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: the journal head is one row, never inserted or deleted';
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

-- cassette_meta is append-only, but for the ledger_id while the journal is empty (a copy
-- takes its source's). The ledger's identity is then fixed by its first entry, for every
-- interleaving of sessions: a replacement first locks the head row (FOR UPDATE), the lock
-- every journaled write takes, so a REPEATABLE READ snapshot that predates another
-- session's first entries fails to take it (a serialization error, BUSY), a signer waits
-- for the replacement's commit and reads the new id, and the count that follows is made
-- under the lock (a volatile function's statement sees what committed before it, in READ
-- COMMITTED). Only the lock: not cassette_tx_ms(), which would also date the transaction
-- now, and a copy (which takes its source's id, then dates each row with its source's
-- time) must set that time itself. Without it the id could be replaced after the first
-- entries, and nothing in the journal or verify would show it (meta is not journaled).
CREATE FUNCTION cassette_meta_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.key = 'ledger_id' AND NEW.key = 'ledger_id' THEN
        PERFORM 1 FROM cassette_head FOR UPDATE;
        IF cassette_journal_size() = 0 THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION USING MESSAGE = format('APPEND_ONLY: cassette_meta rows cannot be %s',
        CASE TG_OP WHEN 'UPDATE' THEN 'updated' ELSE 'deleted' END);
END $$;

CREATE TRIGGER cassette_head_guard BEFORE INSERT OR DELETE ON cassette_head
    FOR EACH ROW EXECUTE FUNCTION cassette_head_guard();

-- The guard fires on an UPDATE only when there is something to check: the stamp goes to
-- another transaction, or the time or the offset runs back. Taking the head
-- (cassette_tx_ms: its own stamp, a later time) calls nothing. The WHEN condition is the
-- guard's own conditions, NULL-safe (a NULL time or offset calls it; NOT NULL refuses them).
CREATE TRIGGER cassette_head_guard_update BEFORE UPDATE ON cassette_head
    FOR EACH ROW WHEN (
        (NEW.tx IS DISTINCT FROM OLD.tx AND NEW.tx IS DISTINCT FROM pg_current_xact_id())
        OR NOT coalesce(NEW.time_ms >= OLD.time_ms, false)
        OR NOT coalesce(NEW.clock_offset_ms >= OLD.clock_offset_ms, false))
    EXECUTE FUNCTION cassette_head_guard();

CREATE TRIGGER cassette_head_no_truncate BEFORE TRUNCATE ON cassette_head
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_meta_no_change BEFORE UPDATE OR DELETE ON cassette_meta
    FOR EACH ROW EXECUTE FUNCTION cassette_meta_guard();

-- TRUNCATE fires no row trigger: a statement trigger refuses it.
CREATE TRIGGER cassette_meta_no_truncate BEFORE TRUNCATE ON cassette_meta
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();
