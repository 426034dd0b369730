//! The lock key behind a backend's name, for `list` on etcd and ZooKeeper,
//! which find names (etcd keys, ZooKeeper paths) and must ask `inspect` by
//! key. lockctl does not spell those backends' naming rules: a name is a
//! key's only if the runtime's own `backend_key` of that key gives the
//! name back. The key is tried as written after the prefix, then
//! percent-decoded (etcd writes a key's `/` and `%` as `%2F` and `%25`);
//! any other name under the prefix is not a lock of this prefix.

#[cfg(any(feature = "etcd", feature = "zookeeper"))]
use lock_runtime::LockRuntime;

/// The prefix as the runtime writes it in names: the name of the empty
/// key (ZooKeeper's default prefix `lock:` is the path `/locks/`).
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) fn root(runtime: &LockRuntime) -> String {
    runtime.backend_key("")
}

/// The key whose backend name is `name` (`None`: no key of this runtime's
/// prefix has that name).
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) fn key_of(runtime: &LockRuntime, root: &str, name: &str) -> Option<String> {
    let written = name.strip_prefix(root)?;
    if written.is_empty() {
        return None;
    }
    [written.to_owned(), percent_decoded(written)]
        .into_iter()
        .find(|key| runtime.backend_key(key) == name)
}

/// `%xx` sequences decoded (others kept as they are).
pub(crate) fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
