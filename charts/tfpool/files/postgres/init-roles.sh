#!/bin/sh
# Postgres image init hook (docker-entrypoint-initdb.d): creates the tfpool roles in $POSTGRES_DB
# with the passwords from TFPOOL_MIGRATE_PASSWORD and TFPOOL_APP_PASSWORD (see roles.sql).
set -eu
: "${TFPOOL_MIGRATE_PASSWORD:?set TFPOOL_MIGRATE_PASSWORD for the schema-owning role}"
: "${TFPOOL_APP_PASSWORD:?set TFPOOL_APP_PASSWORD for the services role}"
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v migrate_password="$TFPOOL_MIGRATE_PASSWORD" -v app_password="$TFPOOL_APP_PASSWORD" <<'SQL'
SELECT set_config('tfpool.migrate_password', :'migrate_password', false);
SELECT set_config('tfpool.app_password', :'app_password', false);
\i /opt/tfpool/roles.sql
SQL
