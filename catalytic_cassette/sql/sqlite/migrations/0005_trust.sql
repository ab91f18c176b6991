-- 0005: rules that hold even for a client that registers look-alike functions.
--
-- Until now some guards asked "is this a package connection?" (pragma_function_list) or
-- called a package function to check a hash. A client that registers functions of the
-- same names passes both. The rules below use SQLite built-ins only, so they bound what
-- such a client can write: ids stay dense, numbers stay readable, artifact references
-- stay inside their folder, tree nodes never run ahead of the journal, no migration or
-- meta row can be invented, and ledger time never runs backwards (LAW.md, "Threat model").
-- Lookups name their index (INDEXED BY) or read the table itself (NOT INDEXED), so that
-- planner statistics written by anyone (ANALYZE, sqlite_stat1) cannot turn them into scans.
-- The new checks run AFTER the write (the statement still rolls back whole), so that
-- every older guard keeps its precedence: SQLite fires the newest trigger first.

-- ------------------------------------------------------------------ dense ids
-- Every ledger id is the next one: 1, 2, 3, ... A row with an id far ahead (2^63 - 1,
-- say) would make every later insert fail; a dense id cannot get there.

CREATE TRIGGER cassette_messages_dense AFTER INSERT ON cassette_messages
WHEN NEW.message_id > 1
 AND NOT EXISTS (SELECT 1 FROM cassette_messages NOT INDEXED WHERE message_id = NEW.message_id - 1)
BEGIN SELECT RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: message_id must follow the last one'); END;

CREATE TRIGGER cassette_jobs_dense AFTER INSERT ON cassette_jobs
WHEN NEW.job_id > 1
 AND NOT EXISTS (SELECT 1 FROM cassette_jobs NOT INDEXED WHERE job_id = NEW.job_id - 1)
BEGIN SELECT RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: job_id must follow the last one'); END;

CREATE TRIGGER cassette_steps_dense AFTER INSERT ON cassette_steps
WHEN NEW.step_id > 1
 AND NOT EXISTS (SELECT 1 FROM cassette_steps NOT INDEXED WHERE step_id = NEW.step_id - 1)
BEGIN SELECT RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: step_id must follow the last one'); END;

CREATE TRIGGER cassette_receipts_dense AFTER INSERT ON cassette_receipts
WHEN NEW.receipt_id > 1
 AND NOT EXISTS (SELECT 1 FROM cassette_receipts NOT INDEXED WHERE receipt_id = NEW.receipt_id - 1)
BEGIN SELECT RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: receipt_id must follow the last one'); END;

CREATE TRIGGER cassette_releases_dense AFTER INSERT ON cassette_releases
WHEN NEW.release_id > 1
 AND NOT EXISTS (SELECT 1 FROM cassette_releases NOT INDEXED WHERE release_id = NEW.release_id - 1)
BEGIN SELECT RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: release_id must follow the last one'); END;

CREATE TRIGGER cassette_actions_dense AFTER INSERT ON cassette_actions
WHEN NEW.action_seq > 1
 AND NOT EXISTS (SELECT 1 FROM cassette_actions NOT INDEXED WHERE action_seq = NEW.action_seq - 1)
BEGIN SELECT RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: action_seq must follow the last one'); END;

CREATE TRIGGER cassette_checkpoints_dense AFTER INSERT ON cassette_checkpoints
WHEN NEW.checkpoint_seq > 1
 AND NOT EXISTS (SELECT 1 FROM cassette_checkpoints NOT INDEXED
                 WHERE checkpoint_seq = NEW.checkpoint_seq - 1)
BEGIN SELECT RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: checkpoint_seq must follow the last one'); END;

CREATE TRIGGER cassette_seals_dense AFTER INSERT ON cassette_seals
WHEN NEW.seal_id > 1
 AND NOT EXISTS (SELECT 1 FROM cassette_seals NOT INDEXED WHERE seal_id = NEW.seal_id - 1)
BEGIN SELECT RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: seal_id must follow the last one'); END;

