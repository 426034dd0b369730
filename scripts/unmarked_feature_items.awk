# Used by scripts/test: `awk -f scripts/unmarked_feature_items.awk FILES`.
# Prints each public item behind `#[cfg(feature = ...)]` whose attributes
# lack the docs.rs marker `#[cfg_attr(docsrs, doc(cfg(...)))]`.
/^[ \t]*#\[cfg\((any\(|all\()?feature/ { gated = FNR; marked = 0; next }
gated && /^[ \t]*#\[/ { if ($0 ~ /doc\(cfg\(/) marked = 1; next }
gated && /^[ \t]*pub[ \t]/ && !marked { print FILENAME ":" FNR ": " $0; bad = 1 }
{ gated = 0 }
END { exit bad }
