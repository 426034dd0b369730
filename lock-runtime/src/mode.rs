//! [`LockMode`]: whether a hold shares its key with other readers or
//! excludes everyone (`docs/design/read-write.md`).

/// How a hold treats other holders of its key.
///
/// Exclusive (the default) and write are one lock: they exclude each other
/// and every reader, and re-enter each other. Reads share the key with other
/// reads, across processes, and exclude writers. A read nested inside a
/// write or read hold of the same call chain re-enters it; a write nested
/// inside a read hold is refused at once with [`LockError::UpgradeRefused`]
/// (two readers upgrading at once would wait for each other for ever).
///
/// [`LockError::UpgradeRefused`]: crate::LockError::UpgradeRefused
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockMode {
    /// One holder at a time (the default): the mutex.
    #[default]
    Exclusive,
    /// Shared with other readers; excludes writers.
    Read,
    /// One holder at a time, readers excluded: the same lock as
    /// [`Exclusive`](Self::Exclusive) (only ZooKeeper names its node
    /// differently, as Curator's read-write lock does).
    Write,
}

impl LockMode {
    /// Whether holds of this mode share the key with other readers.
    pub fn is_read(self) -> bool {
        self == LockMode::Read
    }

    /// The mode's name, as the attribute spells it (`"exclusive"`, `"read"`,
    /// `"write"`).
    pub fn as_str(self) -> &'static str {
        match self {
            LockMode::Exclusive => "exclusive",
            LockMode::Read => "read",
            LockMode::Write => "write",
        }
    }
}

impl std::fmt::Display for LockMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
