"""workwarden.statemachine: the spec, the pure core and the authority.

Workers execute; the warden decides. Load the spec (`default_spec()` or
`load_spec(path)`), build an `Authority` over a store from
`workwarden.storage`, and drive the worker lifecycle through it. `decide` is
the pure reference model the authority, the checker and other
implementations are held against.
"""

from workwarden.statemachine.admission import workload_id_for
from workwarden.statemachine.authority import Authority, Prepared
from workwarden.statemachine.commands import (
    AdmitCommand,
    AdmitReply,
    CancelCommand,
    CheckpointCommand,
    ClaimCommand,
    Command,
    CompleteCommand,
    ConfirmCancelCommand,
    EnforceDeadlineCommand,
    ExecutionContextCommand,
    FailCommand,
    HeartbeatCommand,
    OperatorCommand,
    RecoverCommand,
    RetryCommand,
    StartCommand,
    StateReply,
    SweepReply,
    TimeoutCommand,
    WorkloadPage,
)
from workwarden.statemachine.core import Decision, decide
from workwarden.statemachine.errors import WorkloadError
from workwarden.statemachine.grants import (
    Grant,
    GrantSigner,
    GrantVerifier,
    ResourceScope,
    SignedGrant,
    Subject,
)
from workwarden.statemachine.models import (
    DEFAULT_RETRY_ON,
    Attempt,
    Checkpoint,
    Claim,
    CreateWorkload,
    Dependency,
    Event,
    ExecutionContext,
    Fence,
    Result,
    RetryPolicy,
    Timeouts,
    Workload,
    default_retry_policy,
)
from workwarden.statemachine.spec import Problem, Spec, check_spec_file, default_spec, load_spec

__all__ = [
    "DEFAULT_RETRY_ON",
    "AdmitCommand",
    "AdmitReply",
    "Attempt",
    "Authority",
    "CancelCommand",
    "Checkpoint",
    "CheckpointCommand",
    "Claim",
    "ClaimCommand",
    "Command",
    "CompleteCommand",
    "ConfirmCancelCommand",
    "CreateWorkload",
    "Decision",
    "Dependency",
    "EnforceDeadlineCommand",
    "Event",
    "ExecutionContext",
    "ExecutionContextCommand",
    "FailCommand",
    "Fence",
    "Grant",
    "GrantSigner",
    "GrantVerifier",
    "HeartbeatCommand",
    "OperatorCommand",
    "Prepared",
    "Problem",
    "RecoverCommand",
    "ResourceScope",
    "Result",
    "RetryCommand",
    "RetryPolicy",
    "SignedGrant",
    "Spec",
    "StartCommand",
    "StateReply",
    "Subject",
    "SweepReply",
    "TimeoutCommand",
    "Timeouts",
    "Workload",
    "WorkloadError",
    "WorkloadPage",
    "check_spec_file",
    "decide",
    "default_retry_policy",
    "default_spec",
    "load_spec",
    "workload_id_for",
]
