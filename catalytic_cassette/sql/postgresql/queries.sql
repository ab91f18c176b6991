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

-- name: release
SELECT cassette_release(%(run_id)s, %(step_id)s, %(worker_id)s, %(fencing_token)s);

-- name: requeue
SELECT step_id, action, fencing_token
  FROM cassette_requeue(%(run_id)s, %(step_id)s, %(max_attempts)s);

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

-- name: journal_from
SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal WHERE seq >= %(start)s ORDER BY seq;

-- name: advance_clock
SELECT cassette_advance_clock(%(ms)s);
