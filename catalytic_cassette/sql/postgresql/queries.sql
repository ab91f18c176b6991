-- The statements the package sends to a PostgreSQL ledger, by name. postgresql/sqlfiles.py
-- loads every .sql file of this folder (names are unique across them): this one, opening.sql
-- (what opening a ledger sends: the server's check, the session's settings, the migrations'
-- bookkeeping) and verify.sql (verify's reads). Besides these the package sends only the
-- migrations (migrations/, each file whole) and what psycopg itself sends to run them:
-- BEGIN (verify's with its REPEATABLE READ READ ONLY), COMMIT and ROLLBACK around a
-- transaction (a savepoint, were one nested); DECLARE, FETCH and CLOSE around a query read
-- through a server-side cursor; DEALLOCATE of the statements it prepared on its own (one
-- run often). No SQL is written in Python: tests/named_sql.py scans the modules that talk
-- to psycopg and records what the package sends during every PostgreSQL test.
--
-- Parameters are psycopg's %(name)s. A {name} is spliced in by the caller, never from a
-- caller's input: from a fixed list of the package, or (copy_insert) from the destination's
-- own catalog; each such query says which. The rules are the server's: the roles are
-- granted SELECT and EXECUTE only, so they write through the ledger's functions; the
-- owner's other writes (opening.sql's bookkeeping, a seal, a copy's rows and its dating of
-- the head) meet the tables' triggers. flush_commits (committing early) writes one logical
-- WAL message, which no table holds.

-- name: post
SELECT message_id, job_id, existing
  FROM cassette_post(%(run_id)s, %(source)s, %(idempotency_key)s, %(payload_json)s,
                     %(intents)s::text[], %(step_counts)s::integer[], %(step_payloads)s::text[]);

-- name: claim
SELECT step_id, job_id, message_id, ordinal, payload_json, fencing_token, lease_expires_at
  FROM cassette_claim(%(run_id)s, %(worker_id)s, %(n)s, %(ttl_ms)s);

-- name: complete
SELECT cassette_complete(%(run_id)s, %(step_id)s, %(worker_id)s, %(fencing_token)s,
                         %(outcome)s, %(receipt_json)s);

-- name: complete_and_claim
SELECT receipt_id, step_id, job_id, message_id, ordinal, payload_json, fencing_token,
       lease_expires_at
  FROM cassette_complete_and_claim(%(run_id)s, %(step_id)s, %(worker_id)s, %(fencing_token)s,
                                   %(outcome)s, %(receipt_json)s, %(ttl_ms)s);

-- name: release
SELECT cassette_release(%(run_id)s, %(step_id)s, %(worker_id)s, %(fencing_token)s);

-- name: requeue
SELECT step_id, action, fencing_token
  FROM cassette_requeue(%(run_id)s, %(step_id)s, %(max_attempts)s);

-- ------------------------------------------------------------- worker keys
-- A signing worker's transaction: the time first (it takes the head, so what is read
-- next holds until commit), then for each act the row it will make, its attestation
-- (0007_worker_keys.sql), and the act itself through the functions above.

-- name: signer_context
SELECT now_ms, ledger_id FROM cassette_signer_context();

-- name: attest
SELECT cassette_attest(%(act)s, %(run_id)s, %(message_id)s, %(step_id)s, %(fencing_token)s,
                       %(worker_id)s, %(key_id)s, %(signature)s);

-- name: next_message_id
SELECT coalesce(max(message_id), 0) + 1 FROM cassette_messages;

-- name: message_by_key
SELECT message_id FROM cassette_messages
 WHERE run_id = %(run_id)s AND idempotency_key = %(idempotency_key)s;

-- Before a signed post, claim or requeue takes the head: is there anything to do (schema/30_steps.sql)?
-- Each a statement of its own, so its snapshot holds every commit made before it.

-- name: posted_under_key
SELECT message_id, job_id, same
  FROM cassette_posted_under_key(%(run_id)s, %(idempotency_key)s, %(source)s, %(payload_json)s);

