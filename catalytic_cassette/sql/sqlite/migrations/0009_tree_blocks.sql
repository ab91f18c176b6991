-- Migration 0009: the Merkle tree grows a block of 256 leaves at a time.
--
-- Until now every odd journal entry inserted the nodes it completed, in its own
-- statement: a tree page dirtied by most commits and a node statement per entry, the
-- largest single cost of the write path (docs/BENCHMARKS.md, "Issue 12"). Now the
-- entry that ends an aligned block of 256 leaves (seq % 256 = 255) stores every node of
-- that block and the nodes above it that end at that entry: its level-1 nodes, each of
-- which completes the nodes above it that end where it ends.
-- Nodes, their encoding and the insert guard that checks each one are unchanged, so
-- every proof and seal made before still holds.
--
-- The nodes of the last, incomplete block are never stored: whoever needs them computes
-- them from its leaves (at most 255), the seal guard included, and no connection may
-- store one (the bound below). So what is stored is exact, and verify checks it: every
-- node of every complete block, no more, no less; and nobody can plant a node over other
-- writers' entries before their block completes.

DROP TRIGGER cassette_journal_grow_tree;

-- The journal's trigger stays small on purpose: SQLite allocates and zeroes a frame as
-- large as a trigger's program for every row it fires on, even when its WHEN clause is
-- false, so a trigger on every append must be short. It stores the block's level-1
-- nodes (the trigger below adds the ones above them) and fails closed if the block's
-- root is not then stored, so no connection can leave a block incomplete.
CREATE TRIGGER cassette_journal_grow_tree AFTER INSERT ON cassette_journal
WHEN NEW.seq % 256 = 255
BEGIN
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT r.seq, 1, cassette_node_hash(l.leaf_hash, r.leaf_hash)
    FROM cassette_journal AS r NOT INDEXED
    JOIN cassette_journal AS l NOT INDEXED ON l.seq = r.seq - 1
    WHERE r.seq BETWEEN NEW.seq - 255 AND NEW.seq AND r.seq % 2 = 1
      AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = r.seq AND level = 1)
    ORDER BY r.seq;
    SELECT RAISE(ABORT, 'TREE_BROKEN: a complete block of the journal stores its tree nodes')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = NEW.seq AND level = 8);
END;

-- A level-1 node completes every node above it that ends at the same entry, bottom up,
-- each from its completed left sibling and the node below it: one statement, so nothing
-- depends on recursive_triggers (these inserts are level 2 and up, and do not fire this
-- trigger again). A node already stored is skipped: none should be (the bound below
-- refuses nodes of an incomplete block), but no stored node may ever make an append fail.
CREATE TRIGGER cassette_tree_nodes_grow AFTER INSERT ON cassette_tree_nodes
WHEN NEW.level = 1 AND NEW.leaf_end % 4 = 3
BEGIN
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT NEW.leaf_end, level, hash FROM (
        WITH RECURSIVE up(level, hash) AS (
            SELECT 1, NEW.hash
            UNION ALL
            SELECT up.level + 1, cassette_node_hash(
                (SELECT hash FROM cassette_tree_nodes
                 WHERE leaf_end = NEW.leaf_end - (1 << up.level) AND level = up.level),
                up.hash)
            FROM up WHERE (NEW.leaf_end + 1) % (1 << (up.level + 1)) = 0
        )
        SELECT level, hash FROM up WHERE level > 1 ORDER BY level
    ) AS above
    WHERE NOT EXISTS (SELECT 1 FROM cassette_tree_nodes
                      WHERE leaf_end = NEW.leaf_end AND level = above.level);
END;

-- The seal guard of 0004, re-created: the subtrees of the sealed size that lie in the
-- incomplete last block (levels below 8) are folded from the journal's leaves by the
-- package's aggregate cassette_subtree_hash; the larger ones are stored nodes, as before.
DROP TRIGGER cassette_seals_insert_guard;
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

-- A node covers only complete blocks of journaled entries (0005 said: only journaled
-- entries): the nodes of the incomplete block are nobody's to store, so nobody can plant
-- one over other writers' entries before the block that completes them.
DROP TRIGGER cassette_tree_nodes_bounded;
CREATE TRIGGER cassette_tree_nodes_bounded BEFORE INSERT ON cassette_tree_nodes
BEGIN
    SELECT RAISE(ABORT, 'TREE_BROKEN: a tree node covers only complete blocks of journaled entries')
    WHERE typeof(NEW.leaf_end) IS NOT 'integer'
       OR NEW.leaf_end >= coalesce((SELECT seq + 1 - (seq + 1) % 256 FROM cassette_journal
                                    NOT INDEXED ORDER BY seq DESC LIMIT 1), 0);
END;

-- A ledger written before this migration stored every node up to its head; keep only
-- what the rule above stores: the nodes of its last, incomplete block go (they are the
-- hashes of leaves that stay, and every reader recomputes them). The only time a node is
-- deleted, by the migration itself.
DROP TRIGGER cassette_tree_nodes_no_delete;
DELETE FROM cassette_tree_nodes
 WHERE leaf_end >= (SELECT n - n % 256 FROM (SELECT coalesce(max(seq) + 1, 0) AS n
                                            FROM cassette_journal));
CREATE TRIGGER cassette_tree_nodes_no_delete BEFORE DELETE ON cassette_tree_nodes
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_tree_nodes rows cannot be deleted'); END;

-- This migration records itself, once (see 0005).
DROP TRIGGER cassette_migrations_insert_guard;
CREATE TRIGGER cassette_migrations_insert_guard BEFORE INSERT ON cassette_migrations
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be replaced')
    WHERE EXISTS (SELECT 1 FROM cassette_migrations WHERE version = NEW.version);
    SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: only a cassette connection migrates the ledger')
    WHERE NOT EXISTS (SELECT 1 FROM pragma_function_list WHERE name = 'cassette_chain_hash');
    SELECT RAISE(ABORT, 'MIGRATION_FAILED: only the migration being applied records itself')
    WHERE NEW.version IS NOT 9 OR NEW.name IS NOT 'tree_blocks'
       OR typeof(NEW.sha256) IS NOT 'text' OR length(NEW.sha256) IS NOT 64
       OR NEW.sha256 GLOB '*[^0-9a-f]*';
END;
