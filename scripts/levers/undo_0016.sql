-- Takes back migration 0016's pinned search_path (every function it set goes back to the
-- firing session's path), on a ledger migrated to 0016: scripts/bench_pg_levers.py ab
-- measures what the setting costs per step against its absence in one run. Never run
-- on a ledger: it reopens the temporary-table attacks of tests/test_postgres_attacks_0015.py.
ALTER FUNCTION cassette_journal_guard() RESET search_path;
ALTER FUNCTION cassette_journal_append(text, text, text, text, text) RESET search_path;
ALTER FUNCTION cassette_head_guard() RESET search_path;
ALTER FUNCTION cassette_tx_ms() RESET search_path;
ALTER FUNCTION cassette_advance_clock(bigint) RESET search_path;
ALTER FUNCTION cassette_journal_size() RESET search_path;
ALTER FUNCTION cassette_meta_guard() RESET search_path;
ALTER FUNCTION cassette_seals_insert() RESET search_path;
ALTER FUNCTION cassette_tree_root(bigint) RESET search_path;
ALTER FUNCTION cassette_next_id(bigint, bigint) RESET search_path;
ALTER FUNCTION cassette_messages_insert() RESET search_path;
ALTER FUNCTION cassette_messages_journal() RESET search_path;
ALTER FUNCTION cassette_jobs_insert() RESET search_path;
ALTER FUNCTION cassette_jobs_journal() RESET search_path;
ALTER FUNCTION cassette_steps_insert() RESET search_path;
ALTER FUNCTION cassette_steps_update() RESET search_path;
ALTER FUNCTION cassette_steps_update_signature() RESET search_path;
ALTER FUNCTION cassette_steps_journal() RESET search_path;
ALTER FUNCTION cassette_receipts_insert() RESET search_path;
ALTER FUNCTION cassette_receipts_signature() RESET search_path;
ALTER FUNCTION cassette_receipts_commit_step() RESET search_path;
ALTER FUNCTION cassette_receipts_journal() RESET search_path;
ALTER FUNCTION cassette_releases_insert() RESET search_path;
ALTER FUNCTION cassette_releases_signature() RESET search_path;
ALTER FUNCTION cassette_releases_requeue_step() RESET search_path;
ALTER FUNCTION cassette_releases_journal() RESET search_path;
ALTER FUNCTION cassette_seals_journal() RESET search_path;
ALTER FUNCTION cassette_actions_insert() RESET search_path;
ALTER FUNCTION cassette_actions_lifecycle(cassette_actions, json) RESET search_path;
ALTER FUNCTION cassette_actions_journal() RESET search_path;
ALTER FUNCTION cassette_checkpoints_insert() RESET search_path;
ALTER FUNCTION cassette_checkpoints_journal() RESET search_path;
ALTER FUNCTION cassette_attestations_insert() RESET search_path;
ALTER FUNCTION cassette_attestations_journal() RESET search_path;
