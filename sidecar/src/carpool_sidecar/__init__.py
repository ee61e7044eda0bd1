"""The batching sidecar: an aiohttp proxy that groups requests into batches."""