-- ------------------------------------------------------------ readable JSON
-- SQLite accepts as JSON what the API cannot read back: {"a": 1e400} (an infinite double),
-- integers beyond 64 bits, nesting deeper than 1024 (SQLite allows 2000), and lone
-- surrogate escapes such as "\ud800" (SQLite stores them as the bytes ED A0..BF, which
-- no valid UTF-8 holds, and GLOB reads them back as the code points U+D800..U+DFFF). A step whose payload the API cannot read would refuse every
-- claim of its run. Only text that could hold one of these (a digit followed by an
-- exponent, 19 digits in a row, more than 2048 characters, or "\ud") pays for the walk.
-- Nesting: wrapped in 976 more levels, a document deeper than 1024 exceeds SQLite's 2000.

CREATE TRIGGER cassette_messages_readable AFTER INSERT ON cassette_messages
WHEN NEW.payload_json GLOB '*[0-9][eE]*' OR NEW.payload_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.payload_json) > 2048 OR instr(lower(NEW.payload_json), '\ud') > 0
BEGIN
    SELECT RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
    WHERE json_valid(NEW.payload_json) AND (
        (length(NEW.payload_json) > 2048
         AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.payload_json
                            || replace(hex(zeroblob(975)), '00', ']') || ']'))
        OR EXISTS (
            SELECT 1 FROM json_tree(NEW.payload_json)
            WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
               OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
               OR (instr(lower(NEW.payload_json), '\ud') > 0 AND (
                   (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                   OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))))));
END;

CREATE TRIGGER cassette_steps_readable AFTER INSERT ON cassette_steps
WHEN NEW.payload_json GLOB '*[0-9][eE]*' OR NEW.payload_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.payload_json) > 2048 OR instr(lower(NEW.payload_json), '\ud') > 0
BEGIN
    SELECT RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
    WHERE json_valid(NEW.payload_json) AND (
        (length(NEW.payload_json) > 2048
         AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.payload_json
                            || replace(hex(zeroblob(975)), '00', ']') || ']'))
        OR EXISTS (
            SELECT 1 FROM json_tree(NEW.payload_json)
            WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
               OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
               OR (instr(lower(NEW.payload_json), '\ud') > 0 AND (
                   (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                   OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))))));
END;

CREATE TRIGGER cassette_receipts_readable AFTER INSERT ON cassette_receipts
WHEN NEW.receipt_json GLOB '*[0-9][eE]*' OR NEW.receipt_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.receipt_json) > 2048 OR instr(lower(NEW.receipt_json), '\ud') > 0
BEGIN
    SELECT RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
    WHERE json_valid(NEW.receipt_json) AND (
        (length(NEW.receipt_json) > 2048
         AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.receipt_json
                            || replace(hex(zeroblob(975)), '00', ']') || ']'))
        OR EXISTS (
            SELECT 1 FROM json_tree(NEW.receipt_json)
            WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
               OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
               OR (instr(lower(NEW.receipt_json), '\ud') > 0 AND (
                   (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                   OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))))));
END;

CREATE TRIGGER cassette_checkpoints_readable AFTER INSERT ON cassette_checkpoints
WHEN NEW.context_json GLOB '*[0-9][eE]*' OR NEW.context_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.context_json) > 2048 OR instr(lower(NEW.context_json), '\ud') > 0
BEGIN
    SELECT RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
    WHERE json_valid(NEW.context_json) AND (
        (length(NEW.context_json) > 2048
         AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.context_json
                            || replace(hex(zeroblob(975)), '00', ']') || ']'))
        OR EXISTS (
            SELECT 1 FROM json_tree(NEW.context_json)
            WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
               OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
               OR (instr(lower(NEW.context_json), '\ud') > 0 AND (
                   (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                   OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))))));
END;

