"""Neutral modules both sides import: settings, the startup state, model-folder reading and the
engine wire protocol. Nothing here imports torch, the web stack, the orchestrator or the engine."""
