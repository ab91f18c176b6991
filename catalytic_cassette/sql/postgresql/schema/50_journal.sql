-- The journal, its Merkle tree and seals. Every write to a ledger table appends one entry,
-- inside the same transaction, from the table's AFTER trigger: body
-- {"table":T,"op":O,"key":K,"row":R}, leaf = SHA-256(0x00||body), chain = SHA-256(0x02 ||
-- seq as 8-byte big-endian || previous chain || leaf). Bodies, leaf and chain hashes are
-- byte-identical to the SQLite ledger's for the same rows: each body is concatenated here
-- with the same key order and JSON text SQLite's json_object() writes (json_build_object
-- would add spaces). The journal is append-only; a seal binds a tree size and its root.

CREATE TABLE cassette_journal (
    seq bigint PRIMARY KEY CHECK (seq >= 0),
    body text NOT NULL,
    leaf_hash bytea NOT NULL CHECK (length(leaf_hash) = 32),
    chain_hash bytea NOT NULL CHECK (length(chain_hash) = 32),
    tbl text NOT NULL,
    row_key text NOT NULL
);

-- Seals: the same cassette_seals rows as on SQLite (a signed C2SP note of a tree size and
-- its RFC 9162 root), journaled with the same bodies, each checked against the root the
-- server recomputes from the journal's leaves. So a ledger copied here with its seals
-- keeps them, and the seals of its source still hold on it (LAW.md, Copies). The root is
-- folded from the leaves in seq order each time a seal is inserted (no node is stored):
-- O(tree size) per seal.
CREATE TABLE cassette_seals (
    seal_id bigint PRIMARY KEY CHECK (seal_id > 0),
    tree_size bigint NOT NULL,
    root_hex text NOT NULL,
    origin text NOT NULL,
    key_id text NOT NULL,
    note text NOT NULL,
    created_at bigint NOT NULL
);

CREATE INDEX cassette_journal_action_entries ON cassette_journal (row_key)
    WHERE tbl = 'cassette_actions';

CREATE INDEX cassette_journal_receipt_entries ON cassette_journal (row_key)
    WHERE tbl = 'cassette_receipts';

