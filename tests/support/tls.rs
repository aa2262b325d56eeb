//! A certificate authority made fresh by each test (never a committed key), server
//! certificates it signs for 127.0.0.1 and localhost, and an HTTPS server for an axum app.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A test CA.
pub struct TestCa {
    /// The CA's certificate, PEM: what `--ca-file` is given.
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A server's certificate and key, PEM.
pub struct ServerCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    /// A new CA named `name`, with its own key.
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        dn.push(DnType::OrganizationName, "linnet tests");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        TestCa {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// Writes the CA's certificate to `dir/<file>` and returns the path.
    pub fn write(&self, dir: &Path, file: &str) -> PathBuf {
        let path = dir.join(file);
        std::fs::write(&path, &self.cert_pem).unwrap();
        path
    }

    /// A server certificate for `127.0.0.1` and `localhost`, signed by this CA.
    pub fn server_cert(&self) -> ServerCert {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        ServerCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// A rustls server configuration with a fresh certificate from this CA.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        linnet::net::install_crypto_provider();
        let server = self.server_cert();
        let chain = CertificateDer::pem_slice_iter(server.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).unwrap();
        Arc::new(
            rustls::ServerConfig::builder()
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .unwrap(),
        )
    }

    /// An HTTP client for the tests that trusts this CA.
    pub fn client(&self) -> reqwest::Client {
        linnet::net::install_crypto_provider();
        reqwest::Client::builder()
            .tls_certs_merge(
                reqwest::Certificate::from_pem_bundle(self.cert_pem.as_bytes()).unwrap(),
            )
            .build()
            .unwrap()
    }
}

/// Serves `app` over HTTPS on `listener` with `config`, until the runtime ends.
pub async fn serve_https(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    config: Arc<rustls::ServerConfig>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            // A client that does not trust the CA ends here, as it should.
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                .await;
        });
    }
}
