//! The expansion in a crate of edition 2024. A key that reads a name bound inside a pattern
//! borrows it with `ref` (lock-macros' `patterns.rs`), also where a by-reference default
//! binding mode applies (`(a, b): &(A, B)`); edition 2024 refuses such a `ref`, edition 2021
//! allows it, and the edition that applies is that of the `ref` token's span: the macro's
//! (2021), not the user's. trybuild builds every case in this crate's edition (2021), so
//! this test checks the patterns case in a 2024 project of its own.

mod project;

use project::Project;

#[test]
fn a_key_reading_names_inside_patterns_compiles_in_an_edition_2024_crate() {
    let output = Project {
        name: "edition-2024",
        edition: "2024",
        main: "pass/key_from_patterns.rs",
        incremental: false,
    }
    .check();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    // `#![deny(warnings)]` in the case: nothing was reported either.
    assert!(stderr.trim().is_empty(), "{stderr}");
}
