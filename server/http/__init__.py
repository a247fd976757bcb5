"""HTTP plumbing: the app, the direct routes, middleware, request heads, errors, metrics, tracing."""
