-- The journal, its Merkle tree and the seals over it (LAW.md, "Journal encoding", "Merkle
-- tree", "Seals").
--
-- The journal is the one hash chain of the whole ledger: every row of every ledger table is
-- one entry, written before the row by the package's TEMP journal triggers (in each
-- table's file), and each table's rules refuse a row whose entry is not the journal's
-- last. The RFC 9162 Merkle tree over the entries' leaf hashes is stored a block of 256
-- leaves at a time; a seal is a signed checkpoint of the first tree_size entries,
-- recorded in the ledger (journaled like any row) and written to a file kept outside it.

-- ============================================================================
-- cassette_journal

-- seq, body (canonical JSON of the row), leaf_hash = SHA-256(0x00 || body), and
-- chain_hash over the previous one; tbl and row_key are stored from the body, for the
-- by-row index (verify checks they are the body's).
CREATE TABLE cassette_journal (
    seq INTEGER PRIMARY KEY CONSTRAINT JOURNAL_BROKEN CHECK (seq >= 0),
    body TEXT NOT NULL CONSTRAINT JOURNAL_BROKEN CHECK (json_valid(body)),
    leaf_hash BLOB NOT NULL CONSTRAINT JOURNAL_BROKEN CHECK (length(leaf_hash) = 32),
    chain_hash BLOB NOT NULL CONSTRAINT JOURNAL_BROKEN CHECK (length(chain_hash) = 32),
    tbl TEXT GENERATED ALWAYS AS (json_extract(body, '$.table')) STORED,
    row_key ANY GENERATED ALWAYS AS (json_extract(body, '$.key')) STORED
) STRICT;

CREATE INDEX cassette_journal_by_row ON cassette_journal (tbl, row_key, seq);

-- Append-only.
CREATE TRIGGER cassette_journal_no_update BEFORE UPDATE ON cassette_journal
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_journal rows cannot be updated'); END;

CREATE TRIGGER cassette_journal_no_delete BEFORE DELETE ON cassette_journal
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_journal rows cannot be deleted'); END;

-- The journal accepts only the next seq with correct hashes. The hash checks call the
-- package's SHA-256 functions, so a connection without them cannot insert journal rows
-- at all (it fails closed with "no such function").
CREATE TRIGGER cassette_journal_insert_guard BEFORE INSERT ON cassette_journal
BEGIN
    SELECT RAISE(ABORT, 'JOURNAL_BROKEN: a journal entry continues the sequence and the chain')
    WHERE NEW.seq IS NOT coalesce((SELECT max(seq) FROM cassette_journal) + 1, 0)
       OR NEW.leaf_hash IS NOT cassette_leaf_hash(NEW.body)
       OR NEW.chain_hash IS NOT cassette_chain_hash(
              NEW.seq,
              coalesce((SELECT chain_hash FROM cassette_journal WHERE seq = NEW.seq - 1),
                       zeroblob(32)),
              NEW.leaf_hash);
END;

-- The entry that ends an aligned block of 256 leaves (seq % 256 = 255) stores the block's
-- level-1 nodes (cassette_tree_nodes_grow adds the ones above them), after healing the
-- blocks just before it that a connection left without nodes (walking back one probe per
-- block, oldest first), and fails closed if the block's root is not then stored. Kept
-- short on purpose: SQLite allocates and zeroes a frame as large as a trigger's program
-- for every row it fires on, even when its WHEN clause is false.
CREATE TRIGGER cassette_journal_grow_tree AFTER INSERT ON cassette_journal
WHEN NEW.seq % 256 = 255
BEGIN
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT r.seq, 1, cassette_node_hash(l.leaf_hash, r.leaf_hash)
    FROM cassette_journal AS r NOT INDEXED
    JOIN cassette_journal AS l NOT INDEXED ON l.seq = r.seq - 1
    WHERE r.seq BETWEEN (
            WITH RECURSIVE skipped(first) AS (
                SELECT NEW.seq - 255
                UNION ALL
                SELECT first - 256 FROM skipped
                WHERE first > 0 AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes
                                                WHERE leaf_end = first - 1 AND level = 8)
            )
            SELECT min(first) FROM skipped)
        AND NEW.seq
      AND r.seq % 2 = 1
      AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = r.seq AND level = 1)
    ORDER BY r.seq;
    SELECT RAISE(ABORT, 'TREE_BROKEN: a complete block of the journal stores its tree nodes')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = NEW.seq AND level = 8);
