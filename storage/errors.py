"""Errors of the store. Each message names the store, table, file or columns that are wrong."""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every store error."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """The path is not a store (missing, a file, or a folder without _store.json)."""


class MissingTableError(StoreError, LookupError):
    """A table that has never been written (or whose Delta log is gone)."""


class SchemaMismatchError(StoreError, ValueError):
    """Rows do not fit the table schema: unknown, missing or mistyped columns."""


class NewerSchemaError(StoreError):
    """The store or a table was written by a newer schema version than this code reads."""


class CorruptFileError(StoreError):
    """A data file of a table is truncated, missing or unreadable."""


class RetryableStoreError(StoreError):
    """A commit kept conflicting with concurrent writers; retrying the same append is safe."""
