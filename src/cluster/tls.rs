//! Transport security between nodes: mutual TLS under a cluster CA, or an unauthenticated
//! ephemeral mode for development.
//!
//! # Identity
//! A node's identity is its node id, carried as a DNS subject alternative name in its
//! certificate. One certificate serves both roles: a node presents it as a server (peers
//! connect with the server name set to the node id they expect) and as a client (the server
//! checks that the certificate names the node id the client announces). Node certificates
//! therefore need both the `serverAuth` and `clientAuth` extended key usages.
//!
//! Because the id is a DNS name, node ids must be DNS-name shaped: see [`check_node_id`].
//!
//! # Modes
//! - [`Security::Mutual`]: both sides verify the other's chain against the cluster CA (TLS
//!   1.3 only, ALPN [`ALPN`]). A peer without a certificate, with a certificate from
//!   another CA, or with a certificate for another node id is refused.
//! - [`Security::Ephemeral`]: a self-signed certificate generated at start; any peer is
//!   accepted (handshake signatures are still checked, so the channel is encrypted, but the
//!   peer is not authenticated and a man in the middle is possible).
//!
//! [`write_certs`] bootstraps a CA and node certificates for the mutual mode.

use std::collections::HashSet;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{WebPkiServerVerifier, verify_server_name};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig,
    SignatureScheme,
};

/// The ALPN protocol both sides must offer. Bump it when the transport's framing changes.
pub const ALPN: &[u8] = b"gossamer/1";

/// The longest node id: the longest DNS name.
pub const MAX_NODE_ID_LEN: usize = 253;

/// How a node secures its cluster traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Security {
    /// Mutual TLS under a cluster CA (`[cluster.tls]` in the config).
    Mutual {
        /// PEM file with the cluster CA certificate(s) that sign every node's certificate.
        ca: PathBuf,
        /// PEM file with this node's certificate (then any intermediates); it must name the
        /// node id as a DNS subject alternative name.
        cert: PathBuf,
        /// PEM file with the private key of `cert`.
        key: PathBuf,
    },
    /// A self-signed certificate generated at start; peers are not authenticated.
    Ephemeral,
}

/// Why transport security could not be set up, or certificates not written.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file is missing or unreadable.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A file that should hold PEM certificates holds none, or malformed PEM.
    #[error("{}: no PEM certificate ({reason})", path.display())]
    NotPem {
        /// The file.
        path: PathBuf,
        /// What the PEM parser said.
        reason: String,
    },
    /// A key file holds no PEM private key (PKCS#8, PKCS#1 or SEC1).
    #[error("{}: no PEM private key ({reason})", path.display())]
    NoKey {
        /// The file.
        path: PathBuf,
        /// What the PEM parser said.
        reason: String,
    },
    /// The private key does not belong to the certificate.
    #[error("{}: key does not match the certificate in {}", key.display(), cert.display())]
    KeyMismatch {
        /// The key file.
        key: PathBuf,
        /// The certificate file.
        cert: PathBuf,
    },
    /// The CA file holds a certificate that cannot serve as a trust anchor.
    #[error("{}: not a usable CA certificate ({reason})", path.display())]
    BadCa {
        /// The CA file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The node certificate does not chain to the cluster CA.
    #[error("{}: not signed by the CA in {} ({reason})", cert.display(), ca.display())]
    NotSignedByCa {
        /// The certificate file.
        cert: PathBuf,
        /// The CA file.
        ca: PathBuf,
        /// What verification said.
        reason: String,
    },
    /// The node certificate does not name this node's id as a DNS subject alternative name.
    #[error("{}: certificate does not name node id {node_id:?}", cert.display())]
    WrongName {
        /// The certificate file.
        cert: PathBuf,
        /// The node id it should name.
        node_id: String,
    },
    /// The node certificate is otherwise unusable: expired, not yet valid, or lacking the
    /// `serverAuth` / `clientAuth` extended key usages.
    #[error("{}: unusable certificate ({reason})", cert.display())]
    BadCert {
        /// The certificate file.
        cert: PathBuf,
        /// What verification said.
        reason: String,
    },
    /// The node id cannot be a certificate identity (see [`check_node_id`]).
    #[error("node id {id:?} {reason}")]
    NodeId {
        /// The node id.
        id: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// [`write_certs`] found a file it would overwrite, and was not told to force.
    #[error("{} already exists (use --force to overwrite)", path.display())]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// [`write_certs`] could not create a directory or write a file.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// Generating a key or certificate failed.
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused the configuration (not expected for files that passed the checks).
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A node's TLS configuration for QUIC: one server config (inbound connections) and one
/// client config (outbound connections), built from a [`Security`].
#[derive(Clone, Debug)]
pub struct NodeTls {
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    secure: bool,
}

impl Security {
    /// Loads (Mutual) or generates (Ephemeral) the TLS configuration for `node_id`.
    ///
    /// Mutual mode reads the three files and checks, before any peer connects, that the
    /// certificate chains to the CA, names `node_id`, is valid now, carries both the
    /// `serverAuth` and `clientAuth` usages, and matches the key. Every error names the file.
    pub fn load(&self, node_id: &str) -> Result<NodeTls, TlsError> {
        check_node_id(node_id)?;
        match self {
            Security::Mutual { ca, cert, key } => load_mutual(ca, cert, key, node_id),
            Security::Ephemeral => ephemeral(node_id),
        }
    }
}

impl NodeTls {
    /// The rustls server configuration (TLS 1.3, ALPN [`ALPN`]).
    pub fn server_config(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.server)
    }

    /// The rustls client configuration (TLS 1.3, ALPN [`ALPN`]). Connect with the server
    /// name set to the node id of the peer.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.client)
    }

    /// Whether peers are authenticated (Mutual) or not (Ephemeral).
    pub fn secure(&self) -> bool {
        self.secure
    }
}

