"""The chaos rig: worker processes on one PostgreSQL, a ledger of effects outside the journal,
an external controller that injects faults, and invariants checked in SQL (issue 4).

``tests/chaos`` runs every arm at CI size; ``python -m benchmarks.chaos`` runs the full one.
"""
