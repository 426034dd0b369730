//! Tokens written back as text for error messages.
//!
//! `ToTokens::to_string` spaces every token apart (`Option < u8 >`); a message that quotes the
//! user's code should show it as the user wrote it (`Option<u8>`).

use quote::ToTokens;

/// Tokens as a person writes them, for messages: `Option<u8>`, not `Option < u8 >`.
pub(crate) fn written(tokens: &impl ToTokens) -> String {
    let mut text = tokens.to_token_stream().to_string();
    for (from, to) in [
        (" < ", "<"),
        ("< ", "<"),
        (" <", "<"),
        (" >", ">"),
        (" ,", ","),
        (" :: ", "::"),
        (":: ", "::"),
        ("& ", "&"),
        (" ! (", "!("),
        ("! (", "!("),
        ("( ", "("),
        (" )", ")"),
    ] {
        text = text.replace(from, to);
    }
    text
}
