"""Test-only helpers: fault injection between FlowX and the services it depends on."""
