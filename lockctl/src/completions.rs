//! `lockctl completions <shell>`: the completion script of the shell,
//! written by clap from the same command line definition as `--help`, so
//! it completes every subcommand and flag of this build.
//!
//! Install, for example: `lockctl completions bash >
//! ~/.local/share/bash-completion/completions/lockctl`; zsh: into a
//! directory of `$fpath` as `_lockctl`; fish:
//! `~/.config/fish/completions/lockctl.fish`.

use std::io::Write;

use clap_complete::Shell;

use crate::Failure;

/// Writes the completion script for `shell` to `out`.
pub(crate) fn write(shell: Shell, out: &mut impl Write) -> Result<(), Failure> {
    let mut command = crate::cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "lockctl", &mut script);
    out.write_all(&script)
        .and_then(|()| out.flush())
        .map_err(|e| Failure(format!("cannot write the completion script: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(shell: Shell) -> String {
        let mut out = Vec::new();
        assert!(write(shell, &mut out).is_ok());
        String::from_utf8(out).unwrap_or_default()
    }

    #[test]
    fn every_shell_gets_a_script_that_completes_every_subcommand_and_flag() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let text = script(shell);
            for word in [
                "list",
                "show",
                "watch",
                "release",
                "completions",
                "redis-url",
                "prefix",
            ] {
                assert!(text.contains(word), "{shell}: no {word}");
            }
        }
        assert!(script(Shell::Bash).contains("complete -F"), "a bash script");
        assert!(
            script(Shell::Zsh).starts_with("#compdef lockctl"),
            "a zsh script"
        );
        assert!(
            script(Shell::Fish).contains("complete -c lockctl"),
            "a fish script"
        );
    }
}