/// Checks that `id` can serve as a certificate identity: a lower-case DNS name of at most
/// [`MAX_NODE_ID_LEN`] bytes, labels of 1–63 letters `a-z`, digits and inner hyphens,
/// separated by dots, the last label not all digits (so never an IP address). `node-a`,
/// `gossamer-7xk2p` and `n1.eu-west.example` qualify; `Node_A` and `10.0.0.1` do not.
///
/// Lower case only, because certificate name matching ignores case: `Node-A` and `node-a`
/// would be the same identity but different node ids.
pub fn check_node_id(id: &str) -> Result<(), TlsError> {
    let bad = |reason| {
        Err(TlsError::NodeId {
            id: id.to_owned(),
            reason,
        })
    };
    if id.is_empty() {
        return bad("is empty");
    }
    if id.len() > MAX_NODE_ID_LEN {
        return bad("is longer than 253 bytes");
    }
    for label in id.split('.') {
        if label.is_empty() || label.len() > 63 {
            return bad("has a label that is empty or longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return bad("may hold only a-z, 0-9, '-' and '.' (a DNS name in lower case)");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return bad("has a label starting or ending with '-'");
        }
    }
    if id
        .rsplit('.')
        .next()
        .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()))
    {
        return bad("ends in an all-digit label (it would read as an IP address)");
    }
    match ServerName::try_from(id) {
        Ok(ServerName::DnsName(_)) => Ok(()),
        _ => bad("is not a DNS name"),
    }
}

/// Whether the end-entity certificate `cert` names `node_id` as a DNS subject alternative
/// name. Only meaningful for a certificate whose chain was already verified (as the TLS
/// handshake does in Mutual mode).
pub fn cert_names(cert: &CertificateDer<'_>, node_id: &str) -> bool {
    let Ok(name) = ServerName::try_from(node_id) else {
        return false;
    };
    ParsedCertificate::try_from(cert).is_ok_and(|parsed| verify_server_name(&parsed, &name).is_ok())
}