CREATE TRIGGER cassette_actions_readable_arguments AFTER INSERT ON cassette_actions
WHEN NEW.arguments_json GLOB '*[0-9][eE]*' OR NEW.arguments_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.arguments_json) > 2048 OR instr(lower(NEW.arguments_json), '\ud') > 0
BEGIN
    SELECT RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
    WHERE json_valid(NEW.arguments_json) AND (
        (length(NEW.arguments_json) > 2048
         AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.arguments_json
                            || replace(hex(zeroblob(975)), '00', ']') || ']'))
        OR EXISTS (
            SELECT 1 FROM json_tree(NEW.arguments_json)
            WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
               OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
               OR (instr(lower(NEW.arguments_json), '\ud') > 0 AND (
                   (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                   OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))))));
END;

CREATE TRIGGER cassette_actions_readable_result AFTER INSERT ON cassette_actions
WHEN NEW.result_json GLOB '*[0-9][eE]*' OR NEW.result_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.result_json) > 2048 OR instr(lower(NEW.result_json), '\ud') > 0
BEGIN
    SELECT RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
    WHERE json_valid(NEW.result_json) AND (
        (length(NEW.result_json) > 2048
         AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.result_json
                            || replace(hex(zeroblob(975)), '00', ']') || ']'))
        OR EXISTS (
            SELECT 1 FROM json_tree(NEW.result_json)
            WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
               OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
               OR (instr(lower(NEW.result_json), '\ud') > 0 AND (
                   (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                   OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))))));
END;

CREATE TRIGGER cassette_actions_readable_metadata AFTER INSERT ON cassette_actions
WHEN NEW.metadata_json GLOB '*[0-9][eE]*' OR NEW.metadata_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.metadata_json) > 2048 OR instr(lower(NEW.metadata_json), '\ud') > 0
BEGIN
    SELECT RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
    WHERE json_valid(NEW.metadata_json) AND (
        (length(NEW.metadata_json) > 2048
         AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.metadata_json
                            || replace(hex(zeroblob(975)), '00', ']') || ']'))
        OR EXISTS (
            SELECT 1 FROM json_tree(NEW.metadata_json)
            WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
               OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
               OR (instr(lower(NEW.metadata_json), '\ud') > 0 AND (
                   (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                   OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))))));
END;

CREATE TRIGGER cassette_actions_readable_arguments_artifact AFTER INSERT ON cassette_actions
WHEN NEW.arguments_artifact GLOB '*[0-9][eE]*' OR NEW.arguments_artifact GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.arguments_artifact) > 2048 OR instr(lower(NEW.arguments_artifact), '\ud') > 0
BEGIN
    SELECT RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
    WHERE json_valid(NEW.arguments_artifact) AND (
        (length(NEW.arguments_artifact) > 2048
         AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.arguments_artifact
                            || replace(hex(zeroblob(975)), '00', ']') || ']'))
        OR EXISTS (
            SELECT 1 FROM json_tree(NEW.arguments_artifact)
            WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
               OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
               OR (instr(lower(NEW.arguments_artifact), '\ud') > 0 AND (
                   (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                   OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))))));
END;

CREATE TRIGGER cassette_actions_readable_result_artifact AFTER INSERT ON cassette_actions
WHEN NEW.result_artifact GLOB '*[0-9][eE]*' OR NEW.result_artifact GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
  OR length(NEW.result_artifact) > 2048 OR instr(lower(NEW.result_artifact), '\ud') > 0
BEGIN
    SELECT RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
    WHERE json_valid(NEW.result_artifact) AND (
        (length(NEW.result_artifact) > 2048
         AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.result_artifact
                            || replace(hex(zeroblob(975)), '00', ']') || ']'))
        OR EXISTS (
            SELECT 1 FROM json_tree(NEW.result_artifact)
            WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
               OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
               OR (instr(lower(NEW.result_artifact), '\ud') > 0 AND (
                   (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                   OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))))));
END;

-- ------------------------------------------------------------------ artifacts
-- A reference names content by its hash: 64 lowercase hex digits, a size, and a path
-- relative to the ledger's folder that ends in that hash and never climbs out of it.

