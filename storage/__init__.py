"""The trajectory store: Arrow schemas, Delta Lake tables of Parquet files, Polars queries,
TRL exports and dedup. Imports nothing from dataengine/ (ARCHITECTURE.md)."""

from storage.errors import (
    CorruptFileError,
    MissingTableError,
    NewerSchemaError,
    RetryableStoreError,
    SchemaMismatchError,
    StoreError,
    StoreNotFoundError,
)
from storage.schemas import SCHEMA_VERSION, TABLES, table_spec
from storage.store import Store

__all__ = [
    "SCHEMA_VERSION",
    "TABLES",
    "CorruptFileError",
    "MissingTableError",
    "NewerSchemaError",
    "RetryableStoreError",
    "SchemaMismatchError",
    "Store",
    "StoreError",
    "StoreNotFoundError",
    "table_spec",
]
