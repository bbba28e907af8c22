"""Celery role: fragment persistence, index refresh and pulse tasks."""