END;

-- ============================================================================
-- cassette_tree_nodes

-- A complete aligned subtree of `2^level` leaves whose last leaf is journal seq
-- `leaf_end`. The key orders nodes as they complete (by their last leaf, then level), so
-- verify reads them in one pass beside the journal. Leaves (level 0) are the journal's
-- own leaf_hash column. The nodes of the last, incomplete block are never stored:
-- whoever needs them computes them from its leaves (at most 255).
CREATE TABLE cassette_tree_nodes (
    leaf_end INTEGER NOT NULL CONSTRAINT TREE_BROKEN CHECK (leaf_end >= 1),
    level INTEGER NOT NULL CONSTRAINT TREE_BROKEN CHECK (level BETWEEN 1 AND 62),
    hash BLOB NOT NULL CONSTRAINT TREE_BROKEN CHECK (length(hash) = 32),
    CONSTRAINT TREE_BROKEN CHECK ((leaf_end + 1) % (1 << level) = 0),
    PRIMARY KEY (leaf_end, level)
) STRICT, WITHOUT ROWID;

-- Append-only.
CREATE TRIGGER cassette_tree_nodes_no_update BEFORE UPDATE ON cassette_tree_nodes
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_tree_nodes rows cannot be updated'); END;

-- A node is the hash of its two children, which must exist. The hash check calls the
-- package's cassette_node_hash, so a connection without it cannot add nodes at all.
CREATE TRIGGER cassette_tree_nodes_insert_guard BEFORE INSERT ON cassette_tree_nodes
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: this tree node exists')
    WHERE EXISTS (SELECT 1 FROM cassette_tree_nodes
                  WHERE leaf_end = NEW.leaf_end AND level = NEW.level);
    SELECT RAISE(ABORT, 'TREE_BROKEN: a tree node is the hash of its two existing children')
    WHERE NEW.hash IS NOT cassette_node_hash(
        CASE WHEN NEW.level = 1
             THEN (SELECT leaf_hash FROM cassette_journal WHERE seq = NEW.leaf_end - 1)
             ELSE (SELECT hash FROM cassette_tree_nodes
                   WHERE leaf_end = NEW.leaf_end - (1 << (NEW.level - 1))
                     AND level = NEW.level - 1) END,
        CASE WHEN NEW.level = 1
             THEN (SELECT leaf_hash FROM cassette_journal WHERE seq = NEW.leaf_end)
             ELSE (SELECT hash FROM cassette_tree_nodes
                   WHERE leaf_end = NEW.leaf_end AND level = NEW.level - 1) END);
END;

-- A node covers only complete blocks of journaled entries: the nodes of the incomplete
-- block are nobody's to store, so nobody can plant one over other writers' entries
-- before the block that completes them.
CREATE TRIGGER cassette_tree_nodes_bounded BEFORE INSERT ON cassette_tree_nodes
BEGIN
    SELECT RAISE(ABORT, 'TREE_BROKEN: a tree node covers only complete blocks of journaled entries')
    WHERE typeof(NEW.leaf_end) IS NOT 'integer'
       OR NEW.leaf_end >= coalesce((SELECT seq + 1 - (seq + 1) % 256 FROM cassette_journal
                                    NOT INDEXED ORDER BY seq DESC LIMIT 1), 0);
END;

CREATE TRIGGER cassette_tree_nodes_no_delete BEFORE DELETE ON cassette_tree_nodes
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_tree_nodes rows cannot be deleted'); END;