-- name: run_has_pending
SELECT cassette_run_has_pending(%(run_id)s);

-- name: run_has_lease_due
SELECT cassette_run_has_lease_due(%(run_id)s);

-- name: next_pending
SELECT step_id, fencing_token + 1 FROM cassette_steps
 WHERE run_id = %(run_id)s AND status = 'PENDING'
 ORDER BY message_id, job_ordinal, ordinal LIMIT 1;

-- name: expired_leases_of_run
SELECT step_id, fencing_token FROM cassette_steps
 WHERE run_id = %(run_id)s AND status = 'LEASED' AND lease_expires_at <= %(now)s
   AND (%(step_id)s::bigint IS NULL OR step_id = %(step_id)s)
 ORDER BY step_id;

-- name: steps_by_status
-- Each count through an index (schema/30_steps.sql: none holds every step by run and status):
-- PENDING and LEASED through their partial indexes, COMMITTED as the run's receipts (a
-- step is COMMITTED exactly when its receipt exists, and a receipt's run is its step's).
SELECT 'PENDING', count(*) FROM cassette_steps WHERE run_id = %(run_id)s AND status = 'PENDING'
UNION ALL
SELECT 'LEASED', count(*) FROM cassette_steps WHERE run_id = %(run_id)s AND status = 'LEASED'
UNION ALL
SELECT 'COMMITTED', count(*) FROM cassette_receipts WHERE run_id = %(run_id)s;

-- name: receipts_by_outcome
SELECT outcome, count(*) FROM cassette_receipts WHERE run_id = %(run_id)s GROUP BY outcome;

-- name: expired_leases
SELECT count(*) FROM cassette_steps, cassette_head
 WHERE run_id = %(run_id)s AND status = 'LEASED'
   AND lease_expires_at <= greatest(time_ms, (floor(extract(epoch FROM clock_timestamp()) * 1000))::bigint + clock_offset_ms);

-- name: messages_of_run
SELECT count(*) FROM cassette_messages WHERE run_id = %(run_id)s;

-- name: step
SELECT step_id, job_id, run_id, message_id, ordinal, status, lease_owner, lease_expires_at,
       fencing_token, payload_json
  FROM cassette_steps WHERE step_id = %(step_id)s;

-- name: server_now
SELECT greatest(time_ms, (floor(extract(epoch FROM clock_timestamp()) * 1000))::bigint + clock_offset_ms)
  FROM cassette_head;

-- name: can_seal
SELECT has_table_privilege('cassette_seals', 'INSERT');

-- name: latest_seal
SELECT seal_id, tree_size, root_hex, origin, key_id, note, created_at
  FROM cassette_seals ORDER BY seal_id DESC LIMIT 1;

