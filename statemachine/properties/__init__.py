"""The properties every workload and every write is held to.

`invariants` checks documents, writes, audit records and scopes; `history`
checks a history's structure against the table; `decisions` recomputes every
decision a policy recorded.
"""