-- A level-1 node completes every node above it that ends at the same entry, bottom up,
-- each from its stored left sibling and the node below it: one statement, so nothing
-- depends on recursive_triggers. Where a left sibling is missing the climb stops (the
-- seal stores the rest, tree.heal) and the append goes on: no append depends on a node a
-- connection could keep from being stored.
CREATE TRIGGER cassette_tree_nodes_grow AFTER INSERT ON cassette_tree_nodes
WHEN NEW.level = 1 AND NEW.leaf_end % 4 = 3
BEGIN
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT NEW.leaf_end, level, hash FROM (
        WITH RECURSIVE up(level, hash) AS (
            SELECT 1, NEW.hash
            UNION ALL
            SELECT up.level + 1, cassette_node_hash(sibling.hash, up.hash)
            FROM up JOIN cassette_tree_nodes AS sibling
              ON sibling.leaf_end = NEW.leaf_end - (1 << up.level) AND sibling.level = up.level
            WHERE (NEW.leaf_end + 1) % (1 << (up.level + 1)) = 0
        )
        SELECT level, hash FROM up WHERE level > 1 ORDER BY level
    ) AS above
    WHERE NOT EXISTS (SELECT 1 FROM cassette_tree_nodes
                      WHERE leaf_end = NEW.leaf_end AND level = above.level);
END;

-- ============================================================================
-- cassette_seals

-- A seal: a signed checkpoint (c2sp.org/tlog-checkpoint in a c2sp.org/signed-note) of the
-- first `tree_size` journal entries, as written to the file kept outside the ledger.
-- Recording it journals it, so a seal of size n is itself journal entry n or later.
CREATE TABLE cassette_seals (
    seal_id INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (seal_id > 0),
    tree_size INTEGER NOT NULL CONSTRAINT INVALID_SEAL CHECK (tree_size >= 1),
    root_hex TEXT NOT NULL
        CONSTRAINT INVALID_SEAL CHECK (length(root_hex) = 64 AND root_hex NOT GLOB '*[^0-9a-f]*'),
    origin TEXT NOT NULL
        CONSTRAINT INVALID_SEAL CHECK (
            length(origin) BETWEEN 1 AND 200 AND origin NOT GLOB '*[' || char(9, 10, 13, 32, 43) || ']*'
        ),
    key_id TEXT NOT NULL
        CONSTRAINT INVALID_SEAL CHECK (length(key_id) = 8 AND key_id NOT GLOB '*[^0-9a-f]*'),
    note TEXT NOT NULL
        CONSTRAINT INVALID_SEAL CHECK (
            substr(note, 1, length(origin) + length(tree_size) + 2)
                = origin || char(10) || tree_size || char(10)
        ),
    created_at INTEGER NOT NULL
) STRICT;

-- Append-only.
CREATE TRIGGER cassette_seals_no_update BEFORE UPDATE ON cassette_seals
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_seals rows cannot be updated'); END;

CREATE TRIGGER cassette_seals_no_delete BEFORE DELETE ON cassette_seals
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_seals rows cannot be deleted'); END;

-- The rules every seal meets (journal, time, dense ids): see
-- 20_messages.sql, cassette_messages_rules.
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

-- The sealed root must be the root of the ledger's first tree_size entries. The root of n
-- leaves folds the complete subtrees of n's binary digits, smallest first; those in the
-- incomplete last block are folded from the journal's leaves (cassette_subtree_hash),
-- the larger ones are stored nodes. Calls the package's functions, so only a package
-- connection records seals. One trigger, so the checks run in this order.
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

-- ==== TEMP: installed on every package connection, not kept in the file ====

