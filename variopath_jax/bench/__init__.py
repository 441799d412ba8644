"""Evaluation harness: tables and plots."""
