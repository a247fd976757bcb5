"""`warmpool embed IN -o OUT`: a corpus file embedded through a warmpool server's /v1/embeddings.

A client of the appliance, never part of it: `orchestrator.__main__` hands it the `embed` word
before anything of the serving path is imported, and it imports nothing of `server` or `engine`
(the contracts in pyproject.toml). corpus.py reads the input, sinks.py writes the output, client.py
sends the requests, appliance.py starts a server of its own, cli.py ties them together.
"""
