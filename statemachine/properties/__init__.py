"""The properties every workload, every write and every exploration is held to.

`registry` declares each property once (name, kind, subjects, meaning);
`invariants` checks documents, the scopes and whole stores, `writes` one
write, `audit_log` the audit log, `coverage` the reachability properties and
the policies, `runs` a run against a store; `operations` derives what they
need of the operations table; `history` checks a history's structure against
the table; `decisions` recomputes every decision a policy recorded.
"""
