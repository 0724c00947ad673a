"""Runtime-state library: catalog, envelope, principals, handoffs (backend-neutral)."""