-- name: read_only_snapshot
-- The first statement of a transaction of several reads (connection.snapshot, a seal's
-- tree, a copy's source): one snapshot for all of them, which writes nothing.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY;

-- ------------------------------------------------- the journal, seals and proofs
-- What anchors.py reads and writes: the tree is rebuilt from the journal's rows.

-- name: ledger_id
SELECT value FROM cassette_meta WHERE key = 'ledger_id';

-- name: journal_size
-- Counted in the journal, whose last entry is its end (the head keeps no count: schema/10_ledger.sql).
SELECT cassette_journal_size();

-- name: journal_before
SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal WHERE seq < %(size)s ORDER BY seq;

-- name: journal_from
SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal WHERE seq >= %(start)s ORDER BY seq;

-- name: journal_after
-- A follower's poll (follow.JournalReader): one autocommit statement, no snapshot held.
SELECT seq, body, chain_hash FROM cassette_journal WHERE seq > %(since_seq)s
 ORDER BY seq LIMIT %(limit)s;

-- name: entry_body
SELECT body FROM cassette_journal WHERE seq = %(seq)s;

-- name: receipt_seq
SELECT min(seq) FROM cassette_journal
 WHERE tbl = 'cassette_receipts' AND row_key = %(receipt_id)s;

-- name: insert_seal
-- The owner's (INSERT on cassette_seals); cassette_seals_insert() checks the root again.
INSERT INTO cassette_seals (tree_size, root_hex, origin, key_id, note)
VALUES (%(tree_size)s, %(root_hex)s, %(origin)s, %(key_id)s, %(note)s)
RETURNING seal_id, created_at;

-- ------------------------------------------------------------------- copying
-- copying.py: a source read in one snapshot (read_only_snapshot, journal_from); a
-- destination written by its owner, each write dated by the copy.

-- name: journal_tables
SELECT DISTINCT tbl FROM cassette_journal;

-- name: journaled_tables
-- The tables the destination's own triggers journal. (Sent without parameters, so
-- psycopg reads no placeholder here: each percent sign is LIKE's.)
SELECT DISTINCT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE NOT t.tgisinternal AND t.tgname LIKE '%journal' AND c.relname LIKE 'cassette%';

-- name: table_columns
SELECT attname FROM pg_attribute
 WHERE attrelid = %(table)s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum;

-- name: adopt_ledger_id
-- An empty ledger takes its identity from its first entry's source (the meta guard's rule, schema/10_ledger.sql).
UPDATE cassette_meta SET value = %(ledger_id)s WHERE key = 'ledger_id';

-- name: chain_hash_at
SELECT chain_hash FROM cassette_journal WHERE seq = %(seq)s;

-- name: head_time
SELECT time_ms FROM cassette_head;

-- name: lease_expiry
SELECT lease_expires_at FROM cassette_steps WHERE step_id = %(step_id)s;

-- name: date_transaction
-- The owner's say over the head: the copy dates this transaction (cassette_tx_ms() keeps
-- a time its own transaction set; time_ms only moves forward).
UPDATE cassette_head SET time_ms = %(at_ms)s, tx = pg_current_xact_id();