/// Writes a new cluster CA and one certificate per node into `dir` (created if missing):
/// `ca.pem`, `ca-key.pem`, and for each node `<node>.pem` and `<node>-key.pem`.
///
/// Node certificates are signed by the CA, name the node id (and nothing else) as a DNS
/// subject alternative name, and carry the `serverAuth` and `clientAuth` usages. Key files
/// are written with mode 0600. Certificates are valid from 1975 to 4096 (rcgen's defaults):
/// rotate by writing a new set, or issue certificates from your own PKI for expiry.
///
/// Refuses (before writing anything) if any of the files exists, unless `force`; refuses
/// node ids that fail [`check_node_id`], duplicates, and `ca` (it would collide with the
/// CA's files). Returns the paths written, CA first.
pub fn write_certs(dir: &Path, nodes: &[String], force: bool) -> Result<Vec<PathBuf>, TlsError> {
    let mut seen = HashSet::new();
    for node in nodes {
        check_node_id(node)?;
        if node == "ca" {
            return Err(TlsError::NodeId {
                id: node.clone(),
                reason: "collides with the CA's files (ca.pem, ca-key.pem)",
            });
        }
        if !seen.insert(node.as_str()) {
            return Err(TlsError::NodeId {
                id: node.clone(),
                reason: "is given twice",
            });
        }
    }
    let mut files = vec![dir.join("ca.pem"), dir.join("ca-key.pem")];
    for node in nodes {
        files.push(dir.join(format!("{node}.pem")));
        files.push(dir.join(format!("{node}-key.pem")));
    }
    if let Some(path) = files.iter().find(|p| !force && p.exists()) {
        return Err(TlsError::Exists { path: path.clone() });
    }

    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = rcgen::DistinguishedName::new();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "gossamer cluster CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

    let mut contents = vec![(ca.pem(), false), (ca.key().serialize_pem(), true)];
    for node in nodes {
        let mut params = CertificateParams::new(vec![node.clone()])?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, node.as_str());
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &ca)?;
        contents.push((cert.pem(), false));
        contents.push((key.serialize_pem(), true));
    }

    fs::create_dir_all(dir).map_err(|source| TlsError::Write {
        path: dir.to_owned(),
        source,
    })?;
    for (path, (text, secret)) in files.iter().zip(&contents) {
        write_file(path, text.as_bytes(), *secret, force).map_err(|source| TlsError::Write {
            path: path.clone(),
            source,
        })?;
    }
    Ok(files)
}

