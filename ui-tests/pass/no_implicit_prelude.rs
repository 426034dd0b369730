//! Under `#[no_implicit_prelude]` nothing but the extern crates is in scope: the generated
//! code names everything by its full path (`String::from` would need `From` in scope).
#[no_implicit_prelude]
mod locked {
    #[::lock_runtime::distributed_lock(key = "jobs", lease = "30s", wait = "1s")]
    pub async fn literal_key() -> ::core::result::Result<(), ::lock_runtime::LockError> {
        ::core::result::Result::Ok(())
    }

    #[::lock_runtime::distributed_lock(
        key = "job:<name>:<pair.0>",
        lease = ::core::time::Duration::from_secs(5),
        watchdog = false,
        on_lost = "continue",
        fair = true
    )]
    pub async fn placeholders(
        name: &str,
        pair: (u8, u8),
        _: u8,
        (a, _b): (u8, u8),
        _c: u8,
    ) -> ::core::result::Result<u8, ::lock_runtime::LockError> {
        ::core::result::Result::Ok(a)
    }

    #[::lock_runtime::distributed_lock(key = ["jobs", "job:<name>", "pair:<a>"], mode = "read")]
    pub async fn many(
        name: &str,
        (a, _b): (u8, u8),
    ) -> ::core::result::Result<u8, ::lock_runtime::LockError> {
        ::core::result::Result::Ok(a + name.len() as u8)
    }

    pub struct Account {
        pub tenant: ::std::string::String,
    }

    impl Account {
        #[::lock_runtime::distributed_lock(key = "acct:<self.tenant>")]
        pub async fn method(&self) -> ::core::result::Result<usize, ::lock_runtime::LockError> {
            ::core::result::Result::Ok(self.tenant.len())
        }
    }
}

fn main() {
    let _ = locked::literal_key();
    let _ = locked::many("n", (1, 2));
    let _ = locked::placeholders("n", (1, 2), 0, (1, 2), 3);
    let account = locked::Account {
        tenant: String::new(),
    };
    let _ = account.method();
}
