//! Throw-away certificates for the TLS tests (Redis and etcd).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::unique;

/// A throw-away CA, a server certificate for 127.0.0.1/localhost and a
/// client certificate, made with the `openssl` command line.
pub struct TestPki {
    dir: PathBuf,
}

impl TestPki {
    /// Makes the CA, the server certificate (`server.crt`, `server.key`)
    /// and a client certificate for mutual TLS (`client.crt`,
    /// `client.key`), all signed by the CA (`ca.crt`).
    pub fn new() -> TestPki {
        let dir = std::env::temp_dir().join(unique("lock-tls"));
        std::fs::create_dir_all(&dir).unwrap();
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .expect("openssl not found: install it with `apt-get install -y openssl`");
            assert!(out.status.success(), "openssl {args:?}: {out:?}");
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=lock-test-ca",
        ]);
        run(&ca);
        // A key and a certificate `<name>.key`, `<name>.crt` for `subject`,
        // signed by the CA, with these X.509 extensions.
        let issue = |name: &str, subject: &str, extensions: &str| {
            let (key, csr, crt, cnf) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.cnf"),
            );
            let mut request = vec!["req"];
            request.extend(ec);
            request.extend(["-keyout", &key, "-out", &csr, "-subj", subject]);
            run(&request);
            std::fs::write(dir.join(&cnf), extensions).unwrap();
            run(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                &cnf,
            ]);
        };
        issue(
            "server",
            "/CN=localhost",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
        );
        issue(
            "client",
            "/CN=lock-test-client",
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n\
             extendedKeyUsage=clientAuth\n",
        );
        TestPki { dir }
    }

    /// The path of one of its files.
    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    /// The contents of one of its files.
    pub fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(Path::new(&self.path(name))).unwrap()
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}
