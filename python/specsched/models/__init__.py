"""Small models that run the whole speculative loop (torch required)."""
