//! Shared harness for the integration tests.
