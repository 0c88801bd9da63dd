"""Helpers shared by the tests: real processes, servers, fixtures.

No test file imports another; what two test files share lives here.
"""