CREATE TRIGGER cassette_actions_artifact_refs AFTER INSERT ON cassette_actions
WHEN NEW.arguments_artifact IS NOT NULL OR NEW.result_artifact IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'INVALID_ARTIFACT: a reference is {"sha256": 64 hex digits, "size": n >= 0, "path": "<folder>/<sha256>"}')
    FROM (SELECT NEW.arguments_artifact AS ref UNION ALL SELECT NEW.result_artifact)
    WHERE ref IS NOT NULL
      AND NOT coalesce(CASE WHEN json_valid(ref) AND json_type(ref) = 'object' THEN
              json_type(ref, '$.sha256') = 'text'
              AND length(json_extract(ref, '$.sha256')) = 64
              AND json_extract(ref, '$.sha256') NOT GLOB '*[^0-9a-f]*'
              AND json_type(ref, '$.size') = 'integer' AND json_extract(ref, '$.size') >= 0
              AND (json_type(ref, '$.path') IS NULL OR (
                   json_type(ref, '$.path') = 'text'
                   AND json_extract(ref, '$.path') NOT GLOB '/*'
                   AND '/' || json_extract(ref, '$.path') || '/' NOT GLOB '*/../*'
                   AND '/' || json_extract(ref, '$.path') || '/' NOT GLOB '*/./*'
                   AND instr(json_extract(ref, '$.path'), char(92)) = 0
                   AND json_extract(ref, '$.path') GLOB '*/' || json_extract(ref, '$.sha256')))
          END, 0);
END;

-- ------------------------------------------------------------------- the tree
-- A node covers only entries the journal has: a node planted ahead of the journal would
-- collide with the node the journal later completes, and every append would fail.

CREATE TRIGGER cassette_tree_nodes_bounded BEFORE INSERT ON cassette_tree_nodes
BEGIN
    SELECT RAISE(ABORT, 'TREE_BROKEN: a tree node covers only journaled entries')
    WHERE typeof(NEW.leaf_end) IS NOT 'integer'
       OR NEW.leaf_end > coalesce((SELECT seq FROM cassette_journal NOT INDEXED
                                   ORDER BY seq DESC LIMIT 1), -1);
END;

-- ------------------------------------------------------- migrations and meta
-- A migration records itself, once: each migration from this one on re-creates this
-- guard naming its own version and name, so nobody can record a version the package
-- does not ship (a version from the future would refuse every open).

DROP TRIGGER cassette_migrations_insert_guard;
CREATE TRIGGER cassette_migrations_insert_guard BEFORE INSERT ON cassette_migrations
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be replaced')
    WHERE EXISTS (SELECT 1 FROM cassette_migrations WHERE version = NEW.version);
    SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: only a cassette connection migrates the ledger')
    WHERE NOT EXISTS (SELECT 1 FROM pragma_function_list WHERE name = 'cassette_chain_hash');
    SELECT RAISE(ABORT, 'MIGRATION_FAILED: only the migration being applied records itself')
    WHERE NEW.version IS NOT 5 OR NEW.name IS NOT 'trust'
       OR typeof(NEW.sha256) IS NOT 'text' OR length(NEW.sha256) IS NOT 64
       OR NEW.sha256 GLOB '*[^0-9a-f]*';
END;

-- The ledger's meta rows are its format and its id, written by migrations 1 and 4.
DROP TRIGGER cassette_meta_insert_guard;
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

-- ------------------------------------------------------------------ ledger time
-- The ledger's time is the latest time it has recorded: the newest row of each dated
-- table (rows are dense and times never decrease, so the newest row holds the latest
-- time). A write is never dated before it. The checks run after the insert (so every
-- older guard keeps its precedence); the new row is then its table's newest, so each
-- also compares with the row before it. Honest writers date their rows
-- max(their clock, ledger time), so someone else's future date never blocks them;
-- verify reports dates in the future and large forward jumps (LAW.md, "Time").

