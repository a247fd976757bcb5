"""OpenAI's Batch API: files and jobs kept in WARMPOOL_BATCH_DIR (store.py), run in the HTTP process
at bulk priority through the routes' own prepare and render (runner.py)."""
