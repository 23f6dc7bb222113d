#!/bin/sh
# Submits the import of file $1 and prints its task's id. psql connects as
# libpq's PG* variables say; $1 reaches the SQL as a quoted literal.
set -eu
psql -XAt -v ON_ERROR_STOP=1 -v file="$1" <<'SQL'
SELECT data_manager.submit('import_file', jsonb_build_object('file', :'file'),
                           idempotency_key => 'import-' || :'file');
SQL
