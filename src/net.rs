//! Outbound connections to the Git host: rustls with ring and the platform's trust store for
//! the status API (the provider and the verifier the Kubernetes client uses too), a private
//! CA from `--ca-file` for Git and the status API, libgit2's connect and read timeouts, and
//! errors that say what failed: the certificate, DNS, a refused connection, or a timeout.
//!
//! libgit2 speaks HTTPS through the system's OpenSSL (its CA bundle plus `--ca-file`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;

/// Installs ring as the process's rustls provider, so that reqwest (built without one) and
/// the Kubernetes client use the same. Idempotent.
pub fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Fails only when a provider is installed already, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Why `--ca-file` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CaFileError {
    #[error("cannot read --ca-file {path}: {}", crate::error::io_reason(.source))]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "--ca-file {path} holds no PEM certificate; it must contain one or more \
         `-----BEGIN CERTIFICATE-----` blocks (the CA that signed the Git host's certificate)"
    )]
    NoCertificate { path: PathBuf },
    #[error(
        "--ca-file {path} is not valid PEM ({message}); it must contain one or more \
         `-----BEGIN CERTIFICATE-----` blocks"
    )]
    Invalid { path: PathBuf, message: String },
    #[error("--ca-file {path}: libgit2 refused it: {message}")]
    Git { path: PathBuf, message: String },
    #[error("cannot set libgit2's timeouts: {0}")]
    GitSettings(String),
    #[error("cannot make the HTTP client for the Git host's API: {0}")]
    Client(String),
}

/// Largest CA bundle read; a system bundle is about 200 KiB.
const MAX_CA_FILE_BYTES: u64 = 4 << 20;

