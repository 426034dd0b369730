//! The shape of etcd endpoints and ZooKeeper connect strings, checked when
//! the runtime is built: a mistake (`127.0.0.1:2379x`, a `zk://` scheme, a
//! missing port) is named at start, not found as a connection to the wrong
//! place or a path error at the first lock.
//!
//! Checks text only; resolves and connects nothing.

use crate::error::LockError;

/// Whether `port` is a TCP port number (1 to 65535).
fn is_port(port: &str) -> bool {
    !port.is_empty()
        && port.bytes().all(|b| b.is_ascii_digit())
        && port.parse::<u16>().is_ok_and(|p| p != 0)
}

/// `host:port` (an IPv6 host in brackets): the host and the port, or why not.
fn host_port(entry: &str) -> Result<(), &'static str> {
    let Some((host, port)) = entry.rsplit_once(':') else {
        return Err("no port");
    };
    if host.is_empty() || host.contains(['/', '@', ' ']) {
        return Err("no host");
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err("an IPv6 host goes in brackets, [::1]:port");
    }
    if !is_port(port) {
        return Err("the port is not a number from 1 to 65535");
    }
    Ok(())
}

/// etcd endpoints: each `host:port` or `http(s)://host:port`.
pub(super) fn check_etcd(endpoints: &[String]) -> Result<(), LockError> {
    if endpoints.is_empty() {
        return Err(LockError::InvalidConfig(
            "etcd: no endpoints given (host:port[,host:port…])".to_owned(),
        ));
    }
    for endpoint in endpoints {
        let bare = endpoint
            .strip_prefix("http://")
            .or_else(|| endpoint.strip_prefix("https://"))
            .unwrap_or(endpoint)
            .trim_end_matches('/');
        if let Err(why) = host_port(bare) {
            return Err(LockError::InvalidConfig(format!(
                "etcd endpoint {endpoint:?} is not host:port (or http://host:port): {why}"
            )));
        }
    }
    Ok(())
}

/// A ZooKeeper connect string: `host:port[,host:port…][/chroot]`, no scheme.
pub(super) fn check_zookeeper(connect: &str) -> Result<(), LockError> {
    let refuse = |why: &str| {
        LockError::InvalidConfig(format!(
            "ZooKeeper connect string {connect:?} is not host:port[,host:port…][/chroot]: {why}"
        ))
    };
    if let Some((scheme, _)) = connect.split_once("://") {
        return Err(refuse(&format!(
            "no scheme ({scheme}://) goes before the servers"
        )));
    }
    let (servers, chroot) = match connect.find('/') {
        Some(at) => (&connect[..at], Some(&connect[at..])),
        None => (connect, None),
    };
    if servers.trim().is_empty() {
        return Err(refuse("no servers"));
    }
    for server in servers.split(',') {
        if let Err(why) = host_port(server.trim()) {
            return Err(refuse(&format!("{server:?}: {why}")));
        }
    }
    if let Some(chroot) = chroot {
        if chroot.len() > 1 && (chroot.ends_with('/') || chroot.contains("//")) {
            return Err(refuse(
                "the chroot is a path like /locks, without an empty part",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn good_endpoints_pass() {
        let good = [
            "127.0.0.1:2379",
            "http://etcd-0:2379",
            "https://[::1]:2379/",
        ];
        assert!(check_etcd(&good.map(str::to_owned)).is_ok());
        for connect in ["zk1:2181", "zk1:2181,zk2:2181/locks", "[::1]:2181", "h:1/"] {
            assert!(check_zookeeper(connect).is_ok(), "{connect}");
        }
    }

    #[test]
    fn each_mistake_is_named() {
        for (endpoint, why) in [
            ("127.0.0.1:2379x", "port"),
            ("127.0.0.1", "no port"),
            (":2379", "no host"),
            ("::1:2379", "brackets"),
            ("host:0", "port"),
            ("host:65536", "port"),
        ] {
            let error = check_etcd(&[endpoint.to_owned()]).unwrap_err().to_string();
            assert!(error.contains(endpoint) && error.contains(why), "{error}");
        }
        for (connect, why) in [
            ("zk://host:2181", "no scheme (zk://)"),
            ("host", "no port"),
            ("host:2181,", "no port"),
            ("/locks", "no servers"),
            ("host:2181/locks/", "chroot"),
        ] {
            let error = check_zookeeper(connect).unwrap_err().to_string();
            assert!(error.contains(why), "{connect}: {error}");
        }
    }
}
