-- Migration 0009: the Merkle tree grows a block of 256 leaves at a time.
--
-- Until now every odd journal entry inserted the nodes it completed, in its own
-- statement: a tree page dirtied by most commits and a node statement per entry, the
-- largest single cost of the write path (docs/BENCHMARKS.md, "Issue 12"). Now the
-- entry that ends an aligned block of 256 leaves (seq % 256 = 255) inserts every node
-- of that block, level by level, and then the nodes above it that end at that entry.
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
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT r.leaf_end, 2, cassette_node_hash(l.hash, r.hash)
    FROM cassette_tree_nodes r JOIN cassette_tree_nodes l ON l.leaf_end = r.leaf_end - 2 AND l.level = 1
    WHERE r.leaf_end BETWEEN NEW.seq - 255 AND NEW.seq AND r.level = 1 AND r.leaf_end % 4 = 3
      AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = r.leaf_end AND level = 2)
    ORDER BY r.leaf_end;
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT r.leaf_end, 3, cassette_node_hash(l.hash, r.hash)
    FROM cassette_tree_nodes r JOIN cassette_tree_nodes l ON l.leaf_end = r.leaf_end - 4 AND l.level = 2
    WHERE r.leaf_end BETWEEN NEW.seq - 255 AND NEW.seq AND r.level = 2 AND r.leaf_end % 8 = 7
      AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = r.leaf_end AND level = 3)
    ORDER BY r.leaf_end;
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT r.leaf_end, 4, cassette_node_hash(l.hash, r.hash)
    FROM cassette_tree_nodes r JOIN cassette_tree_nodes l ON l.leaf_end = r.leaf_end - 8 AND l.level = 3
    WHERE r.leaf_end BETWEEN NEW.seq - 255 AND NEW.seq AND r.level = 3 AND r.leaf_end % 16 = 15
      AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = r.leaf_end AND level = 4)
    ORDER BY r.leaf_end;
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT r.leaf_end, 5, cassette_node_hash(l.hash, r.hash)
    FROM cassette_tree_nodes r JOIN cassette_tree_nodes l ON l.leaf_end = r.leaf_end - 16 AND l.level = 4
    WHERE r.leaf_end BETWEEN NEW.seq - 255 AND NEW.seq AND r.level = 4 AND r.leaf_end % 32 = 31
      AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = r.leaf_end AND level = 5)
    ORDER BY r.leaf_end;
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT r.leaf_end, 6, cassette_node_hash(l.hash, r.hash)
    FROM cassette_tree_nodes r JOIN cassette_tree_nodes l ON l.leaf_end = r.leaf_end - 32 AND l.level = 5
    WHERE r.leaf_end BETWEEN NEW.seq - 255 AND NEW.seq AND r.level = 5 AND r.leaf_end % 64 = 63
      AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = r.leaf_end AND level = 6)
    ORDER BY r.leaf_end;
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT r.leaf_end, 7, cassette_node_hash(l.hash, r.hash)
    FROM cassette_tree_nodes r JOIN cassette_tree_nodes l ON l.leaf_end = r.leaf_end - 64 AND l.level = 6
    WHERE r.leaf_end BETWEEN NEW.seq - 255 AND NEW.seq AND r.level = 6 AND r.leaf_end % 128 = 127
      AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = r.leaf_end AND level = 7)
    ORDER BY r.leaf_end;
    -- The block's root, then the nodes above it that end at this entry, as the old
    -- trigger grew them: each from its completed left sibling and the node below it.
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT NEW.seq, level, hash FROM (
        WITH RECURSIVE up(level, hash) AS (
            SELECT 8, cassette_node_hash(
                (SELECT hash FROM cassette_tree_nodes WHERE leaf_end = NEW.seq - 128 AND level = 7),
                (SELECT hash FROM cassette_tree_nodes WHERE leaf_end = NEW.seq AND level = 7))
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

-- Recording a seal stores the nodes of the incomplete block that its size completes
-- (the same statements as above, over the seal's range), before the seal guard of 0004
-- folds the stored nodes into the root it checks. (SQLite fires the newest BEFORE
-- trigger first; a refused seal undoes these inserts with the rest of its statement.)
CREATE TRIGGER cassette_seals_store_tail BEFORE INSERT ON cassette_seals
WHEN typeof(NEW.tree_size) = 'integer' AND NEW.tree_size % 256 > 1
BEGIN
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT r.seq, 1, cassette_node_hash(l.leaf_hash, r.leaf_hash)
    FROM cassette_journal AS r NOT INDEXED
    JOIN cassette_journal AS l NOT INDEXED ON l.seq = r.seq - 1
    WHERE r.seq BETWEEN NEW.tree_size - NEW.tree_size % 256 AND NEW.tree_size - 1 AND r.seq % 2 = 1
      AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = r.seq AND level = 1)
    ORDER BY r.seq;
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT r.leaf_end, 2, cassette_node_hash(l.hash, r.hash)
    FROM cassette_tree_nodes r JOIN cassette_tree_nodes l ON l.leaf_end = r.leaf_end - 2 AND l.level = 1
    WHERE r.leaf_end BETWEEN NEW.tree_size - NEW.tree_size % 256 AND NEW.tree_size - 1 AND r.level = 1 AND r.leaf_end % 4 = 3
      AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = r.leaf_end AND level = 2)
    ORDER BY r.leaf_end;
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT r.leaf_end, 3, cassette_node_hash(l.hash, r.hash)
    FROM cassette_tree_nodes r JOIN cassette_tree_nodes l ON l.leaf_end = r.leaf_end - 4 AND l.level = 2
    WHERE r.leaf_end BETWEEN NEW.tree_size - NEW.tree_size % 256 AND NEW.tree_size - 1 AND r.level = 2 AND r.leaf_end % 8 = 7
      AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = r.leaf_end AND level = 3)
    ORDER BY r.leaf_end;
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT r.leaf_end, 4, cassette_node_hash(l.hash, r.hash)
    FROM cassette_tree_nodes r JOIN cassette_tree_nodes l ON l.leaf_end = r.leaf_end - 8 AND l.level = 3
    WHERE r.leaf_end BETWEEN NEW.tree_size - NEW.tree_size % 256 AND NEW.tree_size - 1 AND r.level = 3 AND r.leaf_end % 16 = 15
      AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = r.leaf_end AND level = 4)
    ORDER BY r.leaf_end;
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT r.leaf_end, 5, cassette_node_hash(l.hash, r.hash)
    FROM cassette_tree_nodes r JOIN cassette_tree_nodes l ON l.leaf_end = r.leaf_end - 16 AND l.level = 4
    WHERE r.leaf_end BETWEEN NEW.tree_size - NEW.tree_size % 256 AND NEW.tree_size - 1 AND r.level = 4 AND r.leaf_end % 32 = 31
      AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = r.leaf_end AND level = 5)
    ORDER BY r.leaf_end;
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT r.leaf_end, 6, cassette_node_hash(l.hash, r.hash)
    FROM cassette_tree_nodes r JOIN cassette_tree_nodes l ON l.leaf_end = r.leaf_end - 32 AND l.level = 5
    WHERE r.leaf_end BETWEEN NEW.tree_size - NEW.tree_size % 256 AND NEW.tree_size - 1 AND r.level = 5 AND r.leaf_end % 64 = 63
      AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = r.leaf_end AND level = 6)
    ORDER BY r.leaf_end;
    INSERT INTO cassette_tree_nodes (leaf_end, level, hash)
    SELECT r.leaf_end, 7, cassette_node_hash(l.hash, r.hash)
    FROM cassette_tree_nodes r JOIN cassette_tree_nodes l ON l.leaf_end = r.leaf_end - 64 AND l.level = 6
    WHERE r.leaf_end BETWEEN NEW.tree_size - NEW.tree_size % 256 AND NEW.tree_size - 1 AND r.level = 6 AND r.leaf_end % 128 = 127
      AND NOT EXISTS (SELECT 1 FROM cassette_tree_nodes WHERE leaf_end = r.leaf_end AND level = 7)
    ORDER BY r.leaf_end;
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
