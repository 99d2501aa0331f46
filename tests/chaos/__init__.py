"""Fault injection (issue 19): real processes on PostgreSQL under faults; see docs/chaos.md."""
