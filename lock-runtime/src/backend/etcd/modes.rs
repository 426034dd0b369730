//! A holder id's keys keep their mode: which of them an attempt may use,
//! and which one carries a hold of a given mode (renewals).
//!
//! A holder has two key names in a lock's directory, `<lock>/<holder>`
//! (write) and `<lock>/read/<holder>` (read), and puts at most one of them.
//! The waiters never use one holder id in two modes (a fair place has the
//! mode of the waiter that queued it, `Backend::places_have_modes`), and
//! nothing here changes a key's mode: an attempt that finds its holder's
//! key of the other mode (or a write key valued `r`) is refused, and the
//! waiters give that place back and queue a new id. Only a hold's own
//! downgrade turns its write key into a reader (value `r`).
//!
//! Why it matters: a place's turn is computed from its key as it was read
//! (`wait.rs` hands a writer's key over as a write hold). A place that
//! changed mode after that read, by an attempt of the other mode whose
//! caller was cancelled, would be entered as a writer while etcd records a
//! reader, and a reader of another process would come in beside it. So a
//! renewal counts a write hold only while its key is still a writer.
//!
//! Owns the rule of modes, as pure functions; sends nothing to etcd.

use etcd_client::KeyValue;

use super::readers::READER;
use crate::error::BackendError;
use crate::mode::LockMode;

/// The key an attempt of `holder` in mode `read` found of its own:
/// `ours` (its mode's key name) and `other` (the other name), as read.
/// `Ok(None)`: neither stands. `Err`: a key of the other mode stands (or a
/// write attempt found its write key made a reader): the holder id serves
/// that mode, and this attempt may not use it.
pub(super) fn own_key<'a>(
    lock: &str,
    holder: &str,
    read: bool,
    ours: Option<&'a KeyValue>,
    other: Option<&'a KeyValue>,
) -> Result<Option<&'a KeyValue>, BackendError> {
    let turned = |kv: &KeyValue| !read && kv.value() == READER;
    match (ours, other) {
        (Some(kv), None) if !turned(kv) => Ok(Some(kv)),
        (None, None) => Ok(None),
        _ => Err(BackendError::msg(format!(
            "etcd: the holder id {holder} of {lock} has a key of the other mode; a place \
             serves one mode, and an attempt in another takes a new id"
        ))),
    }
}

/// Whether a hold of `mode` is carried by its holder's key named as a read
/// key (`read_key`) or a write key, valued `value`: a write hold by its
/// write key while that is a writer; a read hold by its read key, or by its
/// write key (a downgraded hold, valued `r`, or one whose downgrade is not
/// applied yet: still a writer, more exclusive).
pub(super) fn carries(mode: LockMode, read_key: bool, value: &[u8]) -> bool {
    if mode.is_read() {
        true
    } else {
        !read_key && value != READER
    }
}

#[cfg(test)]
mod tests {
    use super::carries;
    use crate::mode::LockMode;

    #[test]
    fn a_write_hold_is_carried_only_by_its_write_key_while_that_is_a_writer() {
        for mode in [LockMode::Write, LockMode::Exclusive] {
            assert!(carries(mode, false, b""));
            assert!(!carries(mode, false, b"r"), "{mode}: a reader key");
            assert!(!carries(mode, true, b""), "{mode}: a read key");
        }
        assert!(carries(LockMode::Read, true, b""));
        assert!(carries(LockMode::Read, false, b"r"));
        assert!(carries(LockMode::Read, false, b""));
    }
}
