"""The batching engine: queues, dispatch and fan-out, with no protocol and no model server."""
