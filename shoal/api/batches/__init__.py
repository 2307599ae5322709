"""The Batches API behind the routes: batch state in JetStream KV (api/batch_store.py),
the input file's lines (lines.py), saved progress (parts.py), and the runner that works
through batches on the low-priority lane (runner.py)."""
