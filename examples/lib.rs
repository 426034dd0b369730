//! Shared nothing; the examples are the point of this crate.
