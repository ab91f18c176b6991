-- Migration 0011: every rule of a ledger row is checked before the row is written.
--
-- SQLite runs a connection's TEMP triggers before the file's own, and RAISE(IGNORE) in an
-- AFTER trigger ends the row's remaining triggers with the row kept. So a client that
-- creates `CREATE TEMP TRIGGER t AFTER INSERT ON main.<table> BEGIN SELECT RAISE(IGNORE);
-- END` skipped every AFTER trigger of the file for its rows: journaled or refused, dense
-- ids and their order, readable JSON, ledger time, causes in time, suggested causes and
-- plan bodies (LAW.md section 12 (a), the gap found in issue 12's fifth pass). In a
-- BEFORE trigger IGNORE drops the row: nothing is written, which is no bypass.
--
-- So those rules move into one BEFORE trigger per table and event (`<table>_rules`,
-- `cassette_steps_update_rules`), and the journal entry is written before the row: the
-- package's TEMP journal triggers (schema/connection.sql) became BEFORE triggers, and the
-- rules trigger checks that the journal's last entry is exactly the body the row gives
-- (the whole body, built here with json_object as the package builds it: a raw connection
-- cannot write the journal at all, and no entry but the row's own can be the last one when
-- the row's rules run). Bodies, hashes, tree nodes and seals are unchanged, and so is the
-- order of entries: a receipt's entry still comes before its step's, written by the
-- receipt's AFTER trigger that commits the step (and a release's before its requeue).
--
-- Same rules, same codes, same order:
-- * A rules trigger is created before the table's guards, which are dropped and re-created
--   with their text after it: SQLite fires the newest BEFORE trigger first, so the guards
--   still fire first and the rules after them, in the order their AFTER triggers fired.
-- * NOT NULL and CHECK constraints are tested after every BEFORE trigger and before the
--   AFTER ones: a row that broke one of them and a rule got the constraint's code. So a
--   rule refuses only a row that passes the table's NOT NULL and CHECK constraints (tested
--   only when a rule is broken, never on the write path that breaks none); any other row
--   is left to its constraint, as before. While PRAGMA ignore_check_constraints is on,
--   no CHECK refuses anything, so only NOT NULL counts then (as before, the rules refuse).
--   The package's journal triggers write only for a row those constraints (but for those
--   on JSON text, see schema/connection.sql) will take, so an INSERT OR IGNORE that skips
--   a row leaves no entry behind.
-- * In a BEFORE trigger SQLite gives an INTEGER PRIMARY KEY inserted as NULL the value -1
--   (its rowid is chosen later): the rules and the journal take -1 as the next id, one
--   more than the table's last, which is what SQLite then gives the row (the dense rule
--   leaves no other choice). An explicit -1 breaks INVALID_ID as before, but on a raw
--   connection it is now refused JOURNAL_REQUIRED first.
-- * Time: in an AFTER trigger the row was its table's last, so the ledger's time covered
--   the other tables and the row before; before the insert it covers the table's last
--   row, which is the row before (ids are dense). A row that both skips ids and is dated
--   before its table's last row is TIME_BACKWARDS now, OUT_OF_ORDER before.
-- * A seal's journal entry is now written before its guard reads the journal's size: the
--   guard does not count the seal's own entry.
-- What stays AFTER: the receipt's commit of its step and the release's requeue (their
-- writes are the row's consequence, journaled by the step's own rules); the action's
-- readable checks stay on their view (0010), reached from the rules trigger.

-- ------------------------------------------------------------ cassette_jobs
DROP TRIGGER cassette_jobs_dense;
DROP TRIGGER cassette_jobs_time;
DROP TRIGGER cassette_jobs_journaled;
DROP TRIGGER cassette_jobs_insert_guard;

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

-- The guards of cassette_jobs, re-created with their text, in their order (they fire first).

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

-- ------------------------------------------------------------ cassette_releases
DROP TRIGGER cassette_releases_dense;
DROP TRIGGER cassette_releases_time;
DROP TRIGGER cassette_releases_journaled;
DROP TRIGGER cassette_releases_insert_guard;
DROP TRIGGER cassette_releases_signature_guard;