/// Writes one file; secrets get mode 0600 (also when overwriting a file with wider mode).
fn write_file(path: &Path, bytes: &[u8], secret: bool, force: bool) -> io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut options = fs::OpenOptions::new();
    options.write(true);
    if force {
        options.create(true).truncate(true);
    } else {
        // Checked above, but a file appearing meanwhile must not be clobbered either.
        options.create_new(true);
    }
    if secret {
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    if secret {
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
    }
    file.write_all(bytes)?;
    file.sync_all()
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Every certificate in a PEM file, in order; at least one.
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(path)?;
    let not_pem = |reason: String| TlsError::NotPem {
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| not_pem(e.to_string()))?;
    if certs.is_empty() {
        return Err(not_pem("no CERTIFICATE section found".into()));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read(path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| TlsError::NoKey {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

fn load_mutual(ca: &Path, cert: &Path, key: &Path, node_id: &str) -> Result<NodeTls, TlsError> {
    let provider = provider();
    let mut roots = RootCertStore::empty();
    for anchor in read_certs(ca)? {
        roots.add(anchor).map_err(|e| TlsError::BadCa {
            path: ca.to_owned(),
            reason: e.to_string(),
        })?;
    }
    let roots = Arc::new(roots);
    let chain = read_certs(cert)?;
    let private = read_key(key)?;

    let server_verifier =
        WebPkiServerVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
            .build()
            .map_err(|e| TlsError::BadCa {
                path: ca.to_owned(),
                reason: e.to_string(),
            })?;
    let client_verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
            .build()
            .map_err(|e| TlsError::BadCa {
                path: ca.to_owned(),
                reason: e.to_string(),
            })?;

    // Check our own certificate the way peers will, so a bad file fails at start with its
    // name rather than as refused handshakes on every peer.
    let (leaf, intermediates) = chain.split_first().ok_or_else(|| TlsError::NotPem {
        path: cert.to_owned(),
        reason: "no CERTIFICATE section found".into(),
    })?;
    let name = ServerName::try_from(node_id.to_owned()).map_err(|_| TlsError::NodeId {
        id: node_id.to_owned(),
        reason: "is not a DNS name",
    })?;
    let now = UnixTime::now();
    let as_server = server_verifier
        .verify_server_cert(leaf, intermediates, &name, &[], now)
        .map(drop);
    let as_client = client_verifier
        .verify_client_cert(leaf, intermediates, now)
        .map(drop);
    for result in [as_server, as_client] {
        result.map_err(|e| cert_error(e, ca, cert, node_id))?;
    }

    mutual_configs(provider, server_verifier, client_verifier, chain, private)
        .map_err(|e| key_error(e, key, cert))
}

/// Builds Mutual mode's configs from checked parts.
fn mutual_configs(
    provider: Arc<CryptoProvider>,
    server_verifier: Arc<WebPkiServerVerifier>,
    client_verifier: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<NodeTls, rustls::Error> {
    let tls13 = &[&rustls::version::TLS13];
    let mut server = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(tls13)?
        .with_client_cert_verifier(client_verifier)
        .with_single_cert(chain.clone(), key.clone_key())?;
    server.alpn_protocols = vec![ALPN.to_vec()];
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(tls13)?
        .with_webpki_verifier(server_verifier)
        .with_client_auth_cert(chain, key)?;
    client.alpn_protocols = vec![ALPN.to_vec()];
    Ok(NodeTls {
        server: Arc::new(server),
        client: Arc::new(client),
        secure: true,
    })
}

fn cert_error(e: rustls::Error, ca: &Path, cert: &Path, node_id: &str) -> TlsError {
    match e {
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => TlsError::WrongName {
            cert: cert.to_owned(),
            node_id: node_id.to_owned(),
        },
        rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        ) => TlsError::NotSignedByCa {
            cert: cert.to_owned(),
            ca: ca.to_owned(),
            reason: e.to_string(),
        },
        other => TlsError::BadCert {
            cert: cert.to_owned(),
            reason: other.to_string(),
        },
    }
}

fn key_error(e: rustls::Error, key: &Path, cert: &Path) -> TlsError {
    match e {
        rustls::Error::InconsistentKeys(_) => TlsError::KeyMismatch {
            key: key.to_owned(),
            cert: cert.to_owned(),
        },
        rustls::Error::General(reason) => TlsError::NoKey {
            path: key.to_owned(),
            reason,
        },
        other => TlsError::Rustls(other),
    }
}

fn ephemeral(node_id: &str) -> Result<NodeTls, TlsError> {
    let provider = provider();
    let generated = rcgen::generate_simple_self_signed(vec![node_id.to_owned()])?;
    let chain = vec![generated.cert.der().clone()];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        generated.signing_key.serialize_der(),
    ));
    let tls13 = &[&rustls::version::TLS13];
    // No client certificates: the server would accept any, so asking proves nothing.
    let mut server = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(tls13)?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    server.alpn_protocols = vec![ALPN.to_vec()];
    let verifier = AcceptAnyServer {
        algorithms: provider.signature_verification_algorithms,
    };
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(tls13)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    client.alpn_protocols = vec![ALPN.to_vec()];
    Ok(NodeTls {
        server: Arc::new(server),
        client: Arc::new(client),
        secure: false,
    })
}

/// Ephemeral mode's server verifier: any certificate is accepted, but the handshake
/// signature must still be made by its key (so the session keys are not trivially forged
/// by a passive observer; an active man in the middle is not stopped).
#[derive(Debug)]
struct AcceptAnyServer {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A directory under the system temp dir, removed on drop.
    #[derive(Debug)]
    pub(crate) struct TempDir(PathBuf);

    impl TempDir {
        pub(crate) fn new(name: &str) -> Self {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir()
                .join(format!("gossamer-tls-{name}-{}-{n}", std::process::id()));
            let _ = fs::remove_dir_all(&path);
            TempDir(path)
        }

        pub(crate) fn path(&self) -> &Path {
            &self.0
        }

        /// Mutual mode with `node`'s files written by [`write_certs`] in this directory.
        pub(crate) fn mutual(&self, node: &str) -> Security {
            Security::Mutual {
                ca: self.0.join("ca.pem"),
                cert: self.0.join(format!("{node}.pem")),
                key: self.0.join(format!("{node}-key.pem")),
            }
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// Mutual-mode configs trusting `ca` but presenting `cert` / `key` without checking
    /// that they fit: a peer from another cluster, or one with a stolen certificate.
    pub(crate) fn unchecked_mutual(ca: &Path, cert: &Path, key: &Path) -> NodeTls {
        let provider = provider();
        let mut roots = RootCertStore::empty();
        for anchor in read_certs(ca).unwrap() {
            roots.add(anchor).unwrap();
        }
        let roots = Arc::new(roots);
        let server_verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
                .build()
                .unwrap();
        let client_verifier =
            WebPkiClientVerifier::builder_with_provider(roots, Arc::clone(&provider))
                .build()
                .unwrap();
        mutual_configs(
            provider,
            server_verifier,
            client_verifier,
            read_certs(cert).unwrap(),
            read_key(key).unwrap(),
        )
        .unwrap()
    }

    pub(crate) fn nodes(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn node_ids_must_be_lower_case_dns_names() {
        for ok in ["node-a", "gossamer-7xk2p", "n1.eu-west.example", "a", "0a"] {
            assert!(check_node_id(ok).is_ok(), "{ok}");
        }
        let long = "a".repeat(64);
        let too_long = ["abc"; 64].join(".");
        for bad in [
            "",
            "Node-A",
            "node_a",
            "-node",
            "node-",
            "a..b",
            "10.0.0.1",
            "42",
            "node a",
            "nöde",
            long.as_str(),
            too_long.as_str(),
        ] {
            assert!(
                matches!(check_node_id(bad), Err(TlsError::NodeId { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn write_certs_writes_a_ca_and_a_cert_per_node_with_private_keys() {
        use std::os::unix::fs::PermissionsExt;
        let dir = TempDir::new("write");
        let written = write_certs(dir.path(), &nodes(&["node-a", "node-b"]), false).unwrap();
        let names: Vec<_> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            names,
            [
                "ca.pem",
                "ca-key.pem",
                "node-a.pem",
                "node-a-key.pem",
                "node-b.pem",
                "node-b-key.pem"
            ]
        );
        for path in &written {
            let mode = fs::metadata(path).unwrap().permissions().mode() & 0o777;
            if path.to_str().unwrap().ends_with("-key.pem") {
                assert_eq!(mode, 0o600, "{}", path.display());
            }
        }
        for node in ["node-a", "node-b"] {
            let tls = dir.mutual(node).load(node).unwrap();
            assert!(tls.secure());
        }
    }

    #[test]
    fn write_certs_refuses_to_overwrite_unless_forced() {
        let dir = TempDir::new("overwrite");
        write_certs(dir.path(), &nodes(&["node-a"]), false).unwrap();
        let before = fs::read(dir.path().join("ca.pem")).unwrap();
        let err = write_certs(dir.path(), &nodes(&["node-a"]), false).unwrap_err();
        assert!(matches!(&err, TlsError::Exists { path } if path.ends_with("ca.pem")));
        assert!(err.to_string().contains("ca.pem"), "{err}");
        assert_eq!(fs::read(dir.path().join("ca.pem")).unwrap(), before);

        // A new node alone also refuses while the CA exists: its cert would need the old CA.
        let err = write_certs(dir.path(), &nodes(&["node-b"]), false).unwrap_err();
        assert!(matches!(err, TlsError::Exists { .. }));
        assert!(!dir.path().join("node-b.pem").exists());

        write_certs(dir.path(), &nodes(&["node-a"]), true).unwrap();
        assert_ne!(fs::read(dir.path().join("ca.pem")).unwrap(), before);
        dir.mutual("node-a").load("node-a").unwrap();
    }

    #[test]
    fn write_certs_refuses_bad_duplicate_and_colliding_node_ids() {
        let dir = TempDir::new("bad-ids");
        for list in [&["node-a", "Node_B"][..], &["node-a", "node-a"], &["ca"]] {
            let err = write_certs(dir.path(), &nodes(list), false).unwrap_err();
            assert!(matches!(err, TlsError::NodeId { .. }), "{list:?}: {err}");
        }
        assert!(!dir.path().exists(), "nothing is written for refused ids");
    }

    #[test]
    fn load_names_the_missing_file() {
        let dir = TempDir::new("missing");
        write_certs(dir.path(), &nodes(&["node-a"]), false).unwrap();
        let missing = dir.path().join("nope.pem");
        let security = Security::Mutual {
            ca: dir.path().join("ca.pem"),
            cert: missing.clone(),
            key: dir.path().join("node-a-key.pem"),
        };
        let err = security.load("node-a").unwrap_err();
        assert!(matches!(&err, TlsError::Read { path, .. } if *path == missing));
        assert!(err.to_string().contains("nope.pem"), "{err}");
    }

    #[test]
    fn load_names_a_file_that_is_not_pem() {
        let dir = TempDir::new("not-pem");
        write_certs(dir.path(), &nodes(&["node-a"]), false).unwrap();
        let junk = dir.path().join("junk.pem");
        fs::write(&junk, "this is not a certificate\n").unwrap();
        let Security::Mutual { ca, cert, key } = dir.mutual("node-a") else {
            unreachable!()
        };

        let as_ca = Security::Mutual {
            ca: junk.clone(),
            cert: cert.clone(),
            key: key.clone(),
        };
        let err = as_ca.load("node-a").unwrap_err();
        assert!(
            matches!(&err, TlsError::NotPem { path, .. } if *path == junk),
            "{err}"
        );

        let as_key = Security::Mutual {
            ca,
            cert: cert.clone(),
            key: cert.clone(),
        };
        let err = as_key.load("node-a").unwrap_err();
        assert!(
            matches!(&err, TlsError::NoKey { path, .. } if *path == cert),
            "{err}"
        );
        assert!(err.to_string().contains("node-a.pem"), "{err}");
    }

    #[test]
    fn load_refuses_a_cert_for_another_node_id() {
        let dir = TempDir::new("wrong-name");
        write_certs(dir.path(), &nodes(&["node-a", "node-b"]), false).unwrap();
        let err = dir.mutual("node-a").load("node-b").unwrap_err();
        assert!(
            matches!(&err, TlsError::WrongName { cert, node_id }
                if cert.ends_with("node-a.pem") && node_id == "node-b"),
            "{err}"
        );
    }

    #[test]
    fn load_refuses_a_cert_not_signed_by_the_ca() {
        let ours = TempDir::new("ca-ours");
        let theirs = TempDir::new("ca-theirs");
        write_certs(ours.path(), &nodes(&["node-a"]), false).unwrap();
        write_certs(theirs.path(), &nodes(&["node-a"]), false).unwrap();
        let security = Security::Mutual {
            ca: ours.path().join("ca.pem"),
            cert: theirs.path().join("node-a.pem"),
            key: theirs.path().join("node-a-key.pem"),
        };
        let err = security.load("node-a").unwrap_err();
        assert!(matches!(err, TlsError::NotSignedByCa { .. }), "{err}");
    }

    #[test]
    fn load_refuses_a_key_of_another_cert() {
        let dir = TempDir::new("mismatch");
        write_certs(dir.path(), &nodes(&["node-a", "node-b"]), false).unwrap();
        let security = Security::Mutual {
            ca: dir.path().join("ca.pem"),
            cert: dir.path().join("node-a.pem"),
            key: dir.path().join("node-b-key.pem"),
        };
        let err = security.load("node-a").unwrap_err();
        assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
    }

    #[test]
    fn ephemeral_mode_is_not_secure() {
        let tls = Security::Ephemeral.load("node-a").unwrap();
        assert!(!tls.secure());
        assert!(Security::Ephemeral.load("Not A Node").is_err());
    }
}
