-- 0004: anchors. The RFC 9162 Merkle tree over the journal's leaf hashes, stored as
-- its nodes complete, and the seals (signed checkpoints) recorded in the ledger.
-- LAW.md, "Merkle tree" and "Seals", gives the encodings.

-- The ledger's own name for the default seal origin. A verifier never trusts it: it
-- pins the origin it expects (LAW.md, "Seals").
INSERT INTO cassette_meta (key, value) VALUES ('ledger_id', lower(hex(randomblob(16))));

-- A complete aligned subtree of `2^level` leaves whose last leaf is journal seq
-- `leaf_end`. The key orders nodes as they complete (by their last leaf, then level), so
-- verify reads them in one pass beside the journal. Leaves (level 0) are the journal's
-- own leaf_hash column.
CREATE TABLE cassette_tree_nodes (
    leaf_end INTEGER NOT NULL CONSTRAINT TREE_BROKEN CHECK (leaf_end >= 1),
    level INTEGER NOT NULL CONSTRAINT TREE_BROKEN CHECK (level BETWEEN 1 AND 62),
    hash BLOB NOT NULL CONSTRAINT TREE_BROKEN CHECK (length(hash) = 32),
    CONSTRAINT TREE_BROKEN CHECK ((leaf_end + 1) % (1 << level) = 0),
    PRIMARY KEY (leaf_end, level)
) STRICT, WITHOUT ROWID;

CREATE TRIGGER cassette_tree_nodes_no_update BEFORE UPDATE ON cassette_tree_nodes
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_tree_nodes rows cannot be updated'); END;
CREATE TRIGGER cassette_tree_nodes_no_delete BEFORE DELETE ON cassette_tree_nodes
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_tree_nodes rows cannot be deleted'); END;

-- A node is the hash of its two children, which must exist. The hash check calls the
-- package's cassette_node_hash, so a connection without it cannot add nodes at all
-- (it fails closed with "no such function"), like the journal.
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

-- Appending leaf `seq` completes the subtrees of 2, 4, 8, ... leaves that end at it:
-- level l completes when (seq + 1) is a multiple of 2^l. One statement computes them
-- bottom up, each from its completed left sibling and the node below it.
CREATE TRIGGER cassette_journal_grow_tree AFTER INSERT ON cassette_journal
WHEN NEW.seq % 2 = 1
BEGIN
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT NEW.seq, level, hash FROM (
        WITH RECURSIVE up(level, hash) AS (
            SELECT 1, cassette_node_hash(
                (SELECT leaf_hash FROM cassette_journal WHERE seq = NEW.seq - 1), NEW.leaf_hash)
            UNION ALL
            SELECT up.level + 1, cassette_node_hash(
                (SELECT hash FROM cassette_tree_nodes
                 WHERE leaf_end = NEW.seq - (1 << up.level) AND level = up.level),
                up.hash)
            FROM up WHERE (NEW.seq + 1) % (1 << (up.level + 1)) = 0
        )
        SELECT level, hash FROM up ORDER BY level
    );
END;

-- The journal written before this migration: its level-1 nodes in order, each firing
-- a one-off trigger that completes the levels above it, as the grow trigger would have.
-- (The migration runner's connection has recursive_triggers on.) The insert guard
-- checks every node.
CREATE TRIGGER cassette_tree_backfill AFTER INSERT ON cassette_tree_nodes
WHEN (NEW.leaf_end + 1) % (1 << (NEW.level + 1)) = 0
BEGIN
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT NEW.leaf_end, NEW.level + 1, cassette_node_hash(
        (SELECT hash FROM cassette_tree_nodes
         WHERE leaf_end = NEW.leaf_end - (1 << NEW.level) AND level = NEW.level),
        NEW.hash);
END;

INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
SELECT b.seq, 1, cassette_node_hash(a.leaf_hash, b.leaf_hash)
FROM cassette_journal a JOIN cassette_journal b ON b.seq = a.seq + 1
WHERE b.seq % 2 = 1 ORDER BY b.seq;

DROP TRIGGER cassette_tree_backfill;

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

CREATE TRIGGER cassette_seals_no_update BEFORE UPDATE ON cassette_seals
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_seals rows cannot be updated'); END;
CREATE TRIGGER cassette_seals_no_delete BEFORE DELETE ON cassette_seals
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_seals rows cannot be deleted'); END;

-- The sealed root must be the root of the ledger's first tree_size entries. The root
-- of n leaves folds the complete subtrees of n's binary digits, smallest first: for
-- bit b, the subtree of 2^b leaves ending at leaf ((n >> (b + 1)) << (b + 1)) + 2^b - 1.
-- Calls cassette_node_hash, so only a package connection records seals. One trigger, so
-- the checks run in this order (SQLite fires the newest BEFORE trigger first).
CREATE TRIGGER cassette_seals_insert_guard BEFORE INSERT ON cassette_seals
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: a seal with this seal_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_seals WHERE seal_id = NEW.seal_id);
    SELECT RAISE(ABORT, 'OUT_OF_ORDER: a seal_id must be larger than every existing one')
    WHERE EXISTS (SELECT 1 FROM cassette_seals WHERE seal_id > NEW.seal_id);
    SELECT RAISE(ABORT, 'INVALID_SEAL: a seal covers at least one entry')
    WHERE typeof(NEW.tree_size) IS NOT 'integer' OR NEW.tree_size < 1;
    SELECT RAISE(ABORT, 'INVALID_SEAL: a seal covers at most the entries the journal has')
    WHERE NEW.tree_size > coalesce((SELECT max(seq) + 1 FROM cassette_journal), 0);
    SELECT RAISE(ABORT, 'SEAL_MISMATCH: the sealed root is not the ledger''s root at that size')
    WHERE NEW.root_hex IS NOT (
        SELECT lower(hex(acc)) FROM (
            WITH RECURSIVE fold(b, started, acc) AS (
                SELECT 0, 0, NULL
                UNION ALL
                SELECT b + 1,
                       started OR (NEW.tree_size >> b) & 1,
                       CASE WHEN (NEW.tree_size >> b) & 1 = 0 THEN acc
                            WHEN b = 0 THEN (SELECT leaf_hash FROM cassette_journal
                                             WHERE seq = NEW.tree_size - 1)
                            WHEN started THEN cassette_node_hash(
                                (SELECT hash FROM cassette_tree_nodes
                                 WHERE level = b AND leaf_end = ((NEW.tree_size >> (b + 1)) << (b + 1))
                                                                + (1 << b) - 1),
                                acc)
                            ELSE (SELECT hash FROM cassette_tree_nodes
                                  WHERE level = b AND leaf_end = ((NEW.tree_size >> (b + 1)) << (b + 1))
                                                                 + (1 << b) - 1) END
                FROM fold WHERE (NEW.tree_size >> b) > 0
            )
            SELECT acc FROM fold ORDER BY b DESC LIMIT 1
        )
    );
END;

CREATE TRIGGER cassette_seals_journaled AFTER INSERT ON cassette_seals
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal
                 WHERE tbl = 'cassette_seals' AND row_key = +NEW.seal_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;
