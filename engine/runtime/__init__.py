"""What an engine process runs on: its model, batching, inbox, threads, device, warm-up and heap."""
