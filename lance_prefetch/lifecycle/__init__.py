"""Process lifecycle: which read threads are live, what happens to them at interpreter exit, and
``Ctrl-C`` held back while an event-loop thread starts or stops."""