-- Installed as TEMP triggers on every package connection, after the schema is current. They
-- hold the rules that need the package's SQL functions:
--   cassette_now_ms()                 the writer's clock (integer UTC epoch ms)
--   cassette_transaction_ms()         the time of the package's write transaction under
--                                     way (max of its clock and ledger time, read once
--                                     when it dates its first row); else the writer's clock
--   cassette_leaf_hash(body)          SHA-256(0x00 || body)
--   cassette_chain_hash(seq, prev, leaf)
--   cassette_sha256_hex(text)         lowercase hex SHA-256 of the UTF-8 bytes
-- Why TEMP and not in the file: SQLite resolves every function of every trigger of a table
-- when a statement on that table is prepared. A persistent trigger calling a registered
-- function would make a raw connection fail with "no such function" before any rule could
-- report its precise code. The persistent `*_rules` triggers refuse any ledger write whose
-- body these triggers did not journal as the journal's last entry (JOURNAL_REQUIRED), so a
-- connection without them still fails closed. SQLite runs TEMP triggers before the main
-- schema's triggers of the same event.
--
-- The journal triggers, one per table and event, in each table's file. Body: canonical JSON
-- built by SQLite with keys in a fixed order:
-- {"table":T,"op":"INSERT"|"UPDATE","key":K,"row":{every column, in table order}}
-- "LIMIT -1 OFFSET 0" keeps SQLite from flattening the subqueries, which would build the
-- body and hash it once per reference instead of once. The head is read by one max(seq)
-- probe whose bare chain_hash is the last row's (always one row, NULLs when the journal is
-- empty): a LEFT JOIN to an ORDER BY ... LIMIT 1 subquery would materialize a temporary
-- table for every entry.
-- They are BEFORE triggers: the entry is written before the row, so the file's rules
-- trigger, which fires after every TEMP trigger, finds it as the last entry, and no trigger
-- a connection adds can keep the row and skip that check. In a BEFORE trigger an INTEGER
-- PRIMARY KEY inserted as NULL reads -1: the entry takes the next id, one more than the
-- table's last, which SQLite then gives the row.
-- A BEFORE trigger runs before SQLite tests the row's NOT NULL and CHECK constraints, and
-- INSERT OR IGNORE skips a row that fails one and keeps what the triggers wrote: so each
-- journal trigger writes only for a row those constraints will take (its WHEN clause, the
-- table's constraints over NEW), and a skipped row leaves no entry behind. Except the
-- constraints on JSON text: testing them here would parse every payload once more on every
-- write (the CHECK parses it again; SQLite's JSON cache is per trigger), about 30,000
-- instructions per row of the benchmark's payload. So INSERT OR IGNORE of a row whose JSON
-- a CHECK refuses leaves its entry without the row (verify: row_missing); the package never
-- writes so.

-- The seals' journal trigger.

CREATE TEMP TRIGGER cassette_seals_journal BEFORE INSERT ON main.cassette_seals
-- (only a row its NOT NULL and CHECK constraints will take: 50_journal.sql, TEMP section)
WHEN NEW.tree_size IS NOT NULL AND NEW.root_hex IS NOT NULL AND NEW.origin IS NOT NULL AND NEW.key_id IS NOT NULL AND NEW.note IS NOT NULL AND NEW.created_at IS NOT NULL
 AND ((NEW.seal_id > 0 OR NEW.seal_id = -1)
           AND coalesce(NEW.tree_size >= 1, 1)
           AND coalesce(length(NEW.root_hex) = 64 AND NEW.root_hex NOT GLOB '*[^0-9a-f]*', 1)
           AND coalesce(length(NEW.origin) BETWEEN 1 AND 200
          AND NEW.origin NOT GLOB '*[' || char(9, 10, 13, 32, 43) || ']*', 1)
           AND coalesce(length(NEW.key_id) = 8 AND NEW.key_id NOT GLOB '*[^0-9a-f]*', 1)
           AND coalesce(substr(NEW.note, 1, length(NEW.origin) + length(NEW.tree_size) + 2)
          = NEW.origin || char(10) || NEW.tree_size || char(10), 1)
           OR (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints))
BEGIN
    INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
    SELECT e.seq, e.body, e.leaf, cassette_chain_hash(e.seq, e.prev, e.leaf)
    FROM (SELECT n.seq, n.prev, n.body, cassette_leaf_hash(n.body) AS leaf
          FROM (SELECT coalesce(h.seq + 1, 0) AS seq, coalesce(h.chain_hash, zeroblob(32)) AS prev,
                       json_object('table', 'cassette_seals', 'op', 'INSERT', 'key', k.id,
                           'row', json_object(
                               'seal_id', k.id, 'tree_size', NEW.tree_size,
                               'root_hex', NEW.root_hex, 'origin', NEW.origin,
                               'key_id', NEW.key_id, 'note', NEW.note,
                               'created_at', NEW.created_at)) AS body
                FROM (SELECT max(seq) AS seq, chain_hash FROM cassette_journal NOT INDEXED) h,
                     (SELECT CASE WHEN NEW.seal_id = -1
                                  THEN coalesce((SELECT seal_id FROM cassette_seals NOT INDEXED
                                                 ORDER BY seal_id DESC LIMIT 1), 0) + 1
                                  ELSE NEW.seal_id END AS id) k
                LIMIT -1 OFFSET 0) n
          LIMIT -1 OFFSET 0) e;
END;