CREATE VIEW cassette_ledger_time (ms) AS
SELECT max(
    coalesce((SELECT created_at FROM cassette_messages NOT INDEXED ORDER BY message_id DESC LIMIT 1), 0),
    coalesce((SELECT created_at FROM cassette_jobs NOT INDEXED ORDER BY job_id DESC LIMIT 1), 0),
    coalesce((SELECT created_at FROM cassette_steps NOT INDEXED ORDER BY step_id DESC LIMIT 1), 0),
    coalesce((SELECT created_at FROM cassette_receipts NOT INDEXED ORDER BY receipt_id DESC LIMIT 1), 0),
    coalesce((SELECT created_at FROM cassette_releases NOT INDEXED ORDER BY release_id DESC LIMIT 1), 0),
    coalesce((SELECT timestamp FROM cassette_actions NOT INDEXED ORDER BY action_seq DESC LIMIT 1), 0),
    coalesce((SELECT created_at FROM cassette_checkpoints NOT INDEXED ORDER BY checkpoint_seq DESC LIMIT 1), 0),
    coalesce((SELECT created_at FROM cassette_seals NOT INDEXED ORDER BY seal_id DESC LIMIT 1), 0));

CREATE TRIGGER cassette_messages_time AFTER INSERT ON cassette_messages
WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999
  OR NEW.created_at < (SELECT ms FROM cassette_ledger_time) OR NEW.created_at < (SELECT created_at FROM cassette_messages NOT INDEXED WHERE message_id = NEW.message_id - 1)
BEGIN
    SELECT RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
    WHERE typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999;
    SELECT RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time');
END;

CREATE TRIGGER cassette_jobs_time AFTER INSERT ON cassette_jobs
WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999
  OR NEW.created_at < (SELECT ms FROM cassette_ledger_time) OR NEW.created_at < (SELECT created_at FROM cassette_jobs NOT INDEXED WHERE job_id = NEW.job_id - 1)
BEGIN
    SELECT RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
    WHERE typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999;
    SELECT RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time');
END;

CREATE TRIGGER cassette_steps_time AFTER INSERT ON cassette_steps
WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999
  OR NEW.created_at < (SELECT ms FROM cassette_ledger_time) OR NEW.created_at < (SELECT created_at FROM cassette_steps NOT INDEXED WHERE step_id = NEW.step_id - 1)
BEGIN
    SELECT RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
    WHERE typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999;
    SELECT RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time');
END;

CREATE TRIGGER cassette_receipts_time AFTER INSERT ON cassette_receipts
WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999
  OR NEW.created_at < (SELECT ms FROM cassette_ledger_time) OR NEW.created_at < (SELECT created_at FROM cassette_receipts NOT INDEXED WHERE receipt_id = NEW.receipt_id - 1)
BEGIN
    SELECT RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
    WHERE typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999;
    SELECT RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time');
END;

CREATE TRIGGER cassette_releases_time AFTER INSERT ON cassette_releases
WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999
  OR NEW.created_at < (SELECT ms FROM cassette_ledger_time) OR NEW.created_at < (SELECT created_at FROM cassette_releases NOT INDEXED WHERE release_id = NEW.release_id - 1)
BEGIN
    SELECT RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
    WHERE typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999;
    SELECT RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time');
END;

CREATE TRIGGER cassette_actions_time AFTER INSERT ON cassette_actions
WHEN typeof(NEW.timestamp) IS NOT 'integer' OR NEW.timestamp > 253402300799999
  OR NEW.timestamp < (SELECT ms FROM cassette_ledger_time) OR NEW.timestamp < (SELECT timestamp FROM cassette_actions NOT INDEXED WHERE action_seq = NEW.action_seq - 1)
BEGIN
    SELECT RAISE(ABORT, 'INVALID_TIME: timestamp is an integer of epoch ms before the year 10000')
    WHERE typeof(NEW.timestamp) IS NOT 'integer' OR NEW.timestamp > 253402300799999;
    SELECT RAISE(ABORT, 'TIME_BACKWARDS: timestamp is an integer no earlier than the ledger''s latest time');
END;