-- The JSON text SQLite's json_object() writes for an integer or a text value. The text
-- form is STABLE (to_json is), so the planner inlines it into each body.
CREATE FUNCTION cassette_j(value bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT coalesce(value::text, 'null') $$;

CREATE FUNCTION cassette_j(value text) RETURNS text
LANGUAGE sql STABLE AS $$ SELECT coalesce(to_json(value)::text, 'null') $$;

CREATE FUNCTION cassette_journal_append(tbl text, op text, key_json text, row_key text, row_json text)
RETURNS void LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
BEGIN
    -- seq, leaf_hash and chain_hash: the journal's guard computes them
    INSERT INTO cassette_journal (body, tbl, row_key)
    VALUES ('{"table":' || cassette_j(tbl) || ',"op":' || cassette_j(op)
            || ',"key":' || key_json || ',"row":' || row_json || '}', tbl, row_key);
END $$;

CREATE FUNCTION cassette_journal_append(tbl text, op text, row_key text, row_json text)
RETURNS void LANGUAGE sql AS $$
    SELECT cassette_journal_append(tbl, op, row_key, row_key, row_json)
$$;

-- The number of entries the journal holds, as the caller's snapshot sees them.
CREATE FUNCTION cassette_journal_size() RETURNS bigint
LANGUAGE sql STABLE
SET search_path = public, pg_temp AS $$
    SELECT coalesce((SELECT seq FROM cassette_journal ORDER BY seq DESC LIMIT 1) + 1, 0)
$$;

-- RFC 9162 MTH of the first tree_size leaves: each leaf is pushed on a stack of complete
-- subtrees, merged while the count of leaves so far has a trailing one bit; the stack is
-- then folded right to left.
CREATE FUNCTION cassette_tree_root(tree_size bigint) RETURNS bytea
LANGUAGE plpgsql STABLE
SET search_path = public, pg_temp AS $$
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

CREATE FUNCTION cassette_journal_guard() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
SET search_path = public, pg_temp AS $$
DECLARE
    last_seq bigint;
    last_chain bytea;
    leaf bytea;
    chain bytea;
BEGIN
    IF (SELECT tx FROM cassette_head) IS DISTINCT FROM pg_current_xact_id() THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: entries are appended by the journal''s triggers only';
    END IF;
    SELECT j.seq, j.chain_hash INTO last_seq, last_chain
      FROM cassette_journal j ORDER BY j.seq DESC LIMIT 1;
    IF NOT FOUND THEN
        last_seq := -1;
        last_chain := '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea;
    END IF;
    IF NEW.seq IS DISTINCT FROM last_seq + 1 AND NEW.seq IS NOT NULL THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: entries are appended by the journal''s triggers only';
    END IF;
    leaf := sha256('\x00'::bytea || convert_to(NEW.body, 'UTF8'));
    chain := sha256('\x02'::bytea || int8send(last_seq + 1) || last_chain || leaf);
    IF (NEW.leaf_hash IS NOT NULL AND NEW.leaf_hash IS DISTINCT FROM leaf)
       OR (NEW.chain_hash IS NOT NULL AND NEW.chain_hash IS DISTINCT FROM chain) THEN
        RAISE EXCEPTION 'JOURNAL_BROKEN: an entry''s leaf and chain hashes are computed from its body';
    END IF;
    NEW.seq := last_seq + 1;
    NEW.leaf_hash := leaf;
    NEW.chain_hash := chain;
    RETURN NEW;
END $$;

-- A seal's root is folded before the insert takes the head, not under it, so no writer
-- of the fleet waits for the fold (0.23 s at 10^5 entries, seconds at 10^6). The fold
-- runs in the statement's view of committed entries: entries below a seq that is visible
-- are committed and never change (append-only for every session; the owner who turns the
-- triggers off is verify's to catch), so a root folded there is the root under the lock
-- too. When the fold saw fewer entries than the seal covers (entries committed meanwhile,
-- or none), it is folded again under the head.
CREATE FUNCTION cassette_seals_insert() RETURNS trigger
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
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

CREATE FUNCTION cassette_seals_journal() RETURNS trigger
LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
BEGIN
    PERFORM cassette_journal_append(TG_TABLE_NAME, TG_OP, cassette_j(NEW.seal_id),
        '{"seal_id":' || cassette_j(NEW.seal_id) || ',"tree_size":' || cassette_j(NEW.tree_size)
        || ',"root_hex":' || cassette_j(NEW.root_hex) || ',"origin":' || cassette_j(NEW.origin)
        || ',"key_id":' || cassette_j(NEW.key_id) || ',"note":' || cassette_j(NEW.note)
        || ',"created_at":' || cassette_j(NEW.created_at) || '}');
    RETURN NULL;
END $$;

CREATE TRIGGER cassette_journal_guard BEFORE INSERT ON cassette_journal
    FOR EACH ROW EXECUTE FUNCTION cassette_journal_guard();

CREATE TRIGGER cassette_journal_no_change BEFORE UPDATE OR DELETE ON cassette_journal
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_journal_no_truncate BEFORE TRUNCATE ON cassette_journal
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_seals_insert BEFORE INSERT ON cassette_seals
    FOR EACH ROW EXECUTE FUNCTION cassette_seals_insert();

CREATE TRIGGER cassette_seals_journal AFTER INSERT ON cassette_seals
    FOR EACH ROW EXECUTE FUNCTION cassette_seals_journal();

CREATE TRIGGER cassette_seals_no_change BEFORE UPDATE OR DELETE ON cassette_seals
    FOR EACH ROW EXECUTE FUNCTION cassette_append_only();

CREATE TRIGGER cassette_seals_no_truncate BEFORE TRUNCATE ON cassette_seals
    FOR EACH STATEMENT EXECUTE FUNCTION cassette_append_only();
