-- Migration 0008: the journal's table and key stored in each entry.
--
-- Until now `tbl` and `row_key` were VIRTUAL generated columns: every check of the by-row
-- index against its table (verify's integrity_check) parsed every body again, about 2 us
-- per entry (LAW.md section 10, docs/BENCHMARKS.md "Issue 11, second pass"). STORED, they
-- are computed once, when the entry is written, from the body, by SQLite alone. Bodies,
-- hashes and seqs are copied unchanged, so every proof and seal still holds.
--
-- A stored value can be rewritten behind its expression by someone with writable_schema,
-- without touching the body; verify compares both (finding `journal_columns`).

-- Legacy renaming leaves the other tables' triggers naming cassette_journal, which is the
-- rebuilt table by the end of this migration.
PRAGMA legacy_alter_table = ON;

ALTER TABLE cassette_journal RENAME TO cassette_journal_before_0008;

CREATE TABLE cassette_journal (
    seq INTEGER PRIMARY KEY CONSTRAINT JOURNAL_BROKEN CHECK (seq >= 0),
    body TEXT NOT NULL CONSTRAINT JOURNAL_BROKEN CHECK (json_valid(body)),
    leaf_hash BLOB NOT NULL CONSTRAINT JOURNAL_BROKEN CHECK (length(leaf_hash) = 32),
    chain_hash BLOB NOT NULL CONSTRAINT JOURNAL_BROKEN CHECK (length(chain_hash) = 32),
    tbl TEXT GENERATED ALWAYS AS (json_extract(body, '$.table')) STORED,
    row_key ANY GENERATED ALWAYS AS (json_extract(body, '$.key')) STORED
) STRICT;

INSERT INTO cassette_journal (seq, body, leaf_hash, chain_hash)
SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal_before_0008 ORDER BY seq;

DROP TABLE cassette_journal_before_0008;

PRAGMA legacy_alter_table = OFF;

CREATE INDEX cassette_journal_by_row ON cassette_journal (tbl, row_key, seq);

-- The journal's own rules, as migrations 0001-0007 left them.
CREATE TRIGGER cassette_journal_no_update BEFORE UPDATE ON cassette_journal
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_journal rows cannot be updated'); END;

CREATE TRIGGER cassette_journal_no_delete BEFORE DELETE ON cassette_journal
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_journal rows cannot be deleted'); END;

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

-- This migration records itself, once (see 0005).
DROP TRIGGER cassette_migrations_insert_guard;
CREATE TRIGGER cassette_migrations_insert_guard BEFORE INSERT ON cassette_migrations
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be replaced')
    WHERE EXISTS (SELECT 1 FROM cassette_migrations WHERE version = NEW.version);
    SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: only a cassette connection migrates the ledger')
    WHERE NOT EXISTS (SELECT 1 FROM pragma_function_list WHERE name = 'cassette_chain_hash');
    SELECT RAISE(ABORT, 'MIGRATION_FAILED: only the migration being applied records itself')
    WHERE NEW.version IS NOT 8 OR NEW.name IS NOT 'journal_columns'
       OR typeof(NEW.sha256) IS NOT 'text' OR length(NEW.sha256) IS NOT 64
       OR NEW.sha256 GLOB '*[^0-9a-f]*';
END;
