-- The appender learns its transaction's time before it writes (issue 15: the causal
-- chain's extras on PostgreSQL).
--   * A signed action signs the row as stored, its timestamp included, and suggested
--     causes are read at the time of the action they are suggested for: both need the
--     time the server will give the row before the row is sent. cassette_tx_ms() fixes
--     that time at the transaction's first call and returns the same time at every
--     later one, and takes the head's lock, so nothing commits between the read of the
--     suggestions and the insert. The appender may call only its SECURITY DEFINER
--     functions: this one takes the head and returns the time, and writes nothing else.
--   * Nothing new is trusted: the row's timestamp is still set by the insert trigger
--     (cassette_tx_ms() again), so a client that signs another time only makes a
--     signature that verify reports as bad_signature.

CREATE FUNCTION cassette_append_time() RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    RETURN cassette_tx_ms();
END $$;

ALTER FUNCTION cassette_append_time()
    SET standard_conforming_strings = on SET extra_float_digits = 1 SET bytea_output = 'hex';
REVOKE EXECUTE ON FUNCTION cassette_append_time() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cassette_append_time() TO cassette_appender;
