"""Named tenants from WARMPOOL_API_KEYS_FILE: their keys (hashed), scopes, models and quotas."""
