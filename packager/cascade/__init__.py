"""Pipelines: several models built into one bundle that runs them as a cascade (OCR)."""
