"""The explicit-state model checker over the pure core, and the tools around it.

`checker` explores the universe `universe` builds (states abstracted by
`abstraction`, their parts in `state`), `replay` runs a trace through a real
`Authority`, and `mutants` holds the broken cores the checker must catch.
"""
