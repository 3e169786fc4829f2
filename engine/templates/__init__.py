"""Templates and expressions of a file, compiled and rendered in the sandboxed jinja2
environment: the checker parses them here, the run renders them here."""
