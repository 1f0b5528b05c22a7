from tests.postgres_server import pg_dsn, postgres_server  # noqa: F401  (fixtures)
