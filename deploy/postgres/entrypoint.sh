#!/bin/sh
# First start: initdb with POSTGRES_USER as the superuser (password POSTGRES_PASSWORD, password
# authentication from the network) and create POSTGRES_DB. Every start: exec postgres on all interfaces.
set -eu
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}" > "$pwfile"
    "$bin/initdb" -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    if [ "$db" != postgres ]; then
        echo "CREATE DATABASE \"$db\" OWNER \"$user\";" | "$bin/postgres" --single -D "$PGDATA" -j postgres >/dev/null
    fi
fi
exec "$bin/postgres" -D "$PGDATA" -c listen_addresses='*'
