"""The admin's view: the status document, its text rendering and the Prometheus metrics."""
