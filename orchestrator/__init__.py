"""warmpool's startup orchestrator: bind at once, warm the page cache, keep a forkserver ready,
then serve. Importing it never imports torch."""
