//! Without an installed runtime every entry point says so, and install works once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use lock_runtime::{lock, with_lock, LockError, LockRuntime};

/// One test, because the global registry is per process and install is final.
#[tokio::test]
async fn uninstalled_runtime_errors_then_install_works_once() {
    assert!(matches!(
        LockRuntime::global(),
        Err(LockError::NotInstalled)
    ));
    let err = lock("k").acquire().await.unwrap_err();
    assert!(matches!(err, LockError::NotInstalled), "{err}");
    assert!(err.to_string().contains("install"), "{err}");
    let err = with_lock(lock("k"), async { Ok::<_, LockError>(()) })
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::NotInstalled));

    LockRuntime::builder()
        .memory()
        .build()
        .await
        .unwrap()
        .install()
        .unwrap();
    let second = LockRuntime::builder()
        .memory()
        .build()
        .await
        .unwrap()
        .install();
    assert!(matches!(second, Err(LockError::AlreadyInstalled)));
    let guard = lock("k").acquire().await.unwrap();
    assert_eq!(guard.key(), "k");
}
