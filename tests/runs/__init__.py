"""Tests that launch real multi-process trainings (or other long processes): every test here is `slow` (tests/conftest.py), so `make test-fast` leaves this folder out."""