CREATE TRIGGER cassette_checkpoints_time AFTER INSERT ON cassette_checkpoints
WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999
  OR NEW.created_at < (SELECT ms FROM cassette_ledger_time) OR NEW.created_at < (SELECT created_at FROM cassette_checkpoints NOT INDEXED WHERE checkpoint_seq = NEW.checkpoint_seq - 1)
BEGIN
    SELECT RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
    WHERE typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999;
    SELECT RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time');
END;

CREATE TRIGGER cassette_seals_time AFTER INSERT ON cassette_seals
WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999
  OR NEW.created_at < (SELECT ms FROM cassette_ledger_time) OR NEW.created_at < (SELECT created_at FROM cassette_seals NOT INDEXED WHERE seal_id = NEW.seal_id - 1)
BEGIN
    SELECT RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
    WHERE typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999;
    SELECT RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time');
END;

-- A lease cannot be born expired in ledger time (the package's clock guard also holds
-- it against the writer's clock, and caps it at 30 days).
CREATE TRIGGER cassette_steps_lease_time AFTER UPDATE ON cassette_steps
WHEN OLD.status = 'PENDING' AND NEW.status IS 'LEASED'
 AND typeof(NEW.lease_expires_at) = 'integer'
 AND (NEW.lease_expires_at <= (SELECT ms FROM cassette_ledger_time)
      OR NEW.lease_expires_at > 253402300799999 + 2592000000)
BEGIN SELECT RAISE(ABORT, 'INVALID_TTL: a lease expires after the ledger''s latest time, within 30 days of a time before the year 10000'); END;

-- ------------------------------------------------------- statistics-proof lookups
-- Re-created with INDEXED BY: whatever sqlite_stat1 says, the journaled check is one
-- index probe, never a journal scan.

DROP TRIGGER cassette_messages_journaled;
CREATE TRIGGER cassette_messages_journaled AFTER INSERT ON cassette_messages
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal INDEXED BY cassette_journal_by_row
                 WHERE tbl = 'cassette_messages' AND row_key = +NEW.message_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

DROP TRIGGER cassette_jobs_journaled;
CREATE TRIGGER cassette_jobs_journaled AFTER INSERT ON cassette_jobs
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal INDEXED BY cassette_journal_by_row
                 WHERE tbl = 'cassette_jobs' AND row_key = +NEW.job_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

DROP TRIGGER cassette_steps_journaled;
CREATE TRIGGER cassette_steps_journaled AFTER INSERT ON cassette_steps
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal INDEXED BY cassette_journal_by_row
                 WHERE tbl = 'cassette_steps' AND row_key = +NEW.step_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

DROP TRIGGER cassette_receipts_journaled;
CREATE TRIGGER cassette_receipts_journaled AFTER INSERT ON cassette_receipts
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal INDEXED BY cassette_journal_by_row
                 WHERE tbl = 'cassette_receipts' AND row_key = +NEW.receipt_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

DROP TRIGGER cassette_releases_journaled;
CREATE TRIGGER cassette_releases_journaled AFTER INSERT ON cassette_releases
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal INDEXED BY cassette_journal_by_row
                 WHERE tbl = 'cassette_releases' AND row_key = +NEW.release_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

DROP TRIGGER cassette_actions_journaled;
CREATE TRIGGER cassette_actions_journaled AFTER INSERT ON cassette_actions
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal INDEXED BY cassette_journal_by_row
                 WHERE tbl = 'cassette_actions' AND row_key = +NEW.action_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

DROP TRIGGER cassette_checkpoints_journaled;
CREATE TRIGGER cassette_checkpoints_journaled AFTER INSERT ON cassette_checkpoints
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal INDEXED BY cassette_journal_by_row
                 WHERE tbl = 'cassette_checkpoints' AND row_key = +NEW.checkpoint_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;

DROP TRIGGER cassette_seals_journaled;
CREATE TRIGGER cassette_seals_journaled AFTER INSERT ON cassette_seals
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal INDEXED BY cassette_journal_by_row
                 WHERE tbl = 'cassette_seals' AND row_key = +NEW.seal_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;
