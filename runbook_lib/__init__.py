"""gpu-migration runbook: evidence-gated migration of GPU workloads between providers.

Importing this package is cheap: torch, matplotlib, pandas and papermill are imported only by
the modules that use them.
"""

from runbook_lib.errors import (
    ApprovalRequired,
    EvidenceError,
    ParamsError,
    PhaseFailed,
    ProviderError,
    RunbookError,
    StorageError,
    WorkloadError,
)

__version__ = "0.2.0"

__all__ = [
    "ApprovalRequired",
    "EvidenceError",
    "ParamsError",
    "PhaseFailed",
    "ProviderError",
    "RunbookError",
    "StorageError",
    "WorkloadError",
    "__version__",
]
