//! The README is a newcomer's entry: its code is the code the workspace
//! builds (`examples/readme.rs`, `examples/order-service/examples/readme_handler.rs`,
//! both built by the tests), its feature table names every feature of
//! `lock-runtime`, and it calls nothing that works "planned".
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

const README: &str = include_str!("../../README.md");

/// The README's fenced ```` ```rust ```` blocks, in order.
fn rust_blocks() -> Vec<String> {
    let mut blocks = Vec::new();
    let mut open: Option<Vec<&str>> = None;
    for line in README.lines() {
        match (&mut open, line.trim_end()) {
            (None, "```rust") => open = Some(Vec::new()),
            (Some(block), "```") => {
                blocks.push(block.join("\n"));
                open = None;
            }
            (Some(block), _) => block.push(line),
            (None, _) => {}
        }
    }
    blocks
}

/// `source` without its leading `//!` doc lines (what the example says of
/// itself, which the README does not show).
fn without_header(source: &str) -> String {
    let lines = source.lines();
    let body: Vec<&str> = lines.skip_while(|l| l.starts_with("//!")).collect();
    body.join("\n").trim().to_owned()
}

/// `text` with every blank and every comma before a closing brace gone:
/// the example is rustfmt's layout of the README's lines.
fn squeezed(text: &str) -> String {
    let text: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    text.replace(",}", "}").replace(",)", ")")
}

#[test]
fn the_first_example_is_examples_readme_rs_word_for_word() {
    let blocks = rust_blocks();
    let example = include_str!("../../examples/readme.rs");
    assert_eq!(blocks[0].trim(), without_header(example));
}

#[test]
fn the_axum_handler_is_the_built_example_but_for_layout() {
    let blocks = rust_blocks();
    let handler = blocks
        .iter()
        .find(|b| b.contains("IntoResponse"))
        .expect("the README shows an axum handler");
    // Its last line names the route in a comment; the example builds it.
    let code: Vec<&str> = handler
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect();
    let example = include_str!("../../examples/order-service/examples/readme_handler.rs");
    let example = squeezed(&without_header(example));
    assert!(
        example.contains(&squeezed(&code.join("\n"))),
        "the README's handler differs from readme_handler.rs"
    );
}

#[test]
fn the_feature_table_names_every_feature_of_lock_runtime() {
    let manifest = include_str!("../../lock-runtime/Cargo.toml");
    let features = manifest
        .split("[features]")
        .nth(1)
        .expect("lock-runtime has features")
        .split("\n[")
        .next()
        .unwrap_or_default();
    let names: Vec<&str> = features
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(" = ").map(|(name, _)| name.trim()))
        .collect();
    assert!(names.contains(&"tls"), "{names:?}");
    for name in names {
        assert!(
            README.contains(&format!("| `{name}` |")),
            "the README's feature table lacks `{name}`"
        );
    }
}

#[test]
fn nothing_the_library_supports_is_called_planned() {
    for stale in ["planned", "not supported yet"] {
        assert!(
            !README.contains(stale),
            "the README says {stale:?}: {}",
            README
                .lines()
                .find(|l| l.contains(stale))
                .unwrap_or_default()
        );
    }
}
