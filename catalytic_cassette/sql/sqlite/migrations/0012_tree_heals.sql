-- Migration 0012: a block a connection left without its tree nodes heals, and no append
-- depends on a node that a connection could keep from being stored.
--
-- SQLite runs a connection's TEMP triggers before the file's own, and RAISE(IGNORE) in an
-- AFTER trigger ends the row's remaining triggers with the row kept. So a client with
-- `CREATE TEMP TRIGGER t AFTER INSERT ON main.cassette_journal WHEN NEW.seq % 256 = 255
-- BEGIN SELECT RAISE(IGNORE); END` on its own connection wrote the last entry of a block
-- and skipped cassette_journal_grow_tree: the block was stored without nodes, and the
-- append that ended any later block failed for every writer (the level 9 node above the
-- next block needs the skipped block's level 8 node: NOT NULL constraint failed), as did
-- every seal (LAW.md section 8a). The same followed from a node the client kept from being
-- stored with a TEMP BEFORE INSERT trigger on cassette_tree_nodes.
--
-- Now:
-- * The entry that ends a block also stores the level-1 nodes of the blocks just before
--   it that have no level 8 node (skipped, the nearest first found, walking back one
--   probe per block; one probe in all when none was skipped), oldest first, so each
--   block's nodes are built on complete blocks before it and the healed nodes are exactly
--   the ones a complete append would have stored. Under a client that skips every block
--   it ends, each block is healed once, by the next writer that ends a block: no append
--   does more than the work the skipped ones left.
-- * A node above a block's level-1 node is built only from a stored left sibling: where
--   one is missing the nodes above it wait (the seal stores them, tree.heal), and the
--   append goes on. Every stored node is still the hash of its two stored children (the
--   insert guard), so the stored nodes stay closed downwards: a stored node implies its
--   whole subtree.
-- Nodes, their encoding and every rule on them are unchanged, so every proof and seal
-- made before still holds; verify still names every node missing until it is healed.

DROP TRIGGER cassette_journal_grow_tree;

-- Kept short (0009: its frame is sized and zeroed on every append): the walk back is one
-- scalar subquery, evaluated once, and one probe when no block was skipped.
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

-- As 0009, but each level above the first is built only on a stored left sibling (an
-- inner join: the climb stops where one is missing, never a NULL node that fails the
-- append).
DROP TRIGGER cassette_tree_nodes_grow;
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

-- This migration records itself, once (see 0005).
DROP TRIGGER cassette_migrations_insert_guard;
CREATE TRIGGER cassette_migrations_insert_guard BEFORE INSERT ON cassette_migrations
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be replaced')
    WHERE EXISTS (SELECT 1 FROM cassette_migrations WHERE version = NEW.version);
    SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: only a cassette connection migrates the ledger')
    WHERE NOT EXISTS (SELECT 1 FROM pragma_function_list WHERE name = 'cassette_chain_hash');
    SELECT RAISE(ABORT, 'MIGRATION_FAILED: only the migration being applied records itself')
    WHERE NEW.version IS NOT 12 OR NEW.name IS NOT 'tree_heals'
       OR typeof(NEW.sha256) IS NOT 'text' OR length(NEW.sha256) IS NOT 64
       OR NEW.sha256 GLOB '*[^0-9a-f]*';
END;
