//! Every compile error `#[distributed_lock]` can give (`cases/`), and the shapes it must
//! accept (`pass/`). Regenerate the expected messages with `TRYBUILD=overwrite` and read them.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("cases/*.rs");
    t.pass("pass/*.rs");
}