CREATE TRIGGER cassette_releases_rules BEFORE INSERT ON cassette_releases
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection')
        WHEN 2 THEN RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
        WHEN 3 THEN RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time')
        WHEN 4 THEN RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: release_id must follow the last one') END
    FROM (SELECT k.id, CASE
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_releases', 'op', 'INSERT', 'key', k.id,
                  'row', json_object('release_id', k.id, 'step_id', NEW.step_id, 'run_id', NEW.run_id,
                           'worker_id', NEW.worker_id, 'fencing_token', NEW.fencing_token,
                           'created_at', NEW.created_at)) THEN 1
            WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999 THEN 2
            WHEN NEW.created_at < (SELECT ms FROM cassette_ledger_time) THEN 3
            WHEN k.id > 1 AND NOT EXISTS (SELECT 1 FROM cassette_releases NOT INDEXED WHERE release_id = k.id - 1) THEN 4 END AS broken
          FROM (SELECT CASE WHEN NEW.release_id = -1 THEN coalesce((SELECT release_id FROM cassette_releases NOT INDEXED ORDER BY release_id DESC LIMIT 1), 0) + 1 ELSE NEW.release_id END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.step_id IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.worker_id IS NOT NULL AND NEW.fencing_token IS NOT NULL AND NEW.created_at IS NOT NULL
      AND (r.id > 0
           AND coalesce(length(NEW.worker_id) BETWEEN 1 AND 200, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

-- The guards of cassette_releases, re-created with their text, in their order (they fire first).

CREATE TRIGGER cassette_releases_insert_guard BEFORE INSERT ON cassette_releases
BEGIN
    SELECT RAISE(ABORT, 'INVALID_WORKER: worker_id is a string of 1-200 characters')
    WHERE typeof(NEW.worker_id) IS NOT 'text' OR length(NEW.worker_id) NOT BETWEEN 1 AND 200;
    SELECT RAISE(ABORT, 'APPEND_ONLY: a release with this release_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_releases WHERE release_id = NEW.release_id);
    SELECT RAISE(ABORT, 'APPEND_ONLY: a release of this step with this token exists')
    WHERE EXISTS (SELECT 1 FROM cassette_releases
                  WHERE step_id = NEW.step_id AND fencing_token = NEW.fencing_token);
    SELECT RAISE(ABORT, 'STEP_NOT_FOUND: the released step does not exist')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'RUN_MISMATCH: the step belongs to another run')
    WHERE NEW.run_id IS NOT (SELECT run_id FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'NOT_LEASED: only a LEASED step can be released')
    WHERE (SELECT status FROM cassette_steps WHERE step_id = NEW.step_id) IS NOT 'LEASED';
    SELECT RAISE(ABORT, 'STALE_FENCING_TOKEN: the token is not the step''s current token')
    WHERE NEW.fencing_token IS NOT (SELECT fencing_token FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'WRONG_WORKER: only the lease owner releases a step')
    WHERE NEW.worker_id IS NOT (SELECT lease_owner FROM cassette_steps WHERE step_id = NEW.step_id);
END;

CREATE TRIGGER cassette_releases_signature_guard BEFORE INSERT ON cassette_releases
WHEN EXISTS (SELECT 1 FROM cassette_steps s
             WHERE s.step_id = NEW.step_id AND s.status = 'LEASED' AND s.run_id IS NEW.run_id
               AND s.fencing_token IS NEW.fencing_token AND s.lease_owner IS NEW.worker_id)
BEGIN
    SELECT RAISE(ABORT, 'SIGNATURE_REQUIRED: this lease was claimed signed; its worker must attest the release')
    FROM cassette_attestations c
    WHERE c.step_id = NEW.step_id AND c.fencing_token = NEW.fencing_token
      AND c.act = 'claim' AND c.worker_id = NEW.worker_id
      AND NOT EXISTS (SELECT 1 FROM cassette_attestations a
                      WHERE a.step_id = NEW.step_id AND a.fencing_token = NEW.fencing_token
                        AND a.act = 'release' AND a.worker_id = c.worker_id
                        AND a.key_id = c.key_id);
END;

-- ------------------------------------------------------------ cassette_checkpoints
DROP TRIGGER cassette_checkpoints_dense;
DROP TRIGGER cassette_checkpoints_readable;
DROP TRIGGER cassette_checkpoints_time;
DROP TRIGGER cassette_checkpoints_journaled;
DROP TRIGGER cassette_checkpoints_insert_guard;

CREATE TRIGGER cassette_checkpoints_rules BEFORE INSERT ON cassette_checkpoints
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection')
        WHEN 2 THEN RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
        WHEN 3 THEN RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time')
        WHEN 4 THEN RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
        WHEN 5 THEN RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: checkpoint_seq must follow the last one') END
    FROM (SELECT k.id, CASE
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_checkpoints', 'op', 'INSERT', 'key', NEW.checkpoint_id,
                  'row', json_object('checkpoint_seq', k.id, 'checkpoint_id', NEW.checkpoint_id,
                           'plan_id', NEW.plan_id, 'context_json', NEW.context_json,
                           'created_at', NEW.created_at)) THEN 1
            WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999 THEN 2
            WHEN NEW.created_at < (SELECT ms FROM cassette_ledger_time) THEN 3
            WHEN (NEW.context_json GLOB '*[0-9][eE]*' OR NEW.context_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
                  OR length(NEW.context_json) > 2048 OR instr(lower(NEW.context_json), '\ud') > 0)
             AND json_valid(NEW.context_json) AND (
                 (length(NEW.context_json) > 2048
                  AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.context_json
                                     || replace(hex(zeroblob(975)), '00', ']') || ']'))
                 OR EXISTS (
                     SELECT 1 FROM json_tree(NEW.context_json)
                     WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
                        OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
                        OR (instr(lower(NEW.context_json), '\ud') > 0 AND (
                            (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                            OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*')))))) THEN 4
            WHEN k.id > 1 AND NOT EXISTS (SELECT 1 FROM cassette_checkpoints NOT INDEXED WHERE checkpoint_seq = k.id - 1) THEN 5 END AS broken
          FROM (SELECT CASE WHEN NEW.checkpoint_seq = -1 THEN coalesce((SELECT checkpoint_seq FROM cassette_checkpoints NOT INDEXED ORDER BY checkpoint_seq DESC LIMIT 1), 0) + 1 ELSE NEW.checkpoint_seq END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.checkpoint_id IS NOT NULL AND NEW.plan_id IS NOT NULL AND NEW.context_json IS NOT NULL AND NEW.created_at IS NOT NULL
      AND (r.id > 0
           AND coalesce(length(NEW.checkpoint_id) = 67 AND substr(NEW.checkpoint_id, 1, 3) = 'cp-'
          AND substr(NEW.checkpoint_id, 4) NOT GLOB '*[^0-9a-f]*', 1)
           AND coalesce(length(NEW.plan_id) BETWEEN 1 AND 200, 1)
           AND coalesce(CASE WHEN json_valid(NEW.context_json)
               THEN json_extract(NEW.context_json, '$.plan_id') IS NEW.plan_id ELSE 0 END, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

-- The guards of cassette_checkpoints, re-created with their text, in their order (they fire first).

CREATE TRIGGER cassette_checkpoints_insert_guard BEFORE INSERT ON cassette_checkpoints
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: a checkpoint with this checkpoint_seq exists')
    WHERE EXISTS (SELECT 1 FROM cassette_checkpoints WHERE checkpoint_seq = NEW.checkpoint_seq);
    SELECT RAISE(ABORT, 'APPEND_ONLY: a checkpoint with this checkpoint_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_checkpoints WHERE checkpoint_id = NEW.checkpoint_id);
END;

-- ------------------------------------------------------------ cassette_seals
DROP TRIGGER cassette_seals_dense;
DROP TRIGGER cassette_seals_time;
DROP TRIGGER cassette_seals_journaled;
DROP TRIGGER cassette_seals_insert_guard;

CREATE TRIGGER cassette_seals_rules BEFORE INSERT ON cassette_seals
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection')
        WHEN 2 THEN RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
        WHEN 3 THEN RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time')
        WHEN 4 THEN RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: seal_id must follow the last one') END
    FROM (SELECT k.id, CASE
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_seals', 'op', 'INSERT', 'key', k.id,
                  'row', json_object('seal_id', k.id, 'tree_size', NEW.tree_size, 'root_hex', NEW.root_hex,
                           'origin', NEW.origin, 'key_id', NEW.key_id, 'note', NEW.note,
                           'created_at', NEW.created_at)) THEN 1
            WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999 THEN 2
            WHEN NEW.created_at < (SELECT ms FROM cassette_ledger_time) THEN 3
            WHEN k.id > 1 AND NOT EXISTS (SELECT 1 FROM cassette_seals NOT INDEXED WHERE seal_id = k.id - 1) THEN 4 END AS broken
          FROM (SELECT CASE WHEN NEW.seal_id = -1 THEN coalesce((SELECT seal_id FROM cassette_seals NOT INDEXED ORDER BY seal_id DESC LIMIT 1), 0) + 1 ELSE NEW.seal_id END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.tree_size IS NOT NULL AND NEW.root_hex IS NOT NULL AND NEW.origin IS NOT NULL AND NEW.key_id IS NOT NULL AND NEW.note IS NOT NULL AND NEW.created_at IS NOT NULL
      AND (r.id > 0
           AND coalesce(NEW.tree_size >= 1, 1)
           AND coalesce(length(NEW.root_hex) = 64 AND NEW.root_hex NOT GLOB '*[^0-9a-f]*', 1)
           AND coalesce(length(NEW.origin) BETWEEN 1 AND 200
          AND NEW.origin NOT GLOB '*[' || char(9, 10, 13, 32, 43) || ']*', 1)
           AND coalesce(length(NEW.key_id) = 8 AND NEW.key_id NOT GLOB '*[^0-9a-f]*', 1)
           AND coalesce(substr(NEW.note, 1, length(NEW.origin) + length(NEW.tree_size) + 2)
          = NEW.origin || char(10) || NEW.tree_size || char(10), 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

-- The guards of cassette_seals, re-created with their text, in their order (they fire first).

CREATE TRIGGER cassette_seals_insert_guard BEFORE INSERT ON cassette_seals
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: a seal with this seal_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_seals WHERE seal_id = NEW.seal_id);
    SELECT RAISE(ABORT, 'OUT_OF_ORDER: a seal_id must be larger than every existing one')
    WHERE EXISTS (SELECT 1 FROM cassette_seals WHERE seal_id > NEW.seal_id);
    SELECT RAISE(ABORT, 'INVALID_SEAL: a seal covers at least one entry')
    WHERE typeof(NEW.tree_size) IS NOT 'integer' OR NEW.tree_size < 1;
    SELECT RAISE(ABORT, 'INVALID_SEAL: a seal covers at most the entries the journal has')
    WHERE NEW.tree_size > coalesce((SELECT max(seq) + 1 FROM cassette_journal), 0)
          - (SELECT count(*) FROM cassette_journal
             WHERE seq = (SELECT max(seq) FROM cassette_journal)
               AND tbl = 'cassette_seals' AND row_key = NEW.seal_id);
    SELECT RAISE(ABORT, 'SEAL_MISMATCH: the sealed root is not the ledger''s root at that size')
    WHERE NEW.root_hex IS NOT (
        SELECT lower(hex(acc)) FROM (
            WITH RECURSIVE fold(b, started, acc) AS (
                SELECT 0, 0, NULL
                UNION ALL
                SELECT b + 1,
                       started OR (NEW.tree_size >> b) & 1,
                       CASE WHEN (NEW.tree_size >> b) & 1 = 0 THEN acc
                            WHEN b >= 8 AND started THEN cassette_node_hash(
                                (SELECT hash FROM cassette_tree_nodes
                                 WHERE level = b AND leaf_end = ((NEW.tree_size >> (b + 1)) << (b + 1))
                                                                + (1 << b) - 1),
                                acc)
                            WHEN b >= 8 THEN (SELECT hash FROM cassette_tree_nodes
                                 WHERE level = b AND leaf_end = ((NEW.tree_size >> (b + 1)) << (b + 1))
                                                                + (1 << b) - 1)
                            WHEN started THEN cassette_node_hash(
                                (SELECT cassette_subtree_hash(seq, leaf_hash) FROM cassette_journal NOT INDEXED
                                 WHERE seq BETWEEN (NEW.tree_size >> (b + 1)) << (b + 1)
                                               AND ((NEW.tree_size >> (b + 1)) << (b + 1))
                                                   + (1 << b) - 1),
                                acc)
                            ELSE (SELECT cassette_subtree_hash(seq, leaf_hash) FROM cassette_journal NOT INDEXED
                                 WHERE seq BETWEEN (NEW.tree_size >> (b + 1)) << (b + 1)
                                               AND ((NEW.tree_size >> (b + 1)) << (b + 1))
                                                   + (1 << b) - 1) END
                FROM fold WHERE (NEW.tree_size >> b) > 0
            )
            SELECT acc FROM fold ORDER BY b DESC LIMIT 1
        )
    );
END;

-- ------------------------------------------------------------ cassette_attestations
DROP TRIGGER cassette_attestations_journaled;
DROP TRIGGER cassette_attestations_time;
DROP TRIGGER cassette_attestations_insert_guard;

CREATE TRIGGER cassette_attestations_rules BEFORE INSERT ON cassette_attestations
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
        WHEN 2 THEN RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time')
        WHEN 3 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection') END
    FROM (SELECT k.id, CASE
            WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999 THEN 1
            WHEN NEW.created_at < (SELECT ms FROM cassette_ledger_time) THEN 2
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_attestations', 'op', 'INSERT', 'key', k.id,
                  'row', json_object('attestation_id', k.id, 'act', NEW.act, 'run_id', NEW.run_id,
                           'message_id', NEW.message_id, 'step_id', NEW.step_id,
                           'fencing_token', NEW.fencing_token, 'worker_id', NEW.worker_id,
                           'key_id', NEW.key_id, 'signature', NEW.signature,
                           'created_at', NEW.created_at)) THEN 3 END AS broken
          FROM (SELECT CASE WHEN NEW.attestation_id = -1 THEN coalesce((SELECT attestation_id FROM cassette_attestations NOT INDEXED ORDER BY attestation_id DESC LIMIT 1), 0) + 1 ELSE NEW.attestation_id END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.act IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.worker_id IS NOT NULL AND NEW.key_id IS NOT NULL AND NEW.signature IS NOT NULL AND NEW.created_at IS NOT NULL
      AND (r.id > 0
           AND coalesce(NEW.act IN ('post', 'claim', 'release', 'complete', 'requeue'), 1)
           AND coalesce(length(NEW.run_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.worker_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.key_id) = 16 AND NEW.key_id NOT GLOB '*[^0-9a-f]*', 1)
           AND coalesce(length(NEW.signature) = 88 AND substr(NEW.signature, 87) = '=='
          AND substr(NEW.signature, 1, 86) NOT GLOB '*[^A-Za-z0-9+/]*', 1)
           AND coalesce(CASE WHEN NEW.act = 'post'
          THEN NEW.message_id IS NOT NULL AND NEW.step_id IS NULL AND NEW.fencing_token IS NULL
          ELSE NEW.message_id IS NULL AND NEW.step_id IS NOT NULL AND NEW.fencing_token IS NOT NULL END, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

-- The guards of cassette_attestations, re-created with their text, in their order (they fire first).

CREATE TRIGGER cassette_attestations_insert_guard BEFORE INSERT ON cassette_attestations
BEGIN
    SELECT RAISE(ABORT, 'INVALID_ATTESTATION: act is post, claim, release, complete or requeue')
    WHERE NEW.act IS NULL OR NEW.act NOT IN ('post', 'claim', 'release', 'complete', 'requeue');
    SELECT RAISE(ABORT, 'INVALID_WORKER: worker_id is a string of 1-200 characters')
    WHERE typeof(NEW.worker_id) IS NOT 'text' OR length(NEW.worker_id) NOT BETWEEN 1 AND 200;
    SELECT RAISE(ABORT, 'APPEND_ONLY: an attestation with this attestation_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_attestations WHERE attestation_id = NEW.attestation_id);
    SELECT RAISE(ABORT, 'OUT_OF_ORDER: attestation ids are given in order without gaps')
    WHERE NEW.attestation_id IS NOT
          coalesce((SELECT max(attestation_id) FROM cassette_attestations), 0) + 1;
    SELECT RAISE(ABORT, 'APPEND_ONLY: this act is already attested')
    WHERE EXISTS (SELECT 1 FROM cassette_attestations
                  WHERE act = NEW.act AND message_id = NEW.message_id)
       OR EXISTS (SELECT 1 FROM cassette_attestations
                  WHERE step_id = NEW.step_id AND fencing_token = NEW.fencing_token
                    AND act = NEW.act AND worker_id = NEW.worker_id);
    -- a post is attested before its message is inserted, under the next message_id
    SELECT RAISE(ABORT, 'OUT_OF_ORDER: a post is attested before its message, under the next message_id')
    WHERE NEW.act IS 'post'
      AND (typeof(NEW.message_id) IS NOT 'integer'
           OR EXISTS (SELECT 1 FROM cassette_messages WHERE message_id >= NEW.message_id));
    SELECT RAISE(ABORT, 'STEP_NOT_FOUND: the attested step does not exist')
    WHERE NEW.act IS NOT 'post'
      AND NOT EXISTS (SELECT 1 FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'RUN_MISMATCH: the step belongs to another run')
    WHERE NEW.act IS NOT 'post'
      AND NEW.run_id IS NOT (SELECT run_id FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'INVALID_ATTESTATION: a claim is attested for a PENDING step')
    WHERE NEW.act IS 'claim'
      AND (SELECT status FROM cassette_steps WHERE step_id = NEW.step_id) IS NOT 'PENDING';
    SELECT RAISE(ABORT, 'STALE_FENCING_TOKEN: a claim is attested with the step''s next token')
    WHERE NEW.act IS 'claim' AND NEW.fencing_token IS NOT
          (SELECT fencing_token + 1 FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'NOT_LEASED: only a LEASED step is released, completed or requeued')
    WHERE NEW.act IN ('release', 'complete', 'requeue')
      AND (SELECT status FROM cassette_steps WHERE step_id = NEW.step_id) IS NOT 'LEASED';
    SELECT RAISE(ABORT, 'STALE_FENCING_TOKEN: the token is not the step''s current token')
    WHERE NEW.act IN ('release', 'complete', 'requeue') AND NEW.fencing_token IS NOT
          (SELECT fencing_token FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'WRONG_WORKER: only the lease owner releases or completes a step')
    WHERE NEW.act IN ('release', 'complete') AND NEW.worker_id IS NOT
          (SELECT lease_owner FROM cassette_steps WHERE step_id = NEW.step_id);
END;

-- ------------------------------------------------------------ cassette_messages
DROP TRIGGER cassette_messages_in_order;
DROP TRIGGER cassette_messages_dense;
DROP TRIGGER cassette_messages_readable;
DROP TRIGGER cassette_messages_time;
DROP TRIGGER cassette_messages_journaled;
DROP TRIGGER cassette_messages_insert_guard;

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

-- The guards of cassette_messages, re-created with their text, in their order (they fire first).

CREATE TRIGGER cassette_messages_insert_guard BEFORE INSERT ON cassette_messages
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: a message with this message_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_messages WHERE message_id = NEW.message_id);
    SELECT RAISE(ABORT, 'IDEMPOTENCY_CONFLICT: a message with this run_id and idempotency_key exists')
    WHERE NEW.idempotency_key IS NOT NULL
      AND EXISTS (SELECT 1 FROM cassette_messages
                  WHERE run_id = NEW.run_id AND idempotency_key = NEW.idempotency_key);
END;

-- ------------------------------------------------------------ cassette_steps
DROP TRIGGER cassette_steps_update_journaled;
DROP TRIGGER cassette_steps_dense;
DROP TRIGGER cassette_steps_readable;
DROP TRIGGER cassette_steps_time;
DROP TRIGGER cassette_steps_lease_time;
DROP TRIGGER cassette_steps_journaled;
DROP TRIGGER cassette_steps_insert_guard;
DROP TRIGGER cassette_steps_update_guard;
DROP TRIGGER cassette_steps_signature_guard;

CREATE TRIGGER cassette_steps_rules BEFORE INSERT ON cassette_steps
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection')
        WHEN 2 THEN RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
        WHEN 3 THEN RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time')
        WHEN 4 THEN RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
        WHEN 5 THEN RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: step_id must follow the last one') END
    FROM (SELECT k.id, CASE
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_steps', 'op', 'INSERT', 'key', k.id,
                  'row', json_object('step_id', k.id, 'job_id', NEW.job_id, 'run_id', NEW.run_id,
                           'message_id', NEW.message_id, 'job_ordinal', NEW.job_ordinal,
                           'ordinal', NEW.ordinal, 'status', NEW.status,
                           'lease_owner', NEW.lease_owner,
                           'lease_expires_at', NEW.lease_expires_at,
                           'fencing_token', NEW.fencing_token, 'payload_json', NEW.payload_json,
                           'created_at', NEW.created_at)) THEN 1
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
            WHEN k.id > 1 AND NOT EXISTS (SELECT 1 FROM cassette_steps NOT INDEXED WHERE step_id = k.id - 1) THEN 5 END AS broken
          FROM (SELECT CASE WHEN NEW.step_id = -1 THEN coalesce((SELECT step_id FROM cassette_steps NOT INDEXED ORDER BY step_id DESC LIMIT 1), 0) + 1 ELSE NEW.step_id END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.job_id IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.message_id IS NOT NULL AND NEW.job_ordinal IS NOT NULL AND NEW.ordinal IS NOT NULL AND NEW.status IS NOT NULL AND NEW.fencing_token IS NOT NULL AND NEW.payload_json IS NOT NULL AND NEW.created_at IS NOT NULL
      AND (r.id > 0
           AND coalesce(NEW.ordinal >= 0, 1)
           AND coalesce(NEW.status = 'PENDING' OR NEW.status = 'LEASED' OR NEW.status = 'COMMITTED', 1)
           AND coalesce(NEW.fencing_token >= 0, 1)
           AND coalesce(CASE WHEN json_valid(NEW.payload_json) THEN json_type(NEW.payload_json) = 'object' ELSE 0 END, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

CREATE TRIGGER cassette_steps_update_rules BEFORE UPDATE ON cassette_steps
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'INVALID_TTL: a lease expires after the ledger''s latest time, within 30 days of a time before the year 10000')
        WHEN 2 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection') END
    FROM (SELECT CASE
            WHEN OLD.status = 'PENDING' AND NEW.status IS 'LEASED'
                 AND typeof(NEW.lease_expires_at) = 'integer'
                 AND (NEW.lease_expires_at <= (SELECT ms FROM cassette_ledger_time)
                      OR NEW.lease_expires_at > 253402300799999 + 2592000000) THEN 1
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_steps', 'op', 'UPDATE', 'key', NEW.step_id,
                  'row', json_object('step_id', NEW.step_id, 'job_id', NEW.job_id, 'run_id', NEW.run_id,
                           'message_id', NEW.message_id, 'job_ordinal', NEW.job_ordinal,
                           'ordinal', NEW.ordinal, 'status', NEW.status,
                           'lease_owner', NEW.lease_owner,
                           'lease_expires_at', NEW.lease_expires_at,
                           'fencing_token', NEW.fencing_token, 'payload_json', NEW.payload_json,
                           'created_at', NEW.created_at)) THEN 2 END AS broken
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.job_id IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.message_id IS NOT NULL AND NEW.job_ordinal IS NOT NULL AND NEW.ordinal IS NOT NULL AND NEW.status IS NOT NULL AND NEW.fencing_token IS NOT NULL AND NEW.payload_json IS NOT NULL AND NEW.created_at IS NOT NULL
      AND (NEW.step_id > 0
           AND coalesce(NEW.ordinal >= 0, 1)
           AND coalesce(NEW.status = 'PENDING' OR NEW.status = 'LEASED' OR NEW.status = 'COMMITTED', 1)
           AND coalesce(NEW.fencing_token >= 0, 1)
           AND coalesce(CASE WHEN json_valid(NEW.payload_json) THEN json_type(NEW.payload_json) = 'object' ELSE 0 END, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

-- The guards of cassette_steps, re-created with their text, in their order (they fire first).

CREATE TRIGGER cassette_steps_insert_guard BEFORE INSERT ON cassette_steps
BEGIN
    SELECT RAISE(ABORT, 'INVALID_STATUS: status is PENDING, LEASED or COMMITTED')
    WHERE NEW.status IS NOT 'PENDING' AND NEW.status IS NOT 'LEASED' AND NEW.status IS NOT 'COMMITTED';
    SELECT RAISE(ABORT, 'INVALID_TOKEN: a fencing token is a non-negative integer')
    WHERE typeof(NEW.fencing_token) IS NOT 'integer' OR NEW.fencing_token < 0;
    SELECT RAISE(ABORT, 'APPEND_ONLY: a step with this step_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'APPEND_ONLY: a step with this job_id and ordinal exists')
    WHERE EXISTS (SELECT 1 FROM cassette_steps WHERE job_id = NEW.job_id AND ordinal = NEW.ordinal);
    SELECT RAISE(ABORT, 'REFERENCE_MISSING: the step''s job does not exist')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_jobs WHERE job_id = NEW.job_id);
    SELECT RAISE(ABORT, 'RUN_MISMATCH: a step''s run_id must equal its job''s run_id')
    WHERE NEW.run_id IS NOT (SELECT run_id FROM cassette_jobs WHERE job_id = NEW.job_id);
    SELECT RAISE(ABORT, 'REFERENCE_MISMATCH: a step''s message_id and job_ordinal must equal its job''s')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_jobs WHERE job_id = NEW.job_id
                      AND message_id IS NEW.message_id AND ordinal IS NEW.job_ordinal);
    SELECT RAISE(ABORT, 'ILLEGAL_TRANSITION: a step is inserted as PENDING')
    WHERE NEW.status IS NOT 'PENDING';
    SELECT RAISE(ABORT, 'LEASE_FIELDS_LOCKED: a step is inserted with token 0 and no lease')
    WHERE NEW.fencing_token IS NOT 0 OR NEW.lease_owner IS NOT NULL
       OR NEW.lease_expires_at IS NOT NULL;
END;

CREATE TRIGGER cassette_steps_update_guard BEFORE UPDATE ON cassette_steps
BEGIN
    SELECT RAISE(ABORT, 'INVALID_STATUS: status is PENDING, LEASED or COMMITTED')
    WHERE NEW.status IS NOT 'PENDING' AND NEW.status IS NOT 'LEASED' AND NEW.status IS NOT 'COMMITTED';
    SELECT RAISE(ABORT, 'INVALID_TOKEN: a fencing token is a non-negative integer')
    WHERE typeof(NEW.fencing_token) IS NOT 'integer' OR NEW.fencing_token < 0;
    SELECT RAISE(ABORT, 'IMMUTABLE_FIELD: only status, lease fields and fencing_token of a step change')
    WHERE NEW.step_id IS NOT OLD.step_id OR NEW.job_id IS NOT OLD.job_id
       OR NEW.run_id IS NOT OLD.run_id OR NEW.message_id IS NOT OLD.message_id
       OR NEW.job_ordinal IS NOT OLD.job_ordinal OR NEW.ordinal IS NOT OLD.ordinal
       OR NEW.payload_json IS NOT OLD.payload_json OR NEW.created_at IS NOT OLD.created_at;
    SELECT RAISE(ABORT, 'LEASE_FIELDS_LOCKED: lease fields change only with a claim or a requeue')
    WHERE NEW.status IS OLD.status
      AND (NEW.lease_owner IS NOT OLD.lease_owner OR NEW.lease_expires_at IS NOT OLD.lease_expires_at
           OR NEW.fencing_token IS NOT OLD.fencing_token);
    SELECT RAISE(ABORT, 'ILLEGAL_TRANSITION: allowed are PENDING->LEASED, LEASED->COMMITTED, LEASED->PENDING')
    WHERE NOT ((OLD.status = 'PENDING' AND NEW.status IS 'LEASED')
            OR (OLD.status = 'LEASED' AND NEW.status IS 'COMMITTED')
            OR (OLD.status = 'LEASED' AND NEW.status IS 'PENDING'));
    SELECT RAISE(ABORT, 'LEASE_FIELDS_LOCKED: a claim sets lease_owner and lease_expires_at and adds 1 to the token')
    WHERE OLD.status = 'PENDING' AND NEW.status IS 'LEASED'
      AND (NEW.lease_owner IS NULL OR length(NEW.lease_owner) NOT BETWEEN 1 AND 200
           OR typeof(NEW.lease_expires_at) IS NOT 'integer'
           OR NEW.fencing_token IS NOT OLD.fencing_token + 1);
    SELECT RAISE(ABORT, 'LEASE_FIELDS_LOCKED: a requeue clears the lease and keeps the token')
    WHERE OLD.status = 'LEASED' AND NEW.status IS 'PENDING'
      AND (NEW.lease_owner IS NOT NULL OR NEW.lease_expires_at IS NOT NULL
           OR NEW.fencing_token IS NOT OLD.fencing_token);
    SELECT RAISE(ABORT, 'LEASE_FIELDS_LOCKED: committing keeps the lease fields and the token')
    WHERE OLD.status = 'LEASED' AND NEW.status IS 'COMMITTED'
      AND (NEW.lease_owner IS NOT OLD.lease_owner OR NEW.lease_expires_at IS NOT OLD.lease_expires_at
           OR NEW.fencing_token IS NOT OLD.fencing_token);
    SELECT RAISE(ABORT, 'RECEIPT_REQUIRED: a step is committed only by inserting its receipt')
    WHERE OLD.status = 'LEASED' AND NEW.status IS 'COMMITTED'
      AND NOT EXISTS (SELECT 1 FROM cassette_receipts r WHERE r.step_id = OLD.step_id
                      AND r.fencing_token = OLD.fencing_token AND r.worker_id = OLD.lease_owner);
END;

CREATE TRIGGER cassette_steps_signature_guard BEFORE UPDATE ON cassette_steps
WHEN OLD.status = 'LEASED' AND NEW.status IS 'PENDING'
 AND NEW.lease_owner IS NULL AND NEW.lease_expires_at IS NULL
 AND NEW.fencing_token IS OLD.fencing_token
BEGIN
    SELECT RAISE(ABORT, 'SIGNATURE_REQUIRED: this lease was claimed signed; a requeue must be attested')
    FROM cassette_attestations c
    WHERE c.step_id = OLD.step_id AND c.fencing_token = OLD.fencing_token
      AND c.act = 'claim' AND c.worker_id = OLD.lease_owner
      AND NOT EXISTS (SELECT 1 FROM cassette_releases r
                      WHERE r.step_id = OLD.step_id AND r.fencing_token = OLD.fencing_token)
      AND NOT EXISTS (SELECT 1 FROM cassette_attestations q
                      WHERE q.step_id = OLD.step_id AND q.fencing_token = OLD.fencing_token
                        AND q.act = 'requeue');
END;

-- ------------------------------------------------------------ cassette_receipts
DROP TRIGGER cassette_receipts_dense;
DROP TRIGGER cassette_receipts_readable;
DROP TRIGGER cassette_receipts_time;
DROP TRIGGER cassette_receipts_journaled;
DROP TRIGGER cassette_receipts_insert_guard;
DROP TRIGGER cassette_receipts_signature_guard;

CREATE TRIGGER cassette_receipts_rules BEFORE INSERT ON cassette_receipts
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection')
        WHEN 2 THEN RAISE(ABORT, 'INVALID_TIME: created_at is an integer of epoch ms before the year 10000')
        WHEN 3 THEN RAISE(ABORT, 'TIME_BACKWARDS: created_at is an integer no earlier than the ledger''s latest time')
        WHEN 4 THEN RAISE(ABORT, 'INVALID_PAYLOAD: JSON the API cannot read back: a number beyond a 64-bit integer or a finite double, nesting deeper than 1024, or a lone surrogate')
        WHEN 5 THEN RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: receipt_id must follow the last one') END
    FROM (SELECT k.id, CASE
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_receipts', 'op', 'INSERT', 'key', k.id,
                  'row', json_object('receipt_id', k.id, 'step_id', NEW.step_id, 'job_id', NEW.job_id,
                           'run_id', NEW.run_id, 'worker_id', NEW.worker_id,
                           'fencing_token', NEW.fencing_token, 'outcome', NEW.outcome,
                           'receipt_json', NEW.receipt_json, 'created_at', NEW.created_at)) THEN 1
            WHEN typeof(NEW.created_at) IS NOT 'integer' OR NEW.created_at > 253402300799999 THEN 2
            WHEN NEW.created_at < (SELECT ms FROM cassette_ledger_time) THEN 3
            WHEN (NEW.receipt_json GLOB '*[0-9][eE]*' OR NEW.receipt_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
                  OR length(NEW.receipt_json) > 2048 OR instr(lower(NEW.receipt_json), '\ud') > 0)
             AND json_valid(NEW.receipt_json) AND (
                 (length(NEW.receipt_json) > 2048
                  AND NOT json_valid('[' || replace(hex(zeroblob(975)), '00', '[') || NEW.receipt_json
                                     || replace(hex(zeroblob(975)), '00', ']') || ']'))
                 OR EXISTS (
                     SELECT 1 FROM json_tree(NEW.receipt_json)
                     WHERE (type = 'real' AND abs(atom) > 1.7976931348623157e308)
                        OR (type = 'integer' AND typeof(atom) IS NOT 'integer')
                        OR (instr(lower(NEW.receipt_json), '\ud') > 0 AND (
                            (type = 'text' AND (atom GLOB '*[' || char(55296) || '-' || char(57343) || ']*'))
                            OR (typeof(key) = 'text' AND (key GLOB '*[' || char(55296) || '-' || char(57343) || ']*')))))) THEN 4
            WHEN k.id > 1 AND NOT EXISTS (SELECT 1 FROM cassette_receipts NOT INDEXED WHERE receipt_id = k.id - 1) THEN 5 END AS broken
          FROM (SELECT CASE WHEN NEW.receipt_id = -1 THEN coalesce((SELECT receipt_id FROM cassette_receipts NOT INDEXED ORDER BY receipt_id DESC LIMIT 1), 0) + 1 ELSE NEW.receipt_id END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.step_id IS NOT NULL AND NEW.job_id IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.worker_id IS NOT NULL AND NEW.fencing_token IS NOT NULL AND NEW.outcome IS NOT NULL AND NEW.receipt_json IS NOT NULL AND NEW.created_at IS NOT NULL
      AND (r.id > 0
           AND coalesce(length(NEW.worker_id) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.outcome = 'SUCCESS' OR NEW.outcome = 'FAILURE' OR NEW.outcome = 'ABORTED', 1)
           AND coalesce(CASE WHEN json_valid(NEW.receipt_json) THEN json_type(NEW.receipt_json) = 'object' ELSE 0 END, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

-- The guards of cassette_receipts, re-created with their text, in their order (they fire first).

CREATE TRIGGER cassette_receipts_insert_guard BEFORE INSERT ON cassette_receipts
BEGIN
    SELECT RAISE(ABORT, 'INVALID_WORKER: worker_id is a string of 1-200 characters')
    WHERE typeof(NEW.worker_id) IS NOT 'text' OR length(NEW.worker_id) NOT BETWEEN 1 AND 200;
    SELECT RAISE(ABORT, 'INVALID_OUTCOME: outcome is SUCCESS, FAILURE or ABORTED')
    WHERE NEW.outcome IS NOT 'SUCCESS' AND NEW.outcome IS NOT 'FAILURE' AND NEW.outcome IS NOT 'ABORTED';
    SELECT RAISE(ABORT, 'APPEND_ONLY: a receipt with this receipt_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_receipts WHERE receipt_id = NEW.receipt_id);
    SELECT RAISE(ABORT, 'STEP_NOT_FOUND: the receipt''s step does not exist')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'DUPLICATE_RECEIPT: this step already has its receipt')
    WHERE EXISTS (SELECT 1 FROM cassette_receipts WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'RUN_MISMATCH: the step belongs to another run')
    WHERE NEW.run_id IS NOT (SELECT run_id FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'REFERENCE_MISMATCH: a receipt''s job_id must be its step''s job')
    WHERE NEW.job_id IS NOT (SELECT job_id FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'NOT_LEASED: only a LEASED step takes a receipt')
    WHERE (SELECT status FROM cassette_steps WHERE step_id = NEW.step_id) IS NOT 'LEASED';
    SELECT RAISE(ABORT, 'STALE_FENCING_TOKEN: the token is not the step''s current token')
    WHERE NEW.fencing_token IS NOT (SELECT fencing_token FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'WRONG_WORKER: only the lease owner completes a step')
    WHERE NEW.worker_id IS NOT (SELECT lease_owner FROM cassette_steps WHERE step_id = NEW.step_id);
END;

CREATE TRIGGER cassette_receipts_signature_guard BEFORE INSERT ON cassette_receipts
WHEN EXISTS (SELECT 1 FROM cassette_steps s
             WHERE s.step_id = NEW.step_id AND s.status = 'LEASED'
               AND s.run_id IS NEW.run_id AND s.job_id IS NEW.job_id
               AND s.fencing_token IS NEW.fencing_token AND s.lease_owner IS NEW.worker_id)
BEGIN
    SELECT RAISE(ABORT, 'SIGNATURE_REQUIRED: this lease was claimed signed; its worker must attest the completion')
    FROM cassette_attestations c
    WHERE c.step_id = NEW.step_id AND c.fencing_token = NEW.fencing_token
      AND c.act = 'claim' AND c.worker_id = NEW.worker_id
      AND NOT EXISTS (SELECT 1 FROM cassette_attestations a
                      WHERE a.step_id = NEW.step_id AND a.fencing_token = NEW.fencing_token
                        AND a.act = 'complete' AND a.worker_id = c.worker_id
                        AND a.key_id = c.key_id)
      AND NOT (NEW.outcome IS 'ABORTED'
               AND EXISTS (SELECT 1 FROM cassette_attestations q
                           WHERE q.step_id = NEW.step_id AND q.fencing_token = NEW.fencing_token
                             AND q.act = 'requeue'));
END;

-- ------------------------------------------------------------ cassette_actions
DROP TRIGGER cassette_actions_in_order;
DROP TRIGGER cassette_actions_dense;
DROP TRIGGER cassette_actions_readable_gate;
DROP TRIGGER cassette_actions_time;
DROP TRIGGER cassette_actions_journaled;
DROP TRIGGER cassette_actions_cause_in_time;
DROP TRIGGER cassette_actions_suggested_causes;
DROP TRIGGER cassette_actions_plan_body;
DROP TRIGGER cassette_actions_insert_guard;
DROP TRIGGER cassette_actions_cause_guard;
DROP TRIGGER cassette_actions_lifecycle_gate;
DROP TRIGGER cassette_actions_plan_finished;

CREATE TRIGGER cassette_actions_rules BEFORE INSERT ON cassette_actions
BEGIN
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'INVALID_PLAN_BODY: plan_body and plan_hash belong to a PlanStarted action')
        WHEN 2 THEN RAISE(ABORT, 'INVALID_PLAN_BODY: plan_body is text and plan_hash 64 lowercase hex digits')
        WHEN 3 THEN RAISE(ABORT, 'INVALID_METADATA: suggested_causes is an array of at most 20 {action_id, reason} objects')
        WHEN 4 THEN RAISE(ABORT, 'REFERENCE_MISSING: a suggested cause names no earlier action')
        WHEN 5 THEN RAISE(ABORT, 'CAUSE_AFTER_EFFECT: the cause (caused_by) has a later timestamp than its effect')
        WHEN 6 THEN RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection')
        WHEN 7 THEN RAISE(ABORT, 'INVALID_TIME: timestamp is an integer of epoch ms before the year 10000')
        WHEN 8 THEN RAISE(ABORT, 'TIME_BACKWARDS: timestamp is an integer no earlier than the ledger''s latest time') END
    FROM (SELECT k.id, CASE
            WHEN (CASE WHEN json_valid(NEW.metadata_json) THEN json_type(NEW.metadata_json, '$.plan_body') END IS NOT NULL
                  OR CASE WHEN json_valid(NEW.metadata_json) THEN json_type(NEW.metadata_json, '$.plan_hash') END IS NOT NULL)
                 AND NEW.action_type IS NOT 'PlanStarted' THEN 1
            WHEN (CASE WHEN json_valid(NEW.metadata_json) THEN json_type(NEW.metadata_json, '$.plan_body') END IS NOT NULL
                  OR CASE WHEN json_valid(NEW.metadata_json) THEN json_type(NEW.metadata_json, '$.plan_hash') END IS NOT NULL)
                 AND (json_type(NEW.metadata_json, '$.plan_body') IS NOT 'text'
                      OR json_type(NEW.metadata_json, '$.plan_hash') IS NOT 'text'
                      OR length(json_extract(NEW.metadata_json, '$.plan_hash')) IS NOT 64
                      OR json_extract(NEW.metadata_json, '$.plan_hash') GLOB '*[^0-9a-f]*') THEN 2
            WHEN CASE WHEN json_valid(NEW.metadata_json) THEN json_type(NEW.metadata_json, '$.suggested_causes') END IS NOT NULL
                 AND (json_type(NEW.metadata_json, '$.suggested_causes') IS NOT 'array'
                      OR json_array_length(NEW.metadata_json, '$.suggested_causes') > 20
                      OR EXISTS (SELECT 1 FROM json_each(NEW.metadata_json, '$.suggested_causes') s
                                 WHERE s.type IS NOT 'object'
                                    OR json_type(s.value, '$.action_id') IS NOT 'text'
                                    OR json_type(s.value, '$.reason') IS NOT 'text'
                                    OR length(json_extract(s.value, '$.reason')) NOT BETWEEN 1 AND 500
                                    OR (SELECT count(*) FROM json_each(s.value)) IS NOT 2)) THEN 3
            WHEN CASE WHEN json_valid(NEW.metadata_json) THEN json_type(NEW.metadata_json, '$.suggested_causes') END IS NOT NULL
                 AND EXISTS (SELECT 1 FROM json_each(NEW.metadata_json, '$.suggested_causes') s
                             WHERE NOT EXISTS (
                                 SELECT 1 FROM cassette_actions c
                                  WHERE c.action_id = json_extract(s.value, '$.action_id')
                                    AND c.action_seq < k.id)) THEN 4
            WHEN NEW.caused_by IS NOT NULL
                 AND (SELECT c.timestamp FROM cassette_actions c WHERE c.action_id = NEW.caused_by)
                     > NEW.timestamp THEN 5
            WHEN (SELECT body FROM cassette_journal NOT INDEXED ORDER BY seq DESC LIMIT 1)
                 IS NOT json_object('table', 'cassette_actions', 'op', 'INSERT', 'key', NEW.action_id,
                  'row', json_object('action_seq', k.id, 'action_id', NEW.action_id,
                           'parent_action_id', NEW.parent_action_id, 'plan_id', NEW.plan_id,
                           'intent_id', NEW.intent_id, 'session_id', NEW.session_id,
                           'action_type', NEW.action_type, 'function_name', NEW.function_name,
                           'arguments_json', NEW.arguments_json,
                           'arguments_artifact', NEW.arguments_artifact,
                           'result_json', NEW.result_json, 'result_artifact', NEW.result_artifact,
                           'success', NEW.success, 'error_message', NEW.error_message,
                           'cost_micros', NEW.cost_micros, 'duration_ms', NEW.duration_ms,
                           'timestamp', NEW.timestamp, 'metadata_json', NEW.metadata_json,
                           'caused_by', NEW.caused_by, 'rationale', NEW.rationale,
                           'category', NEW.category)) THEN 6
            WHEN typeof(NEW.timestamp) IS NOT 'integer' OR NEW.timestamp > 253402300799999 THEN 7
            WHEN NEW.timestamp < (SELECT ms FROM cassette_ledger_time) THEN 8 END AS broken
          FROM (SELECT CASE WHEN NEW.action_seq = -1 THEN coalesce((SELECT action_seq FROM cassette_actions NOT INDEXED ORDER BY action_seq DESC LIMIT 1), 0) + 1 ELSE NEW.action_seq END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.action_id IS NOT NULL AND NEW.plan_id IS NOT NULL AND NEW.intent_id IS NOT NULL AND NEW.action_type IS NOT NULL AND NEW.function_name IS NOT NULL AND NEW.success IS NOT NULL AND NEW.cost_micros IS NOT NULL AND NEW.duration_ms IS NOT NULL AND NEW.timestamp IS NOT NULL AND NEW.metadata_json IS NOT NULL
      AND (r.id > 0
           AND coalesce(length(NEW.action_id) = 36 AND NEW.action_id NOT GLOB '*[^0-9a-f-]*'
          AND substr(NEW.action_id, 9, 1) = '-' AND substr(NEW.action_id, 14, 1) = '-'
          AND substr(NEW.action_id, 19, 1) = '-' AND substr(NEW.action_id, 24, 1) = '-'
          AND NEW.action_id NOT GLOB '*-*-*-*-*-*', 1)
           AND coalesce(length(NEW.plan_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.intent_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.session_id) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.action_type = 'PlanStarted' OR NEW.action_type = 'PlanCompleted' OR NEW.action_type = 'PlanAborted'
          OR NEW.action_type = 'PlanPaused' OR NEW.action_type = 'PlanResumed' OR NEW.action_type = 'PlanStepStarted'
          OR NEW.action_type = 'PlanStepCompleted' OR NEW.action_type = 'PlanStepFailed' OR NEW.action_type = 'PlanStepRetrying'
          OR NEW.action_type = 'CapabilityCall' OR NEW.action_type = 'CapabilityResult' OR NEW.action_type = 'InternalStep', 1)
           AND coalesce(length(NEW.function_name) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.arguments_json IS NULL OR CASE WHEN json_valid(NEW.arguments_json) THEN json_type(NEW.arguments_json) = 'array' ELSE 0 END, 1)
           AND coalesce(NEW.arguments_artifact IS NULL OR CASE WHEN json_valid(NEW.arguments_artifact)
          THEN json_type(NEW.arguments_artifact, '$.sha256') = 'text' AND json_type(NEW.arguments_artifact, '$.size') = 'integer' ELSE 0 END, 1)
           AND coalesce(NEW.result_json IS NULL OR json_valid(NEW.result_json), 1)
           AND coalesce(NEW.result_artifact IS NULL OR CASE WHEN json_valid(NEW.result_artifact)
          THEN json_type(NEW.result_artifact, '$.sha256') = 'text' AND json_type(NEW.result_artifact, '$.size') = 'integer' ELSE 0 END, 1)
           AND coalesce(NEW.success IN (0, 1), 1)
           AND coalesce(NEW.cost_micros >= 0, 1)
           AND coalesce(NEW.duration_ms >= 0, 1)
           AND coalesce(CASE WHEN json_valid(NEW.metadata_json) THEN json_type(NEW.metadata_json) = 'object' ELSE 0 END, 1)
           AND coalesce(NEW.category IS NULL OR NEW.category = 'conversation' OR NEW.category = 'decision'
          OR NEW.category = 'file_edit' OR NEW.category = 'tool_use' OR NEW.category = 'research', 1)
           AND coalesce(NEW.arguments_json IS NULL OR NEW.arguments_artifact IS NULL, 1)
           AND coalesce(NEW.result_json IS NULL OR NEW.result_artifact IS NULL, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
    INSERT INTO cassette_actions_readable
        (arguments_json, result_json, metadata_json, arguments_artifact, result_artifact)
    SELECT NEW.arguments_json, NEW.result_json, NEW.metadata_json,
           NEW.arguments_artifact, NEW.result_artifact
    FROM (SELECT CASE WHEN NEW.action_seq = -1 THEN coalesce((SELECT action_seq FROM cassette_actions NOT INDEXED ORDER BY action_seq DESC LIMIT 1), 0) + 1 ELSE NEW.action_seq END AS id) AS r
    WHERE (NEW.arguments_json GLOB '*[0-9][eE]*' OR NEW.arguments_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
      OR length(NEW.arguments_json) > 2048 OR instr(lower(NEW.arguments_json), '\ud') > 0
      OR NEW.result_json GLOB '*[0-9][eE]*' OR NEW.result_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
      OR length(NEW.result_json) > 2048 OR instr(lower(NEW.result_json), '\ud') > 0
      OR NEW.metadata_json GLOB '*[0-9][eE]*' OR NEW.metadata_json GLOB '*[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*'
      OR length(NEW.metadata_json) > 2048 OR instr(lower(NEW.metadata_json), '\ud') > 0
      OR NEW.arguments_artifact IS NOT NULL OR NEW.result_artifact IS NOT NULL)
      AND NEW.action_id IS NOT NULL AND NEW.plan_id IS NOT NULL AND NEW.intent_id IS NOT NULL AND NEW.action_type IS NOT NULL AND NEW.function_name IS NOT NULL AND NEW.success IS NOT NULL AND NEW.cost_micros IS NOT NULL AND NEW.duration_ms IS NOT NULL AND NEW.timestamp IS NOT NULL AND NEW.metadata_json IS NOT NULL
      AND (r.id > 0
           AND coalesce(length(NEW.action_id) = 36 AND NEW.action_id NOT GLOB '*[^0-9a-f-]*'
          AND substr(NEW.action_id, 9, 1) = '-' AND substr(NEW.action_id, 14, 1) = '-'
          AND substr(NEW.action_id, 19, 1) = '-' AND substr(NEW.action_id, 24, 1) = '-'
          AND NEW.action_id NOT GLOB '*-*-*-*-*-*', 1)
           AND coalesce(length(NEW.plan_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.intent_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.session_id) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.action_type = 'PlanStarted' OR NEW.action_type = 'PlanCompleted' OR NEW.action_type = 'PlanAborted'
          OR NEW.action_type = 'PlanPaused' OR NEW.action_type = 'PlanResumed' OR NEW.action_type = 'PlanStepStarted'
          OR NEW.action_type = 'PlanStepCompleted' OR NEW.action_type = 'PlanStepFailed' OR NEW.action_type = 'PlanStepRetrying'
          OR NEW.action_type = 'CapabilityCall' OR NEW.action_type = 'CapabilityResult' OR NEW.action_type = 'InternalStep', 1)
           AND coalesce(length(NEW.function_name) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.arguments_json IS NULL OR CASE WHEN json_valid(NEW.arguments_json) THEN json_type(NEW.arguments_json) = 'array' ELSE 0 END, 1)
           AND coalesce(NEW.arguments_artifact IS NULL OR CASE WHEN json_valid(NEW.arguments_artifact)
          THEN json_type(NEW.arguments_artifact, '$.sha256') = 'text' AND json_type(NEW.arguments_artifact, '$.size') = 'integer' ELSE 0 END, 1)
           AND coalesce(NEW.result_json IS NULL OR json_valid(NEW.result_json), 1)
           AND coalesce(NEW.result_artifact IS NULL OR CASE WHEN json_valid(NEW.result_artifact)
          THEN json_type(NEW.result_artifact, '$.sha256') = 'text' AND json_type(NEW.result_artifact, '$.size') = 'integer' ELSE 0 END, 1)
           AND coalesce(NEW.success IN (0, 1), 1)
           AND coalesce(NEW.cost_micros >= 0, 1)
           AND coalesce(NEW.duration_ms >= 0, 1)
           AND coalesce(CASE WHEN json_valid(NEW.metadata_json) THEN json_type(NEW.metadata_json) = 'object' ELSE 0 END, 1)
           AND coalesce(NEW.category IS NULL OR NEW.category = 'conversation' OR NEW.category = 'decision'
          OR NEW.category = 'file_edit' OR NEW.category = 'tool_use' OR NEW.category = 'research', 1)
           AND coalesce(NEW.arguments_json IS NULL OR NEW.arguments_artifact IS NULL, 1)
           AND coalesce(NEW.result_json IS NULL OR NEW.result_artifact IS NULL, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
    SELECT CASE r.broken
        WHEN 1 THEN RAISE(ABORT, 'OUT_OF_ORDER: ids are dense: action_seq must follow the last one')
        WHEN 2 THEN RAISE(ABORT, 'OUT_OF_ORDER: an action_seq must be larger than every existing one') END
    FROM (SELECT k.id, CASE
            WHEN k.id > 1 AND NOT EXISTS (SELECT 1 FROM cassette_actions NOT INDEXED WHERE action_seq = k.id - 1) THEN 1
            WHEN EXISTS (SELECT 1 FROM cassette_actions WHERE action_seq > k.id) THEN 2 END AS broken
          FROM (SELECT CASE WHEN NEW.action_seq = -1 THEN coalesce((SELECT action_seq FROM cassette_actions NOT INDEXED ORDER BY action_seq DESC LIMIT 1), 0) + 1 ELSE NEW.action_seq END AS id) AS k
          LIMIT -1 OFFSET 0) AS r
    WHERE r.broken IS NOT NULL
      AND NEW.action_id IS NOT NULL AND NEW.plan_id IS NOT NULL AND NEW.intent_id IS NOT NULL AND NEW.action_type IS NOT NULL AND NEW.function_name IS NOT NULL AND NEW.success IS NOT NULL AND NEW.cost_micros IS NOT NULL AND NEW.duration_ms IS NOT NULL AND NEW.timestamp IS NOT NULL AND NEW.metadata_json IS NOT NULL
      AND (r.id > 0
           AND coalesce(length(NEW.action_id) = 36 AND NEW.action_id NOT GLOB '*[^0-9a-f-]*'
          AND substr(NEW.action_id, 9, 1) = '-' AND substr(NEW.action_id, 14, 1) = '-'
          AND substr(NEW.action_id, 19, 1) = '-' AND substr(NEW.action_id, 24, 1) = '-'
          AND NEW.action_id NOT GLOB '*-*-*-*-*-*', 1)
           AND coalesce(length(NEW.plan_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.intent_id) BETWEEN 1 AND 200, 1)
           AND coalesce(length(NEW.session_id) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.action_type = 'PlanStarted' OR NEW.action_type = 'PlanCompleted' OR NEW.action_type = 'PlanAborted'
          OR NEW.action_type = 'PlanPaused' OR NEW.action_type = 'PlanResumed' OR NEW.action_type = 'PlanStepStarted'
          OR NEW.action_type = 'PlanStepCompleted' OR NEW.action_type = 'PlanStepFailed' OR NEW.action_type = 'PlanStepRetrying'
          OR NEW.action_type = 'CapabilityCall' OR NEW.action_type = 'CapabilityResult' OR NEW.action_type = 'InternalStep', 1)
           AND coalesce(length(NEW.function_name) BETWEEN 1 AND 200, 1)
           AND coalesce(NEW.arguments_json IS NULL OR CASE WHEN json_valid(NEW.arguments_json) THEN json_type(NEW.arguments_json) = 'array' ELSE 0 END, 1)
           AND coalesce(NEW.arguments_artifact IS NULL OR CASE WHEN json_valid(NEW.arguments_artifact)
          THEN json_type(NEW.arguments_artifact, '$.sha256') = 'text' AND json_type(NEW.arguments_artifact, '$.size') = 'integer' ELSE 0 END, 1)
           AND coalesce(NEW.result_json IS NULL OR json_valid(NEW.result_json), 1)
           AND coalesce(NEW.result_artifact IS NULL OR CASE WHEN json_valid(NEW.result_artifact)
          THEN json_type(NEW.result_artifact, '$.sha256') = 'text' AND json_type(NEW.result_artifact, '$.size') = 'integer' ELSE 0 END, 1)
           AND coalesce(NEW.success IN (0, 1), 1)
           AND coalesce(NEW.cost_micros >= 0, 1)
           AND coalesce(NEW.duration_ms >= 0, 1)
           AND coalesce(CASE WHEN json_valid(NEW.metadata_json) THEN json_type(NEW.metadata_json) = 'object' ELSE 0 END, 1)
           AND coalesce(NEW.category IS NULL OR NEW.category = 'conversation' OR NEW.category = 'decision'
          OR NEW.category = 'file_edit' OR NEW.category = 'tool_use' OR NEW.category = 'research', 1)
           AND coalesce(NEW.arguments_json IS NULL OR NEW.arguments_artifact IS NULL, 1)
           AND coalesce(NEW.result_json IS NULL OR NEW.result_artifact IS NULL, 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints));
END;

-- The guards of cassette_actions, re-created with their text, in their order (they fire first).

CREATE TRIGGER cassette_actions_insert_guard BEFORE INSERT ON cassette_actions
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: an action with this action_seq exists')
    WHERE EXISTS (SELECT 1 FROM cassette_actions WHERE action_seq = NEW.action_seq);
    SELECT RAISE(ABORT, 'APPEND_ONLY: an action with this action_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_actions WHERE action_id = NEW.action_id);
    SELECT RAISE(ABORT, 'REFERENCE_MISSING: the parent action does not exist')
    WHERE NEW.parent_action_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM cassette_actions WHERE action_id = NEW.parent_action_id);
END;

CREATE TRIGGER cassette_actions_cause_guard BEFORE INSERT ON cassette_actions
WHEN NEW.caused_by IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'REFERENCE_MISSING: the cause (caused_by) does not exist')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_actions WHERE action_id = NEW.caused_by);
END;

CREATE TRIGGER cassette_actions_lifecycle_gate BEFORE INSERT ON cassette_actions
WHEN NEW.action_type GLOB 'Plan*'
  OR CASE WHEN json_valid(NEW.metadata_json)
          THEN json_extract(NEW.metadata_json, '$.checkpoint_id') IS NOT NULL END
BEGIN
    INSERT INTO cassette_actions_lifecycle (plan_id, action_type, parent_action_id, metadata_json)
    VALUES (NEW.plan_id, NEW.action_type, NEW.parent_action_id, NEW.metadata_json);
END;

CREATE TRIGGER cassette_actions_plan_finished BEFORE INSERT ON cassette_actions
BEGIN
    SELECT RAISE(ABORT, 'PLAN_FINISHED: the plan has completed or aborted')
    WHERE (SELECT action_type FROM cassette_actions
           WHERE plan_id = NEW.plan_id
             AND (action_type = 'PlanStarted' OR action_type = 'PlanPaused'
                  OR action_type = 'PlanResumed' OR action_type = 'PlanCompleted'
                  OR action_type = 'PlanAborted')
           ORDER BY action_seq DESC LIMIT 1) IN ('PlanCompleted', 'PlanAborted');
END;

-- This migration records itself, once (see 0005).
DROP TRIGGER cassette_migrations_insert_guard;
CREATE TRIGGER cassette_migrations_insert_guard BEFORE INSERT ON cassette_migrations
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be replaced')
    WHERE EXISTS (SELECT 1 FROM cassette_migrations WHERE version = NEW.version);
    SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: only a cassette connection migrates the ledger')
    WHERE NOT EXISTS (SELECT 1 FROM pragma_function_list WHERE name = 'cassette_chain_hash');
    SELECT RAISE(ABORT, 'MIGRATION_FAILED: only the migration being applied records itself')
    WHERE NEW.version IS NOT 11 OR NEW.name IS NOT 'rules_before'
       OR typeof(NEW.sha256) IS NOT 'text' OR length(NEW.sha256) IS NOT 64
       OR NEW.sha256 GLOB '*[^0-9a-f]*';
END;
