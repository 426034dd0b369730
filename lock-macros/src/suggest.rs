//! "Did you mean …?" for misspelled argument and parameter names.
//!
//! Both the argument parser (`laese` → `lease`) and the key template check (`<oder_id>` →
//! `<order_id>`) want the closest known name, so the distance lives here once.

/// The candidate closest to `typed`, if it is close enough to be a plausible typo.
pub(crate) fn closest<'a>(
    typed: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    // A third of the name, at least one edit: "ky" → "key", "wiat" → "wait", not "id" → "key".
    let limit = (typed.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|candidate| (edit_distance(typed, candidate), candidate))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// Levenshtein distance, counting an adjacent swap (`wiat`/`wait`) as one edit.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // rows[i][j]: distance between a[..i] and b[..j]; three rows are enough for the swap rule.
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let substitution = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + substitution);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARGS: [&str; 7] = [
        "key", "lease", "wait", "watchdog", "on_lost", "fair", "crate",
    ];

    #[test]
    fn typos_find_the_intended_name() {
        assert_eq!(closest("ky", ARGS), Some("key"));
        assert_eq!(closest("laese", ARGS), Some("lease"));
        assert_eq!(closest("wiat", ARGS), Some("wait"));
        assert_eq!(closest("onlost", ARGS), Some("on_lost"));
        assert_eq!(closest("watchdgo", ARGS), Some("watchdog"));
        assert_eq!(closest("fiar", ARGS), Some("fair"));
        assert_eq!(closest("far", ARGS), Some("fair"));
    }

    #[test]
    fn unrelated_names_get_no_suggestion() {
        assert_eq!(closest("timeout", ARGS), None);
        assert_eq!(closest("id", ["amount"]), None);
        assert_eq!(closest("x", std::iter::empty()), None);
    }
}
