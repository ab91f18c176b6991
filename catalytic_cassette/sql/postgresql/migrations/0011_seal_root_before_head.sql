-- A seal's root is folded before the insert takes the head, not under it.
--   Before: cassette_seals_insert() took the head (cassette_tx_ms()) first, then folded
--   the tree of every entry the seal covers: every writer of the fleet waited for the
--   whole fold (0.23 s at 10^5 entries, seconds at 10^6).
--   Now the fold runs first, in the statement's view of committed entries. Entries below
--   a seq that is visible are committed and never change (append-only for every session;
--   the owner who turns the triggers off is verify's to catch), so a root folded there is
--   the root under the lock too. When the fold saw fewer entries than the seal covers
--   (entries committed meanwhile, or none), it is folded again under the head, as before.
--   Every check, and the order in which a row that breaks several meets them, is kept.

CREATE OR REPLACE FUNCTION cassette_seals_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    now_ms bigint;
    root bytea;
BEGIN
    IF NEW.tree_size IS NOT NULL AND NEW.tree_size >= 1 THEN
        root := cassette_tree_root(NEW.tree_size);  -- NULL unless all are visible
    END IF;
    now_ms := cassette_tx_ms();  -- the head's lock makes max() the last id
    NEW.created_at := now_ms;
    NEW.seal_id := cassette_next_id(NEW.seal_id, (SELECT coalesce(max(seal_id), 0) + 1 FROM cassette_seals));
    IF NEW.tree_size IS NULL OR NEW.tree_size < 1 THEN
        RAISE EXCEPTION 'INVALID_SEAL: a seal covers at least one entry';
    END IF;
    IF NEW.tree_size > cassette_journal_size() THEN
        RAISE EXCEPTION 'INVALID_SEAL: a seal covers at most the entries the journal has';
    END IF;
    IF NEW.root_hex IS NULL OR NEW.root_hex !~ '^[0-9a-f]{64}$'
       OR NEW.key_id IS NULL OR NEW.key_id !~ '^[0-9a-f]{8}$'
       OR NEW.origin IS NULL OR length(NEW.origin) NOT BETWEEN 1 AND 200
       OR NEW.origin ~ '[\t\n\r +]'
       OR NEW.note IS NULL
       OR left(NEW.note, length(NEW.origin) + length(NEW.tree_size::text) + 2)
          IS DISTINCT FROM NEW.origin || E'\n' || NEW.tree_size || E'\n' THEN
        RAISE EXCEPTION 'INVALID_SEAL: a seal is a signed note of its origin, tree size and root';
    END IF;
    IF root IS NULL THEN
        root := cassette_tree_root(NEW.tree_size);
    END IF;
    IF NEW.root_hex IS DISTINCT FROM encode(root, 'hex') THEN
        RAISE EXCEPTION 'SEAL_MISMATCH: the sealed root is not the ledger''s root at that size';
    END IF;
    RETURN NEW;
END $$;
