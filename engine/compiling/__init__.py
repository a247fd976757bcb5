"""Compiled engines: the package format, the cache's safety, the worker that builds, the switch."""
