"""Evidentia: find the PDF pages that support a supplier's answer."""

__version__ = "0.1.0"
