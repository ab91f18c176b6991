-- Migration 0009: the Merkle tree grows a block of 256 leaves at a time.
--
-- Until now every odd journal entry inserted the nodes it completed, in its own
-- statement: a tree page dirtied by most commits and a node statement per entry, the
-- largest single cost of the write path (docs/BENCHMARKS.md, "Issue 12"). Now the
-- entry that ends an aligned block of 256 leaves (seq % 256 = 255) stores every node of
-- that block and the nodes above it that end at that entry: its level-1 nodes, each of
-- which completes its parent when it is a right child, and so on up.
-- Nodes, their encoding and the insert guard that checks each one are unchanged, so
-- every proof and seal made before still holds.
--
-- The nodes of the last, incomplete block are not stored until it completes: whoever
-- needs them computes them from its leaves (at most 255). Recording a seal first stores
-- the ones its size completes (the seal guard folds only stored nodes, each checked by
-- the node guard), so every statement here skips a node that is already stored. What is
-- stored is thus exact, and verify checks it: every node of every complete block, and in
-- the last block the nodes within the largest seal recorded in it, no more.

DROP TRIGGER cassette_journal_grow_tree;

-- The journal's trigger stays small on purpose: SQLite allocates and zeroes a frame as
-- large as a trigger's program for every row it fires on, even when its WHEN clause is
-- false, so a trigger on every append must be short. It stores the block's level-1
-- nodes; the trigger below completes each node's parent when it is a right child, level
-- by level, up to the block's root and above (the package's connections run with
-- recursive_triggers on, as the migration of 0004 did).
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
END;

-- A node that is a right child completes its parent, from its left sibling. A parent
-- already stored is skipped, so a node stored early (by a seal) never makes a later
-- append fail.
CREATE TRIGGER cassette_tree_nodes_grow AFTER INSERT ON cassette_tree_nodes
WHEN (NEW.leaf_end + 1) % (1 << (NEW.level + 1)) = 0
BEGIN
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT NEW.leaf_end, NEW.level + 1, cassette_node_hash(l.hash, NEW.hash)
    FROM cassette_tree_nodes l
    WHERE l.leaf_end = NEW.leaf_end - (1 << NEW.level) AND l.level = NEW.level
      AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes
                      WHERE leaf_end = NEW.leaf_end AND level = NEW.level + 1);
END;

-- Recording a seal stores the level-1 nodes of the incomplete block within its size
-- (their parents follow, as above) before the seal guard of 0004 folds the stored nodes
-- into the root it checks. (SQLite fires the newest BEFORE trigger first; a refused seal
-- undoes these inserts with the rest of its statement.)
CREATE TRIGGER cassette_seals_store_tail BEFORE INSERT ON cassette_seals
WHEN typeof(NEW.tree_size) = 'integer' AND NEW.tree_size % 256 > 1
BEGIN
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT r.seq, 1, cassette_node_hash(l.leaf_hash, r.leaf_hash)
    FROM cassette_journal AS r NOT INDEXED
    JOIN cassette_journal AS l NOT INDEXED ON l.seq = r.seq - 1
    WHERE r.seq BETWEEN NEW.tree_size - NEW.tree_size % 256 AND NEW.tree_size - 1
      AND r.seq % 2 = 1
      AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = r.seq AND level = 1)
    ORDER BY r.seq;
END;

-- A ledger written before this migration stored every node up to its head; keep only
-- what the rule above stores, so that what is stored stays exact: the nodes of the last
-- block beyond its largest seal go (they are the hashes of leaves that stay, and any
-- reader recomputes them). The only time a node is deleted, by the migration itself.
DROP TRIGGER cassette_tree_nodes_no_delete;
DELETE FROM cassette_tree_nodes
 WHERE leaf_end >= (SELECT n - n % 256 FROM (SELECT coalesce(max(seq) + 1, 0) AS n
                                            FROM cassette_journal))
   AND leaf_end >= coalesce((SELECT max(tree_size) FROM cassette_seals
                             WHERE tree_size > (SELECT n - n % 256
                                                FROM (SELECT coalesce(max(seq) + 1, 0) AS n
                                                      FROM cassette_journal))), 0);
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
