"""The engine process: model loading, batching and pooling in plain torch. It imports only `common`,
torch, safetensors and its own modules (transformers only for models served through the fallback)."""
