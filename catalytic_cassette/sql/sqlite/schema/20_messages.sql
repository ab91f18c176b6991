-- Messages and the jobs they carry: what is asked of the workers (LAW.md, "Messages").
-- A message is posted once per idempotency key; its jobs, and their steps (30_steps.sql),
-- are written with it in one transaction. Both tables are append-only.

-- ============================================================================
-- cassette_messages

-- A message: its run, its source (USER, AGENT or SYSTEM), its payload (a JSON object) and an
-- optional idempotency key, unique per run: posting it again returns the first message.
CREATE TABLE cassette_messages (
    message_id INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (message_id > 0),
    run_id TEXT NOT NULL CONSTRAINT INVALID_RUN_ID CHECK (length(run_id) BETWEEN 1 AND 200),
    source TEXT NOT NULL
        CONSTRAINT INVALID_SOURCE CHECK (
            source = 'USER' OR source = 'PLANNER' OR source = 'SYSTEM' OR source = 'WORKER'),
    idempotency_key TEXT
        CONSTRAINT INVALID_IDEMPOTENCY_KEY CHECK (length(idempotency_key) BETWEEN 1 AND 200),
    payload_json TEXT NOT NULL
        CONSTRAINT INVALID_PAYLOAD CHECK (
            CASE WHEN json_valid(payload_json) THEN json_type(payload_json) = 'object' ELSE 0 END
        ),
    created_at INTEGER NOT NULL,
    UNIQUE (run_id, idempotency_key)
) STRICT;

-- Append-only.
CREATE TRIGGER cassette_messages_no_update BEFORE UPDATE ON cassette_messages
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_messages rows cannot be updated'); END;

CREATE TRIGGER cassette_messages_no_delete BEFORE DELETE ON cassette_messages
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_messages rows cannot be deleted'); END;

