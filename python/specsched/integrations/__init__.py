"""Adapters that plug third-party models into `specsched.generate` (each needs its own extra:
`specsched.integrations.hf` needs `pip install specsched[hf]`)."""
