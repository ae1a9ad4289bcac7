-- reactor.outranks_v1 found analysis_jobs through the caller's search_path, so a session whose
-- search_path named another schema first (or a temporary table of the same name, which
-- pg_temp would find before anything else) could have the precedence rule read the wrong
-- table. Pin it: the system catalog, the schema that holds analysis_jobs now, and pg_temp last.
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION reactor.outranks_v1(uuid, uuid, text) '
        'SET search_path = pg_catalog, %I, pg_temp',
        (SELECT n.nspname
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE c.oid = 'analysis_jobs'::regclass));
END
$$;
