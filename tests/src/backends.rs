//! The one list of backends every behaviour runs on, and the macros that
//! turn `async fn behaviour(kind: Kind)` into one test per backend.
//!
//! A behaviour is written once, as a function of the backend; the test
//! names are `behaviour::redis`, `behaviour::memory`, `behaviour::cluster`,
//! `behaviour::sentinel`, `behaviour::redlock`. A new backend joins every
//! behaviour by adding its pair to [`backends!`](macro@crate::backends) (and its
//! arms to [`Kind`](crate::Kind)).
//!
//! A behaviour that a backend does not offer by design says so where it is
//! declared, with the reason, so the exception is read with the behaviour.
//! A defect is no such reason: its test runs, and fails until it is fixed.
//!
//! ```ignore
//! on_every_backend!(
//!     counter_is_exact,
//!     // No test on Redlock: a design limit, not a defect.
//!     fair_waiters_take_turns skip(redlock = "Redlock has no fair mode"),
//! );
//! ```

/// The backends every behaviour runs on, as `test-module Kind-variant`
/// pairs, handed to `$callback!`. This line is the list.
#[macro_export]
macro_rules! backends {
    ($callback:ident) => {
        $callback! { redis Redis, memory Memory, cluster Cluster, sentinel Sentinel, redlock Redlock, etcd Etcd, etcd3 Etcd3, zookeeper Zookeeper, zookeeper3 Zookeeper3 }
    };
}

/// Declares one `#[tokio::test]` per backend of [`backends!`] for each
/// `async fn $name(kind: Kind)`; `skip(backend = "why")` leaves a backend
/// out (see the module docs).
#[macro_export]
macro_rules! on_every_backend {
    ($(
        $name:ident
        $( skip( $($skip:ident = $skip_why:literal),+ $(,)? ) )?
    ),+ $(,)?) => {
        $(
            mod $name {
                $crate::__behaviour! {
                    ($) $name
                    [$($($skip $skip_why)+)?]
                }
            }
        )+
    };
}

/// The tests of one behaviour: a local macro with one rule per backend
/// left out, then the general rule, applied to every backend
/// of [`backends!`]. (`$d` is a `$` handed in, so that this macro can
/// write the local macro's own metavariables.)
#[doc(hidden)]
#[macro_export]
macro_rules! __behaviour {
    (
        ($d:tt) $name:ident
        [$($skip:ident $skip_why:literal)*]
    ) => {
        macro_rules! __on_backends {
            ($d ($d backend:ident $d kind:ident),+) => {
                $d ( __on_backends!(@one $d backend $d kind); )+
            };
            $(
                (@one $skip $d kind:ident) => {};
            )*
            (@one $d backend:ident $d kind:ident) => {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $d backend() {
                    super::$name($crate::Kind::$d kind).await;
                }
            };
        }
        $crate::backends!(__on_backends);
    };
}

#[cfg(test)]
mod tests {
    use crate::Kind;

    /// A backend added to the list must be a `Kind` too, and the other way
    /// round: `Kind::ALL` is the list, in its order.
    #[test]
    fn the_backend_list_is_kind_all() {
        let mut listed = Vec::new();
        macro_rules! collect {
            ($($module:ident $kind:ident),+) => {
                $( listed.push(Kind::$kind); )+
            };
        }
        crate::backends!(collect);
        assert_eq!(listed, Kind::ALL);
    }
}
