"""Persistent state: SQLAlchemy models (``models``) and the engine/session factory (``db``)."""
