-- tfpool database roles: `tfpool_migrate` owns the schema and is the only role that can change it
-- (`tfctl migrate` connects as it); `tfpool_app` is what every service connects as: it reads and
-- writes rows, and cannot create, alter or drop anything.
-- Run as a superuser, connected to the tfpool database, after setting the two passwords:
--   SELECT set_config('tfpool.migrate_password', '...', false);
--   SELECT set_config('tfpool.app_password', '...', false);
-- Idempotent: running it again only resets the passwords and the grants.

DO $roles$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'tfpool_migrate') THEN
    CREATE ROLE tfpool_migrate LOGIN;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'tfpool_app') THEN
    CREATE ROLE tfpool_app LOGIN;
  END IF;
  EXECUTE format('ALTER ROLE tfpool_migrate LOGIN PASSWORD %L', current_setting('tfpool.migrate_password'));
  EXECUTE format('ALTER ROLE tfpool_app LOGIN PASSWORD %L', current_setting('tfpool.app_password'));
  EXECUTE format('ALTER DATABASE %I OWNER TO tfpool_migrate', current_database());
  EXECUTE format('REVOKE CREATE, TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO tfpool_app', current_database());
END
$roles$;

ALTER SCHEMA public OWNER TO tfpool_migrate;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO tfpool_app;

GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO tfpool_app;
GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO tfpool_app;
ALTER DEFAULT PRIVILEGES FOR ROLE tfpool_migrate IN SCHEMA public
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO tfpool_app;
ALTER DEFAULT PRIVILEGES FOR ROLE tfpool_migrate IN SCHEMA public
  GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO tfpool_app;
