//! Compile-time tests live in tests/ui.rs.
