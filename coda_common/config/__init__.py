"""coda.conf's keys and where coda's files live."""
