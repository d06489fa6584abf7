"""Test suite: unit tests of pure logic and integration tests against real components."""
