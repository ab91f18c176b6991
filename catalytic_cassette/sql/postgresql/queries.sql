-- Every statement the package sends to a PostgreSQL ledger, by name (queries.py loads
-- them). Parameters are psycopg's %(name)s. The rules are the server's: these only call
-- the worker's functions (0002_roles.sql) or read.

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

-- Before a signed post, claim or requeue takes the head: is there anything to do (0013)?
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
SELECT status, count(*) FROM cassette_steps WHERE run_id = %(run_id)s GROUP BY status;

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

-- name: journal_from
SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal WHERE seq >= %(start)s ORDER BY seq;

-- name: advance_clock
SELECT cassette_advance_clock(%(ms)s);

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

-- name: checkpoint_context
SELECT context_json FROM cassette_checkpoints WHERE checkpoint_id = %(checkpoint_id)s;

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

-- ------------------------------------------------- the chain's extras (0008)

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

-- name: session_chain_hash
SELECT chain_hash FROM cassette_journal WHERE seq = %(seq)s;

-- name: session_cause_time
SELECT "timestamp" FROM cassette_actions WHERE action_id = %(action_id)s;

-- name: newest_seal
SELECT note FROM cassette_seals ORDER BY seal_id DESC LIMIT 1;

-- name: bundle_entries
-- ({column} comes from bundle.SCOPES, never from a caller.)
SELECT j.seq, j.body FROM cassette_actions a
  JOIN cassette_journal j ON j.tbl = 'cassette_actions' AND j.row_key = a.action_id
 WHERE a.{column} = %(value)s ORDER BY j.seq;