-- The rules every row meets, checked before it is written, in this order: its journal
-- entry is the journal's last (JOURNAL_REQUIRED: only a package connection journals), its
-- time is readable and not before the ledger's, its JSON can be read back by the API,
-- its id is the next one (dense ids: a row at 2^63 - 1 would make every later insert
-- fail). A NULL id reads -1 in a BEFORE trigger: the next id, which SQLite then gives the
-- row. A row that breaks a NOT NULL or CHECK constraint is left to it (SQLite tests
-- those after the BEFORE triggers), so it gets the constraint's code.
CREATE TRIGGER cassette_messages_rules BEFORE INSERT ON cassette_messages
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection')
        WHEN 2 THEN RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
        WHEN 3 THEN RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time')
        WHEN 4 THEN RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
        WHEN 5 THEN RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: message_id must follow the last one')
        WHEN 6 THEN RAISE(ABORT, 'OUT_OF_ORDER: a message_id must be larger than every existing one') END
    FROM (SELECT k.id, CASE
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_messages', 'op', 'INSERT', 'key', k.id,
                  'row', json_object('message_id', k.id, 'run_id', NEW.run_id, 'source', NEW.source,
                           'idempotency_key', NEW.idempotency_key,
                           'payload_json', NEW.payload_json, 'created_at', NEW.created_at)) THEN 1
            WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999 THEN 2
            WHEN NEW.created_at < (SELECT ms FROM cassette_ledger_time) THEN 3
            WHEN (NEW.payload_json GLOB '*[0-9][eE]*' OR NEW.payload_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
                  OR length(NEW.payload_json) > 2048 OR instr(lower(NEW.payload_json), '\ud') > 0)
             AND json_valid(NEW.payload_json) AND (
                 (length(NEW.payload_json) > 2048
                  AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.payload_json
                                     || replace(hex(zeroblob(975)), '00', ']') || ']'))
                 OR EXISTS (
                     SELECT 1 FROM json_tree(NEW.payload_json)
                     WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
                        OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
                        OR (instr(lower(NEW.payload_json), '\ud') > 0 AND (
                            (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                            OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*')))))) THEN 4
            WHEN k.id > 1 AND NOT EXISTS (SELECT 1 FROM cassette_messages NOT INDEXED WHERE message_id = k.id - 1) THEN 5
            WHEN EXISTS (SELECT 1 FROM cassette_messages WHERE message_id > k.id) THEN 6 END AS broken
          FROM (SELECT CASE WHEN NEW.message_id = -1 THEN coalesce((SELECT message_id FROM cassette_messages NOT INDEXED ORDER BY message_id DESC LIMIT 1), 0) + 1 ELSE NEW.message_id END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.run_id IS NOT NULL AND NEW.source IS NOT NULL AND NEW.payload_json IS NOT NULL AND NEW.created_at IS NOT NULL
      AND (r.id > 0
           AND coalesce(length(NEW.run_id) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.source = 'USER' OR NEW.source = 'PLANNER' OR NEW.source = 'SYSTEM' OR NEW.source = 'WORKER', 1)
           AND coalesce(length(NEW.idempotency_key) BETWEEN 1 AND 200, 1)
           AND coalesce(CASE WHEN json_valid(NEW.payload_json) THEN json_type(NEW.payload_json) = 'object' ELSE 0 END, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

-- A message_id is used once, and an idempotency key once per run (posting with it again
-- returns the first message, in the package). Fires before the rules.
CREATE TRIGGER cassette_messages_insert_guard BEFORE INSERT ON cassette_messages
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: a message with this message_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_messages WHERE message_id = NEW.message_id);
    SELECT RAISE(ABORT, 'IDEMPOTENCY_CONFLICT: a message with this run_id and idempotency_key exists')
    WHERE NEW.idempotency_key IS NOT NULL
      AND EXISTS (SELECT 1 FROM cassette_messages
                  WHERE run_id = NEW.run_id AND idempotency_key = NEW.idempotency_key);
END;

-- ============================================================================
-- cassette_jobs

-- A job of a message: an intent and its ordinal in the message, created with it.
CREATE TABLE cassette_jobs (
    job_id INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (job_id > 0),
    message_id INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    intent TEXT NOT NULL CONSTRAINT INVALID_INTENT CHECK (length(intent) BETWEEN 1 AND 200),
    ordinal INTEGER NOT NULL CONSTRAINT INVALID_ORDINAL CHECK (ordinal >= 0),
    created_at INTEGER NOT NULL,
    UNIQUE (message_id, ordinal)
) STRICT;

-- Append-only.
CREATE TRIGGER cassette_jobs_no_update BEFORE UPDATE ON cassette_jobs
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_jobs rows cannot be updated'); END;

CREATE TRIGGER cassette_jobs_no_delete BEFORE DELETE ON cassette_jobs
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_jobs rows cannot be deleted'); END;

-- The rules every row meets (journal, time, dense ids): see cassette_messages_rules.
CREATE TRIGGER cassette_jobs_rules BEFORE INSERT ON cassette_jobs
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection')
        WHEN 2 THEN RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
        WHEN 3 THEN RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time')
        WHEN 4 THEN RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: job_id must follow the last one') END
    FROM (SELECT k.id, CASE
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_jobs', 'op', 'INSERT', 'key', k.id,
                  'row', json_object('job_id', k.id, 'message_id', NEW.message_id, 'run_id', NEW.run_id,
                           'intent', NEW.intent, 'ordinal', NEW.ordinal,
                           'created_at', NEW.created_at)) THEN 1
            WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999 THEN 2
            WHEN NEW.created_at < (SELECT ms FROM cassette_ledger_time) THEN 3
            WHEN k.id > 1 AND NOT EXISTS (SELECT 1 FROM cassette_jobs NOT INDEXED WHERE job_id = k.id - 1) THEN 4 END AS broken
          FROM (SELECT CASE WHEN NEW.job_id = -1 THEN coalesce((SELECT job_id FROM cassette_jobs NOT INDEXED ORDER BY job_id DESC LIMIT 1), 0) + 1 ELSE NEW.job_id END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.message_id IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.intent IS NOT NULL AND NEW.ordinal IS NOT NULL AND NEW.created_at IS NOT NULL
      AND (r.id > 0
           AND coalesce(length(NEW.intent) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.ordinal >= 0, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

-- A job is written once per (message, ordinal), under an existing message of its run.
CREATE TRIGGER cassette_jobs_insert_guard BEFORE INSERT ON cassette_jobs
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: a job with this job_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_jobs WHERE job_id = NEW.job_id);
    SELECT RAISE(ABORT, 'APPEND_ONLY: a job with this message_id and ordinal exists')
    WHERE EXISTS (SELECT 1 FROM cassette_jobs
                  WHERE message_id = NEW.message_id AND ordinal = NEW.ordinal);
    SELECT RAISE(ABORT, 'REFERENCE_MISSING: the job''s message does not exist')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_messages WHERE message_id = NEW.message_id);
    SELECT RAISE(ABORT, 'RUN_MISMATCH: a job''s run_id must equal its message''s run_id')
    WHERE NEW.run_id IS NOT (SELECT run_id FROM cassette_messages WHERE message_id = NEW.message_id);
END;

-- ==== TEMP: installed on every package connection, not kept in the file ====

-- The journal triggers of messages and jobs (the encoding: 50_journal.sql, TEMP section).

CREATE TEMP TRIGGER cassette_messages_journal BEFORE INSERT ON main.cassette_messages
-- (only a row its NOT NULL and CHECK constraints will take: 50_journal.sql, TEMP section)
WHEN NEW.run_id IS NOT NULL AND NEW.source IS NOT NULL AND NEW.payload_json IS NOT NULL AND NEW.created_at IS NOT NULL
 AND ((NEW.message_id > 0 OR NEW.message_id = -1)
           AND coalesce(length(NEW.run_id) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.source = 'USER' OR NEW.source = 'PLANNER' OR NEW.source = 'SYSTEM' OR NEW.source = 'WORKER', 1)
           AND coalesce(length(NEW.idempotency_key) BETWEEN 1 AND 200, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints))
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_messages', 'op', 'INSERT', 'key', k.id,
                           'row', json_object(
                               'message_id', k.id, 'run_id', NEW.run_id,
                               'source', NEW.source, 'idempotency_key', NEW.idempotency_key,
                               'payload_json', NEW.payload_json, 'created_at', NEW.created_at)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h,
                     (SELECT CASE WHEN NEW.message_id = -1
                                  THEN coalesce((SELECT message_id FROM cassette_messages NOT INDEXED
                                                 ORDER BY message_id DESC LIMIT 1), 0) + 1
                                  ELSE NEW.message_id END AS id) k
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END;

CREATE TEMP TRIGGER cassette_jobs_journal BEFORE INSERT ON main.cassette_jobs
-- (only a row its NOT NULL and CHECK constraints will take: 50_journal.sql, TEMP section)
WHEN NEW.message_id IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.intent IS NOT NULL AND NEW.ordinal IS NOT NULL AND NEW.created_at IS NOT NULL
 AND ((NEW.job_id > 0 OR NEW.job_id = -1)
           AND coalesce(length(NEW.intent) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.ordinal >= 0, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints))
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_jobs', 'op', 'INSERT', 'key', k.id,
                           'row', json_object(
                               'job_id', k.id, 'message_id', NEW.message_id,
                               'run_id', NEW.run_id, 'intent', NEW.intent,
                               'ordinal', NEW.ordinal, 'created_at', NEW.created_at)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h,
                     (SELECT CASE WHEN NEW.job_id = -1
                                  THEN coalesce((SELECT job_id FROM cassette_jobs NOT INDEXED
                                                 ORDER BY job_id DESC LIMIT 1), 0) + 1
                                  ELSE NEW.job_id END AS id) k
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END;
