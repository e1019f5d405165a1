"""Node kinds by family: ``steps`` (step, emit, for_each, fork), ``waits`` (await_signal,
sleep) and ``children`` (sub_flow, and a child's undo). Each is a function taking the
``Run``; ``Execution`` dispatches to them."""
