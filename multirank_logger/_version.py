"""The package version: a module of its own, so that any module can import it without a cycle."""

__version__ = "0.1.0"

#: the schema revision this version of the code reads and writes (migrations/versions/: their head;
#: tests/store/test_migrations.py checks they agree), here so that a store's file can be checked without Alembic or SQLAlchemy
SCHEMA_HEAD = "0016"