/// The certificates in a PEM file, at least one.
pub fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, CaFileError> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CA_FILE_BYTES).read_to_end(&mut bytes))
        .map_err(|source| CaFileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CaFileError::Invalid {
            path: path.to_path_buf(),
            // The parser quotes the marker it missed as a list of bytes.
            message: e
                .to_string()
                .split(':')
                .next()
                .unwrap_or_default()
                .to_string(),
        })?;
    if certs.is_empty() {
        return Err(CaFileError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// An HTTP client for the Git host's API: the platform's roots plus `ca_file`'s, `timeout`
/// for each request (connecting included).
pub fn http_client(
    ca_file: Option<&Path>,
    timeout: Duration,
) -> Result<reqwest::Client, CaFileError> {
    client_with(reqwest::Client::builder(), ca_file, timeout)
}

/// [`http_client`] that follows no redirect: for URLs from Git that a policy checks (a
/// redirect would take the request past the check).
pub fn http_client_no_redirects(
    ca_file: Option<&Path>,
    timeout: Duration,
) -> Result<reqwest::Client, CaFileError> {
    client_with(
        reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()),
        ca_file,
        timeout,
    )
}

fn client_with(
    builder: reqwest::ClientBuilder,
    ca_file: Option<&Path>,
    timeout: Duration,
) -> Result<reqwest::Client, CaFileError> {
    install_crypto_provider();
    let mut builder = builder
        .user_agent(concat!("linnet/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(timeout)
        .timeout(timeout);
    if let Some(path) = ca_file {
        let extra = read_ca_file(path)?
            .iter()
            .map(|der| reqwest::Certificate::from_der(der))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CaFileError::Invalid {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        builder = builder.tls_certs_merge(extra);
    }
    builder.build().map_err(|e| match ca_file {
        Some(path) => CaFileError::Invalid {
            path: path.to_path_buf(),
            message: crate::error::error_chain(&e),
        },
        None => CaFileError::Client(crate::error::error_chain(&e)),
    })
}

/// The raw size of the objects libgit2 keeps cached, across all repositories.
pub const GIT_OBJECT_CACHE_BYTES: libc::ssize_t = 4 * 1024 * 1024;

/// Sets libgit2's process-wide connect and read timeouts to `timeout` (a read timeout is per
/// read: [`crate::source::git::GitMirror::set_deadline`] bounds a whole transfer), and adds
/// `ca_file` to the certificates its HTTPS (OpenSSL) trusts. Call once, while the process
/// has a single thread.
#[allow(unsafe_code)]
pub fn configure_git(timeout: Duration, ca_file: Option<&Path>) -> Result<(), CaFileError> {
    let millis = libc::c_int::try_from(timeout.as_millis())
        .unwrap_or(libc::c_int::MAX)
        .max(1);
    if let Some(path) = ca_file {
        // libgit2 reports a bad file only as "failed to load CA"; say which and why first.
        read_ca_file(path)?;
    }
    let settings = |e: git2::Error| CaFileError::GitSettings(e.message().to_string());
    // SAFETY: these write libgit2's global settings without a lock (and git2's first use sets
    // OpenSSL's environment variables), so they must not race another thread. `cli::dispatch`
    // calls this before it builds the async runtime, while the process has one thread, and
    // nothing writes these settings again.
    unsafe { git2::opts::set_server_connect_timeout_in_milliseconds(millis) }.map_err(settings)?;
    unsafe { git2::opts::set_server_timeout_in_milliseconds(millis) }.map_err(settings)?;
    // Memory libgit2 may hold for objects and packs (issue 45): its defaults (a 256 MiB object
    // cache, 8 GiB of mapped pack windows) let a pushed repository's shape, not the agent's
    // budgets, decide the resident size. The cache counts objects' raw size, and a parsed
    // tree costs about as much again: at 10,000 rollouts a 16 MiB cache held 34 MiB of old
    // status trees, from the write-back's pushes (issue 51). SAFETY: as above.
    unsafe { git2::opts::set_cache_max_size(GIT_OBJECT_CACHE_BYTES) }.map_err(settings)?;
    unsafe { git2::opts::set_mwindow_size(8 * 1024 * 1024) }.map_err(settings)?;
    unsafe { git2::opts::set_mwindow_mapped_limit(32 * 1024 * 1024) }.map_err(settings)?;
    if let Some(path) = ca_file {
        // SAFETY: as above.
        unsafe { git2::opts::set_ssl_cert_file(path) }.map_err(|e| CaFileError::Git {
            path: path.to_path_buf(),
            message: e.message().to_string(),
        })?;
    }
    Ok(())
}

/// What kind of network failure an error is: a stable metric label and words for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The server's certificate is not trusted (unknown CA, wrong name, expired).
    Certificate,
    /// Another TLS failure (protocol, handshake).
    Tls,
    /// The host name does not resolve.
    Dns,
    /// Nothing listens there.
    Refused,
    /// No answer in time.
    Timeout,
    /// Something else on the way.
    Other,
}

impl Failure {
    /// Every label [`Failure::label`] gives.
    pub const LABELS: &'static [&'static str] = &[
        "certificate",
        "tls",
        "dns",
        "connection_refused",
        "timeout",
        "unreachable",
    ];

    /// A stable metric label.
    pub fn label(self) -> &'static str {
        match self {
            Failure::Certificate => "certificate",
            Failure::Tls => "tls",
            Failure::Dns => "dns",
            Failure::Refused => "connection_refused",
            Failure::Timeout => "timeout",
            Failure::Other => "unreachable",
        }
    }

    /// What a person reads first, with what to do about it.
    pub fn describe(self) -> &'static str {
        match self {
            Failure::Certificate => {
                "the server's TLS certificate is not trusted; if the host uses a private CA, \
                 give that CA with --ca-file"
            }
            Failure::Tls => "the TLS handshake failed",
            Failure::Dns => "the host name does not resolve",
            Failure::Refused => "the connection was refused (nothing listens there)",
            Failure::Timeout => "no answer in time (--git-timeout)",
            Failure::Other => "the request failed",
        }
    }
}

