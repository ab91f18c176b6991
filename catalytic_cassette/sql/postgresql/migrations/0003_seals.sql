-- Seals on PostgreSQL: the same cassette_seals rows as on SQLite (a signed C2SP note of a
-- tree size and its RFC 9162 root), journaled with the same bodies, each checked against
-- the root the server recomputes from the journal's leaves. So a ledger copied here with
-- its seals keeps them, and the seals of its source still hold on it (LAW.md, Copies).
-- The root is folded from the leaves in seq order each time a seal is inserted (no node
-- is stored yet): O(tree size) per seal.

CREATE TABLE cassette_seals (
    seal_id bigint PRIMARY KEY CHECK (seal_id > 0),
    tree_size bigint NOT NULL,
    root_hex text NOT NULL,
    origin text NOT NULL,
    key_id text NOT NULL,
    note text NOT NULL,
    created_at bigint NOT NULL
);

CREATE TRIGGER cassette_seals_no_change BEFORE UPDATE OR DELETE ON cassette_seals
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();
CREATE TRIGGER cassette_seals_no_truncate BEFORE TRUNCATE ON cassette_seals
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();

-- RFC 9162 MTH of the first tree_size leaves: each leaf is pushed on a stack of complete
-- subtrees, merged while the count of leaves so far has a trailing one bit; the stack is
-- then folded right to left.
CREATE FUNCTION cassette_tree_root(tree_size bigint) RETURNS bytea
LANGUAGE plpgsql STABLE AS $$
DECLARE
    stack bytea[] := '{}';
    leaf bytea;
    count bigint := 0;
    merged bigint;
    acc bytea;
    i integer;
BEGIN
    FOR leaf IN SELECT leaf_hash FROM cassette_journal WHERE seq < tree_size ORDER BY seq LOOP
        stack := stack || leaf;
        count := count + 1;
        merged := count;
        WHILE merged % 2 = 0 LOOP
            i := cardinality(stack);
            stack := stack[1:i - 2] || sha256('\x01'::bytea || stack[i - 1] || stack[i]);
            merged := merged / 2;
        END LOOP;
    END LOOP;
    IF count IS DISTINCT FROM tree_size OR count = 0 THEN
        RETURN NULL;
    END IF;
    i := cardinality(stack);
    acc := stack[i];
    WHILE i > 1 LOOP
        i := i - 1;
        acc := sha256('\x01'::bytea || stack[i] || acc);
    END LOOP;
    RETURN acc;
END $$;

CREATE FUNCTION cassette_seals_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    now_ms bigint;
BEGIN
    now_ms := cassette_tx_ms();  -- first: the head's lock makes max() the last id
    NEW.created_at := now_ms;
    NEW.seal_id := cassette_next_id(NEW.seal_id, (SELECT coalesce(max(seal_id), 0) + 1 FROM cassette_seals));
    IF NEW.tree_size IS NULL OR NEW.tree_size < 1 THEN
        RAISE EXCEPTION 'INVALID_SEAL: a seal covers at least one entry';
    END IF;
    IF NEW.tree_size > (SELECT next_seq FROM cassette_head) THEN
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
    IF NEW.root_hex IS DISTINCT FROM encode(cassette_tree_root(NEW.tree_size), 'hex') THEN
        RAISE EXCEPTION 'SEAL_MISMATCH: the sealed root is not the ledger''s root at that size';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER cassette_seals_insert BEFORE INSERT ON cassette_seals
    FOR EACH ROW EXECUTE FUNCTION cassette_seals_insert();

CREATE FUNCTION cassette_seals_journal() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cassette_journal_append(TG_TABLE_NAME, TG_OP, cassette_j(NEW.seal_id),
        '{"seal_id":' || cassette_j(NEW.seal_id) || ',"tree_size":' || cassette_j(NEW.tree_size)
        || ',"root_hex":' || cassette_j(NEW.root_hex) || ',"origin":' || cassette_j(NEW.origin)
        || ',"key_id":' || cassette_j(NEW.key_id) || ',"note":' || cassette_j(NEW.note)
        || ',"created_at":' || cassette_j(NEW.created_at) || '}');
    RETURN NULL;
END $$;
CREATE TRIGGER cassette_seals_journal AFTER INSERT ON cassette_seals
    FOR EACH ROW EXECUTE FUNCTION cassette_seals_journal();

REVOKE ALL ON cassette_seals FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cassette_tree_root(bigint), cassette_seals_insert(), cassette_seals_journal()
    FROM PUBLIC;
GRANT SELECT ON cassette_seals TO cassette_worker, cassette_appender, cassette_auditor;
