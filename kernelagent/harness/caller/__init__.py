"""The trusted caller side of the harness: it starts and talks to the harness server."""