-- name: copy_insert
-- ({table}, {columns} and {values} are composed by copying.py with psycopg.sql from the
-- destination's own catalog (journaled_tables, table_columns), never from a body.)
INSERT INTO {table} ({columns}) VALUES ({values});

-- name: copy_step_update
UPDATE cassette_steps
   SET status = %(status)s, lease_owner = %(lease_owner)s,
       lease_expires_at = %(lease_expires_at)s, fencing_token = %(fencing_token)s
 WHERE step_id = %(step_id)s;

-- ------------------------------------------------------------ the causal chain
-- Actions are read with the columns of actions.COLUMNS, in that order.

-- name: append_action
SELECT action_seq, action_time
  FROM cassette_append_action(%(action_id)s, %(parent_action_id)s, %(plan_id)s, %(intent_id)s,
                              %(session_id)s, %(action_type)s, %(function_name)s,
                              %(arguments_json)s, %(arguments_artifact)s, %(result_json)s,
                              %(result_artifact)s, %(success)s, %(error_message)s,
                              %(cost_micros)s, %(duration_ms)s, %(metadata_json)s,
                              %(caused_by)s, %(rationale)s, %(category)s);

-- name: save_checkpoint
SELECT cassette_save_checkpoint(%(checkpoint_id)s, %(plan_id)s, %(context_json)s);

-- name: action_by_id
SELECT action_seq, action_id, parent_action_id, plan_id, intent_id, session_id, action_type,
       function_name, arguments_json, arguments_artifact, result_json, result_artifact, success,
       error_message, cost_micros, duration_ms, "timestamp", metadata_json, caused_by, rationale,
       category
  FROM cassette_actions WHERE action_id = %(action_id)s;

-- name: action_exists
SELECT 1 FROM cassette_actions WHERE action_id = %(action_id)s;

-- name: actions_of_plan
SELECT action_seq, action_id, parent_action_id, plan_id, intent_id, session_id, action_type,
       function_name, arguments_json, arguments_artifact, result_json, result_artifact, success,
       error_message, cost_micros, duration_ms, "timestamp", metadata_json, caused_by, rationale,
       category
  FROM cassette_actions WHERE plan_id = %(value)s ORDER BY action_seq;

-- name: actions_of_intent
SELECT action_seq, action_id, parent_action_id, plan_id, intent_id, session_id, action_type,
       function_name, arguments_json, arguments_artifact, result_json, result_artifact, success,
       error_message, cost_micros, duration_ms, "timestamp", metadata_json, caused_by, rationale,
       category
  FROM cassette_actions WHERE intent_id = %(value)s ORDER BY action_seq;

-- name: actions_of_session
SELECT action_seq, action_id, parent_action_id, plan_id, intent_id, session_id, action_type,
       function_name, arguments_json, arguments_artifact, result_json, result_artifact, success,
       error_message, cost_micros, duration_ms, "timestamp", metadata_json, caused_by, rationale,
       category
  FROM cassette_actions WHERE session_id = %(value)s ORDER BY action_seq;

-- name: children
SELECT action_seq, action_id, parent_action_id, plan_id, intent_id, session_id, action_type,
       function_name, arguments_json, arguments_artifact, result_json, result_artifact, success,
       error_message, cost_micros, duration_ms, "timestamp", metadata_json, caused_by, rationale,
       category
  FROM cassette_actions WHERE parent_action_id = %(value)s ORDER BY action_seq;

-- name: subtree
WITH RECURSIVE tree(action_id) AS (
    SELECT action_id FROM cassette_actions WHERE action_id = %(action_id)s
    UNION ALL
    SELECT a.action_id FROM cassette_actions a JOIN tree t ON a.parent_action_id = t.action_id
)
SELECT action_seq, action_id, parent_action_id, plan_id, intent_id, session_id, action_type,
       function_name, arguments_json, arguments_artifact, result_json, result_artifact, success,
       error_message, cost_micros, duration_ms, "timestamp", metadata_json, caused_by, rationale,
       category
  FROM cassette_actions WHERE action_id IN (SELECT action_id FROM tree) ORDER BY action_seq;

-- name: find_actions
SELECT action_seq, action_id, parent_action_id, plan_id, intent_id, session_id, action_type,
       function_name, arguments_json, arguments_artifact, result_json, result_artifact, success,
       error_message, cost_micros, duration_ms, "timestamp", metadata_json, caused_by, rationale,
       category
  FROM cassette_actions
 WHERE (%(plan_id)s::text IS NULL OR plan_id = %(plan_id)s)
   AND (%(intent_id)s::text IS NULL OR intent_id = %(intent_id)s)
   AND (%(session_id)s::text IS NULL OR session_id = %(session_id)s)
   AND (%(action_type)s::text IS NULL OR action_type = %(action_type)s)
   AND (%(function_name)s::text IS NULL OR function_name = %(function_name)s)
   AND (%(since_seq)s::bigint IS NULL OR action_seq > %(since_seq)s)
   AND (%(after)s::bigint IS NULL OR "timestamp" >= %(after)s)
   AND (%(before)s::bigint IS NULL OR "timestamp" < %(before)s)
 ORDER BY action_seq
 LIMIT %(limit)s OFFSET %(offset)s;

-- name: find_actions_newest_first
SELECT action_seq, action_id, parent_action_id, plan_id, intent_id, session_id, action_type,
       function_name, arguments_json, arguments_artifact, result_json, result_artifact, success,
       error_message, cost_micros, duration_ms, "timestamp", metadata_json, caused_by, rationale,
       category
  FROM cassette_actions
 WHERE (%(plan_id)s::text IS NULL OR plan_id = %(plan_id)s)
   AND (%(intent_id)s::text IS NULL OR intent_id = %(intent_id)s)
   AND (%(session_id)s::text IS NULL OR session_id = %(session_id)s)
   AND (%(action_type)s::text IS NULL OR action_type = %(action_type)s)
   AND (%(function_name)s::text IS NULL OR function_name = %(function_name)s)
   AND (%(since_seq)s::bigint IS NULL OR action_seq > %(since_seq)s)
   AND (%(after)s::bigint IS NULL OR "timestamp" >= %(after)s)
   AND (%(before)s::bigint IS NULL OR "timestamp" < %(before)s)
 ORDER BY action_seq DESC
 LIMIT %(limit)s OFFSET %(offset)s;

-- name: plan_state
SELECT action_type FROM cassette_actions
 WHERE plan_id = %(plan_id)s
   AND action_type IN ('PlanStarted', 'PlanPaused', 'PlanResumed', 'PlanCompleted', 'PlanAborted')
 ORDER BY action_seq DESC LIMIT 1;

-- name: plan_started
SELECT action_id, metadata_json FROM cassette_actions
 WHERE plan_id = %(plan_id)s AND action_type = 'PlanStarted' ORDER BY action_seq LIMIT 1;

-- name: plan_intent
SELECT intent_id FROM cassette_actions WHERE plan_id = %(plan_id)s ORDER BY action_seq LIMIT 1;

-- name: plan_steps
SELECT s.action_id, s.function_name, s.metadata_json,
       (SELECT count(*) FROM cassette_actions c
         WHERE c.parent_action_id = s.action_id AND c.action_type = 'PlanStepRetrying'),
       (SELECT c.action_type FROM cassette_actions c
         WHERE c.parent_action_id = s.action_id
           AND c.action_type IN ('PlanStepCompleted', 'PlanStepFailed')
         ORDER BY c.action_seq LIMIT 1)
  FROM cassette_actions s
 WHERE s.plan_id = %(plan_id)s AND s.action_type = 'PlanStepStarted'
 ORDER BY s.action_seq;

-- name: plan_totals
SELECT count(*), coalesce(sum(cost_micros), 0)::bigint, coalesce(sum(duration_ms), 0)::bigint
  FROM cassette_actions WHERE plan_id = %(plan_id)s;

-- name: plan_pauses
SELECT metadata_json FROM cassette_actions
 WHERE plan_id = %(plan_id)s AND action_type = 'PlanPaused' ORDER BY action_seq DESC;

-- name: plan_newest_checkpoint
SELECT checkpoint_id FROM cassette_checkpoints
 WHERE plan_id = %(plan_id)s ORDER BY checkpoint_seq DESC LIMIT 1;

-- name: checkpoint
SELECT checkpoint_id, plan_id, context_json, created_at
  FROM cassette_checkpoints WHERE checkpoint_id = %(checkpoint_id)s;

-- name: metrics
-- ({column} and {where} come from metrics.DIMENSIONS, never from a caller.) As SQLite's:
-- nearest-rank percentiles, a null duration ranked first; groups in byte order of their
-- key, the null group first.
SELECT k, count(*), sum(CASE WHEN success = 0 THEN 1 ELSE 0 END), sum(duration_ms),
       sum(cost_micros),
       max(CASE WHEN r = (n * 50 + 99) / 100 THEN duration_ms END),
       max(CASE WHEN r = (n * 95 + 99) / 100 THEN duration_ms END)
  FROM (SELECT {column} AS k, success, duration_ms, cost_micros,
               row_number() OVER (PARTITION BY {column} ORDER BY duration_ms NULLS FIRST) AS r,
               count(*) OVER (PARTITION BY {column}) AS n
          FROM cassette_actions WHERE {where}) ranked
 GROUP BY k ORDER BY k IS NOT NULL, k COLLATE "C";

-- ------------------------------------------------------------------ reasoning
-- The reads of reasoning.py and dependencies.py, under the names of their SQLite
-- statements (reasoning.SQLITE_READS, dependencies.SQLITE_READS); the logic is theirs.

-- name: reasoning_action
SELECT action_id, caused_by, category, rationale, action_type, function_name, success,
       parent_action_id, "timestamp"
  FROM cassette_actions WHERE action_id = %(id)s;

-- name: reasoning_summary_of
SELECT action_type, function_name, rationale, success
  FROM cassette_actions WHERE action_id = %(id)s;

-- name: reasoning_up
-- From the action up its caused_by links; hops counts from the action (0) upwards.
WITH RECURSIVE up(action_id, caused_by, hops) AS (
    SELECT action_id, caused_by, 0 FROM cassette_actions WHERE action_id = %(id)s
    UNION ALL
    SELECT a.action_id, a.caused_by, up.hops + 1
      FROM up JOIN cassette_actions a ON a.action_id = up.caused_by
     WHERE %(limit)s::bigint < 0 OR up.hops < %(limit)s::bigint
)
SELECT up.hops, a.action_id, a.caused_by, a.category, a."timestamp", a.function_name,
       a.action_type, a.rationale, a.success
  FROM up JOIN cassette_actions a ON a.action_id = up.action_id
 ORDER BY up.hops DESC;

-- name: reasoning_down
WITH RECURSIVE down(action_id) AS (
    SELECT action_id FROM cassette_actions WHERE caused_by = %(id)s
    UNION
    SELECT a.action_id FROM down JOIN cassette_actions a ON a.caused_by = down.action_id
)
SELECT a.action_id FROM cassette_actions a
 WHERE a.action_id IN (SELECT action_id FROM down) ORDER BY a.action_seq;

-- name: causality_totals
-- As SQLite's sums of booleans: a count per condition (reasoning.stats_of reads 0 and
-- SQLite's NULL sum of no rows alike).
SELECT count(*),
       count(*) FILTER (WHERE caused_by IS NOT NULL OR rationale IS NOT NULL
                              OR category IS NOT NULL),
       count(*) FILTER (WHERE caused_by IS NOT NULL),
       count(*) FILTER (WHERE caused_by IS NOT NULL AND rationale IS NULL),
       count(*) FILTER (WHERE caused_by IS NULL AND EXISTS (
           SELECT 1 FROM cassette_actions e WHERE e.caused_by = a.action_id)),
       count(*) FILTER (WHERE caused_by IS NULL AND (caused_by IS NOT NULL
                              OR rationale IS NOT NULL OR category IS NOT NULL))
  FROM cassette_actions a
 WHERE (%(plan)s::text IS NULL OR a.plan_id = %(plan)s)
   AND (%(session)s::text IS NULL OR a.session_id = %(session)s);

-- name: causality_categories
SELECT category, count(*) FROM cassette_actions a
 WHERE (%(plan)s::text IS NULL OR a.plan_id = %(plan)s)
   AND (%(session)s::text IS NULL OR a.session_id = %(session)s)
   AND category IS NOT NULL
 GROUP BY category;

-- name: causality_lengths
-- Top-down from every root cause. SQLite's avg is a double (sum / count); sum and max
-- stay integers.
WITH RECURSIVE depth(action_id, length) AS (
    SELECT r.action_id, 0 FROM cassette_actions r
     WHERE r.caused_by IS NULL
       AND EXISTS (SELECT 1 FROM cassette_actions e WHERE e.caused_by = r.action_id)
    UNION ALL
    SELECT c.action_id, depth.length + 1
      FROM depth JOIN cassette_actions c ON c.caused_by = depth.action_id
)
SELECT sum(depth.length)::float8 / count(*), max(depth.length), sum(depth.length)::bigint
  FROM depth JOIN cassette_actions a ON a.action_id = depth.action_id
 WHERE depth.length > 0
   AND (%(plan)s::text IS NULL OR a.plan_id = %(plan)s)
   AND (%(session)s::text IS NULL OR a.session_id = %(session)s);

-- name: dependencies_cap
SELECT coalesce(max(action_seq), 0) FROM cassette_actions;

-- name: dependencies_up
WITH RECURSIVE up(action_id, hops) AS (
    SELECT %(id)s::text, 0
    UNION ALL
    SELECT a.caused_by, up.hops + 1
      FROM up JOIN cassette_actions a ON a.action_id = up.action_id
     WHERE a.caused_by IS NOT NULL AND up.hops < %(cap)s::bigint
)
SELECT up.hops, up.action_id, a.caused_by, a."timestamp"
  FROM up LEFT JOIN cassette_actions a ON a.action_id = up.action_id
 ORDER BY up.hops;

-- name: candidates
-- ({column} comes from dependencies.SCOPES, never from a caller.)
SELECT action_id, action_type, function_name, rationale, success, "timestamp"
  FROM cassette_actions
 WHERE {column} = %(value)s AND action_seq < %(before_seq)s
   AND "timestamp" BETWEEN %(since)s AND %(at)s
 ORDER BY action_seq DESC LIMIT %(limit)s;

-- name: scope_row
-- ({column} comes from dependencies.SCOPES, never from a caller.)
SELECT {column}, "timestamp", action_seq FROM cassette_actions WHERE action_id = %(id)s;

-- name: actions_for_link
-- ({link} comes from actions.REASONING_LINKS, never from a caller.) As SQLite's
-- json_extract = ?: a JSON string equal to the value; a number, boolean or null never
-- equals a text value there. (SQLite would also match an object or array by its minified
-- text; PostgreSQL does not print JSON minified, so such a link is not matched here.)
SELECT action_seq, action_id, parent_action_id, plan_id, intent_id, session_id, action_type,
       function_name, arguments_json, arguments_artifact, result_json, result_artifact, success,
       error_message, cost_micros, duration_ms, "timestamp", metadata_json, caused_by, rationale,
       category
  FROM cassette_actions
 WHERE json_typeof(metadata_json::json -> '{link}') = 'string'
   AND metadata_json::json ->> '{link}' = %(value)s
 ORDER BY action_seq;

-- ------------------------------------------------- the chain's extras

-- name: append_time
-- Takes the head (the transaction's time is fixed from here on) and returns that time:
-- what a signature and suggested causes need before the row is sent.
SELECT cassette_append_time();

-- name: journal_bodies
SELECT body FROM cassette_journal ORDER BY seq;

-- name: session_actions
SELECT action_seq, action_id, parent_action_id, plan_id, intent_id, session_id, action_type,
       function_name, arguments_json, arguments_artifact, result_json, result_artifact, success,
       error_message, cost_micros, duration_ms, "timestamp", metadata_json, caused_by, rationale,
       category
  FROM cassette_actions WHERE session_id = %(session_id)s ORDER BY action_seq;

-- name: session_entries
SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal
 WHERE tbl = 'cassette_actions' AND row_key = %(action_id)s ORDER BY seq;

-- name: session_cause_time
SELECT "timestamp" FROM cassette_actions WHERE action_id = %(action_id)s;

-- name: seal_notes
-- (the seals covering an entry (every seal for -1), newest first: export and prove take
-- the first, or the newest whose signature verifies under a pinned key)
SELECT note FROM cassette_seals WHERE tree_size > %(seq)s ORDER BY seal_id DESC;

-- name: bundle_entries
-- ({column} comes from bundle.SCOPES, never from a caller.)
SELECT j.seq, j.body FROM cassette_actions a
  JOIN cassette_journal j ON j.tbl = 'cassette_actions' AND j.row_key = a.action_id
 WHERE a.{column} = %(value)s ORDER BY j.seq;

-- ------------------------------------------------------------- committing early
-- name: commit_without_flush
-- Durability full (connection.commit_early): a write's transaction commits without
-- waiting for its WAL flush, so the chain's head is free as soon as the commit record is
-- in the WAL buffer; the call then waits for the flush (flush_commits) before it returns.
-- Only the code that flushes ever turns synchronous commit off.
SET LOCAL synchronous_commit = off;

-- name: statement_without_flush
-- The same for a write that is one statement, in that statement (its own transaction: no
-- BEGIN and COMMIT round trips). The statement spliced in is one of the named write
-- queries above (a SELECT), never a caller's text; the setting is made once per row it returns, and read only at the commit. A
-- write that returns no row commits synchronously: slower, never less durable.
SELECT set_config('synchronous_commit', 'off', true), written.*
  FROM ({statement}) AS written;

-- name: flush_commits
-- A synchronous commit of a transaction that wrote WAL flushes the WAL up to its own
-- commit record, so past every commit before it, this session's early one included; a
-- transaction that writes nothing flushes nothing, hence the (transactional: it commits
-- with an XID) logical message, one small WAL record that no table holds. Nothing is
-- written when the WAL is already flushed as far as it was inserted. Concurrent flushes
-- share one fsync.
-- With a synchronous standby named, the message is always written: a synchronous commit
-- then also waits for the standby to have everything before it, as the write's own
-- synchronous commit would have (the local flush alone does not say the standby has it).
SELECT set_config('synchronous_commit', 'on', true),
       CASE WHEN pg_current_wal_flush_lsn() < pg_current_wal_insert_lsn()
                 OR current_setting('synchronous_standby_names') <> ''
            THEN pg_logical_emit_message(true, 'catalytic-cassette', '') END;

-- name: can_flush
-- pg_logical_emit_message is PUBLIC's unless a DBA revoked it: a session that cannot
-- flush commits every write synchronously, under the head. So does one on a server with
-- a synchronous standby named: a commit is then visible to other sessions only once the
-- standby has it, which an early commit would give up (readers wait for the local flush
-- alone, connection.wait_durable).
SELECT has_function_privilege('pg_catalog.pg_logical_emit_message(boolean, text, text)',
                              'EXECUTE')
       AND current_setting('synchronous_standby_names') = '';

-- name: flush_needed
-- Whether an evidence read must see to the flush of what its snapshot sees: NULL when not
-- (flushed as far as inserted, read after the snapshot was taken, so past every commit it
-- sees; or a standby), else that position; and whether this role may write the message
-- that makes its own commit flush (a function it may not execute fails the statement that
-- names it even unevaluated, so the message is a statement of its own: flush_message).
SELECT CASE WHEN pg_is_in_recovery()
                 OR pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn() THEN NULL
            ELSE pg_current_wal_insert_lsn()::text END,
       has_function_privilege('pg_catalog.pg_logical_emit_message(boolean, text, text)',
                              'EXECUTE');

-- name: flush_message
-- In an evidence read's transaction (READ ONLY may write it): an XID and a synchronous
-- commit, which flushes the WAL past everything before it.
SELECT set_config('synchronous_commit', 'on', true),
       pg_logical_emit_message(true, 'catalytic-cassette', '');

-- name: wal_inserted
-- How far the WAL is inserted now: read after a snapshot was taken, it is past the
-- commit record of every transaction the snapshot sees. NULL on a standby, which shows
-- only WAL it has already flushed (and has no insert position).
SELECT CASE WHEN NOT pg_is_in_recovery() THEN pg_current_wal_insert_lsn()::text END;

-- name: wal_flushed_past
-- The insert position names where the next record's bytes would go: at a page's start that
-- is past the page's header (24 bytes, 40 on a segment's first page), which no flush
-- reaches until another record is written there (an idle server after a WAL switch, or a
-- record that ended at a page's end). So a position at a page's header asks for the flush
-- to reach the page's start, where everything inserted before it ends.
SELECT pg_current_wal_flush_lsn() >= w.lsn - CASE
           WHEN w.in_segment = 40 OR (w.in_segment > w.page AND mod(w.in_segment, w.page) = 24)
           THEN mod(w.in_segment, w.page) ELSE 0 END
  FROM (SELECT %(lsn)s::pg_lsn AS lsn,
               current_setting('wal_block_size')::numeric AS page,
               mod(%(lsn)s::pg_lsn - '0/0', pg_size_bytes(current_setting('wal_segment_size')))
                   AS in_segment) AS w;
