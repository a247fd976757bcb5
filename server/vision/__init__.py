"""Image inputs: decoding and resizing within limits, image URLs fetched on the event loop, each peer's shape."""
