-- 0014's journal guard, before 0015: it ran only for entries inserted at trigger depth 0
-- (unsound: tests/test_postgres_attacks_0014.py). Measures what 0015 costs.
DROP TRIGGER cassette_journal_guard ON cassette_journal;
CREATE TRIGGER cassette_journal_guard BEFORE INSERT ON cassette_journal
    FOR EACH ROW WHEN (pg_trigger_depth() = 0) EXECUTE FUNCTION cassette_journal_guard();
