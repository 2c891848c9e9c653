"""Plain helpers the tests share, by job: `stores` (store files and PostgreSQL databases),
`launches` (free ports, ranks started in processes), `processes` (stopping one). Fixtures and
pytest hooks stay in tests/conftest.py, which imports from here; a test imports from here,
never from conftest.py."""
