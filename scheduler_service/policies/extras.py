"""What a policy needs beyond the scheduler's own packages, checked when the policy is built: a missing package then
stops the service at start with the fix (a ValueError, which ``scheduler_service.main`` reports as bad input)
instead of failing every cycle once jobs arrive."""

from __future__ import annotations


def require_scipy(policy: str) -> None:
    """``policy`` solves its programs with scipy (HiGHS); refuse to build it without scipy."""
    try:
        import scipy.optimize  # type: ignore[import-untyped]  # noqa: F401
    except ModuleNotFoundError:
        raise ValueError(f"policy {policy!r} solves with scipy (HiGHS), which is not installed: pip install "
                         "'aryl[scheduler]' (the scheduler's extra has it), or set scheduling.policy to another "
                         "policy") from None