/// The kind of failure behind an HTTP client error.
pub fn classify_http(e: &reqwest::Error) -> Failure {
    if e.is_timeout() {
        return Failure::Timeout;
    }
    let mut found = None;
    crate::error::walk_sources(e, &mut |err| {
        if found.is_some() {
            return;
        }
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            found = Some(match tls {
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => {
                    Failure::Certificate
                }
                _ => Failure::Tls,
            });
        } else if let Some(io) = err.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => found = Some(Failure::Refused),
                std::io::ErrorKind::TimedOut => found = Some(Failure::Timeout),
                _ => {}
            }
        } else {
            let text = err.to_string();
            if text.starts_with("dns error") || text.contains("failed to lookup address") {
                found = Some(Failure::Dns);
            }
        }
    });
    found.unwrap_or(Failure::Other)
}

/// An HTTP client error as one line: what kind of failure, what to do, and the whole cause.
pub fn explain_http(e: &reqwest::Error) -> (Failure, String) {
    let failure = classify_http(e);
    (
        failure,
        format!("{}: {}", failure.describe(), crate::error::error_chain(e)),
    )
}

/// The kind of failure behind a libgit2 error from a network call.
pub fn classify_git(e: &git2::Error) -> Failure {
    let message = e.message().to_ascii_lowercase();
    if e.code() == git2::ErrorCode::Certificate
        || (e.class() == git2::ErrorClass::Ssl && message.contains("certificate"))
    {
        Failure::Certificate
    } else if e.code() == git2::ErrorCode::Timeout || message.contains("timed out") {
        Failure::Timeout
    } else if e.class() == git2::ErrorClass::Ssl {
        Failure::Tls
    } else if message.contains("failed to resolve address") {
        Failure::Dns
    } else if message.contains("connection refused") {
        Failure::Refused
    } else {
        Failure::Other
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_label_list_holds_every_label_given() {
        for f in [
            Failure::Certificate,
            Failure::Tls,
            Failure::Dns,
            Failure::Refused,
            Failure::Timeout,
            Failure::Other,
        ] {
            assert!(Failure::LABELS.contains(&f.label()), "{f:?}");
        }
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_refused_with_what_it_should_hold() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let e = read_ca_file(&path).unwrap_err();
        assert!(e.to_string().contains("BEGIN CERTIFICATE"), "{e}");
        let e = read_ca_file(&dir.path().join("missing.pem")).unwrap_err();
        assert!(e.to_string().contains("cannot read --ca-file"), "{e}");
    }

    #[test]
    fn libgit2_errors_are_classified_by_code_and_words() {
        let timeout = git2::Error::new(
            git2::ErrorCode::Timeout,
            git2::ErrorClass::Net,
            "could not read from socket: timed out",
        );
        assert_eq!(classify_git(&timeout), Failure::Timeout);
        let cert = git2::Error::new(
            git2::ErrorCode::Certificate,
            git2::ErrorClass::Ssl,
            "the SSL certificate is invalid",
        );
        assert_eq!(classify_git(&cert), Failure::Certificate);
        let dns = git2::Error::new(
            git2::ErrorCode::GenericError,
            git2::ErrorClass::Net,
            "failed to resolve address for git.invalid: Name or service not known",
        );
        assert_eq!(classify_git(&dns), Failure::Dns);
        let refused = git2::Error::new(
            git2::ErrorCode::GenericError,
            git2::ErrorClass::Os,
            "failed to connect to 127.0.0.1: Connection refused",
        );
        assert_eq!(classify_git(&refused), Failure::Refused);
    }

    #[test]
    fn the_chain_looks_inside_io_errors_and_drops_repeats() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let inner = std::io::Error::other(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        ));
        let text = crate::error::error_chain(&Outer(inner));
        assert!(
            text.starts_with("outer: invalid peer certificate"),
            "{text}"
        );
        assert!(text.contains("UnknownIssuer"), "{text}");
    }
}
