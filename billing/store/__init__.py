"""The billing adapters: Redis, Parquet, files on disk and the schema registry client."""
